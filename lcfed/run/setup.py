"""The experiment's setup, built once from a config (:func:`prepare`): the partition (driver side), the
server-visible facts, and what every engine's hosts build from them (:class:`Setup`'s methods: the strategy,
the model skeletons, the local work, the devices' data).

The partition is a pure function of the seed, so the driver computes it once from the labels and
each host loads only its own devices' samples; raw samples never pass through the driver or server.
The setup travels to the hosts whole (pickled to Ray's actors), so they build what they need from it.
Loading the data and the model a config names is :mod:`lcfed.run.sources`; a setup built by the hosts
themselves (generated data, rows read on the nodes) is :mod:`lcfed.run.shards`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from lcfed import numerics, registry
from lcfed.config import ExperimentConfig
from lcfed.data import (
    Dataset,
    Partition,
    PartitionError,
    Scaling,
    partition_stats,
)
from lcfed.data.generated import GENERATED
from lcfed.data.partition import validation_sizes
from lcfed.learning.local_update import DeviceData, LocalWork, SampleDP
from lcfed.learning.models import Network
from lcfed.methods import Strategy
from lcfed.methods.round import Federation
from lcfed.run.sources import LazyDeviceData, check_against_data, data_error, held_out_devices, load, network


@dataclass(frozen=True)
class Setup:
    """One config's experiment, built once by :func:`prepare` and handed to an engine whole: the config, the
    partition and the server-visible facts (:class:`~lcfed.methods.base.Federation`), from which a host
    builds its strategy, model skeletons, local work and devices' data. Frozen and picklable: the Ray
    engine ships it to every actor."""

    cfg: ExperimentConfig
    partition: Partition
    federation: Federation
    input_shape: tuple[int, ...]
    scaling: Scaling  # pixels -> inputs, fitted on the driver so every host scales alike

    def strategy(self) -> Strategy:
        """A fresh instance of ``method.name``'s strategy (a built-in's or a plugin's) on this federation."""
        return registry.method(self.cfg.method.name).strategy(self.cfg, self.federation)

    def network(self, where: torch.device) -> Network:
        """A model skeleton of ``model.name`` on ``where`` (built under the seed, as every one is)."""
        net, _ = network(self.cfg, self.input_shape, self.federation.num_classes)
        net.module.to(where)
        return net

    def local_work(self) -> LocalWork:
        """A device's local work each round (``train.lr``, ``batch_size``, ``local_steps``, ``local_epochs``)."""
        t, p = self.cfg.train, self.cfg.privacy
        dp = SampleDP(p.sample_clip, p.sample_noise) if p.sample_noise is not None else None
        return LocalWork(lr=t.lr, batch_size=t.batch_size, steps=t.local_steps, epochs=t.local_epochs, sample_dp=dp)

    def torch_device(self) -> torch.device:
        """Where this process trains (``engine.device``): ``auto`` picks CUDA when torch sees a GPU (e.g. a
        fractional Ray GPU), else the CPU."""
        kind = self.cfg.engine.device
        if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
            numerics.deterministic_gpu()
            return torch.device("cuda")
        return torch.device("cpu")

    def device_data(self, ds: Dataset, devices: Iterable[int], where: torch.device) -> Mapping[int, DeviceData]:
        """The local train/test (and validation, if split) tensors of ``devices`` (their samples in ``ds``,
        indexed by this setup's partition), scaled and on ``where``: on a GPU placed there once; on the CPU
        made when a device is read (from the dataset's uint8 rows, the same tensors every time), so a host
        holds its devices' samples once, compactly."""
        lazy = LazyDeviceData(ds, self.partition, devices, where, self.scaling)
        return lazy if where.type == "cpu" else {dev: lazy[dev] for dev in lazy}


def prepare(cfg: ExperimentConfig, dataset: Dataset | None = None) -> Setup:
    """The experiment's :class:`Setup`: the dataset partitioned and the federation described (sizes,
    groups, model layout, init, partition statistics)."""
    ds = dataset if dataset is not None else load(cfg)
    part, fed = partitioned(cfg, ds)
    return finish_setup(cfg, fed, part, input_scaling(cfg, ds, part, fed.held_out))


def partitioned(cfg: ExperimentConfig, ds: Dataset) -> tuple[Partition, Federation]:
    """The dataset partitioned and the federation described, all but its input scaling (which reads the
    samples; the partition reads only the labels, device ids and groups)."""
    part = check_against_data(cfg, ds)
    fed = federation(cfg, ds.input_shape, ds.num_classes, part.sizes(), part.groups, part.group_kind,
                     partition_stats(part, ds.y), label_distributions(part, ds.y, ds.num_classes))
    return part, fed


def federation(cfg: ExperimentConfig, input_shape: tuple[int, ...], num_classes: int, train_sizes: np.ndarray,
               groups: np.ndarray, group_kind: str, stats: dict[str, float], label_dist: np.ndarray) -> Federation:
    """The server-visible facts of a partitioned federation (without its input scaling and fleet)."""
    net, init = network(cfg, input_shape, num_classes)
    return Federation(
        num_devices=len(train_sizes),
        train_sizes=train_sizes,
        groups=groups,
        group_kind=group_kind,
        spec=net.spec,
        init=init,
        num_classes=num_classes,
        seed=cfg.seed,
        flops_per_sample=forward_flops(net, init, input_shape),
        partition_stats=stats,
        label_dist=label_dist,
        input_shape=input_shape,
        held_out=held_out_devices(cfg),
    )


def finish_setup(cfg: ExperimentConfig, fed: Federation, part: Partition, scaling: Scaling) -> Setup:
    """The :class:`Setup` of ``fed`` with its input scaling and, with ``devices.simulate``, its fleet."""
    fed = replace(fed, scaling=scaling)
    if cfg.devices.simulate:  # here: traces are read on the driver, before any work
        from lcfed.devices.schedule import make_fleet

        fed = replace(fed, fleet=make_fleet(cfg, fed))
    return Setup(cfg, part, fed, fed.input_shape, scaling)


def label_distributions(part: Partition, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(devices, classes): the share of each class in each device's training samples."""
    return label_shares(np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in part.train]))


def label_shares(counts: np.ndarray) -> np.ndarray:
    """Each row of class counts as shares (an empty row: zeros)."""
    shares = counts.astype(np.float64)
    shares /= np.maximum(shares.sum(axis=1, keepdims=True), 1.0)  # in place: m x classes floats once, not twice
    return shares


def input_scaling(cfg: ExperimentConfig, ds: Dataset, part: Partition, held_out: Sequence[int] = ()) -> Scaling:
    """``data.normalize``: standardize with the per-channel mean/std of the devices' training
    samples (never their validation or test samples, nor any sample of a held-out device: newcomers
    find the scaling as it is), or plain [0, 1]."""
    if cfg.data.normalize == "unit":
        return Scaling.unit(ds.input_shape[0])
    return Scaling.fit(ds.x, scaling_rows(part.train, held_out))


def forward_flops(net: Network, weights: torch.Tensor, input_shape: tuple[int, ...]) -> float:
    """FLOPs of one sample's forward pass through the convolutions and linear layers (a
    multiply-add = 2 FLOPs; biases, activations and pooling not counted, as torch's FlopCounterMode
    does — which costs seconds to import, hence forward hooks)."""
    total = 0.0

    def count(mod: torch.nn.Module, inputs: Any, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            total += 2.0 * out.numel() * k
        elif isinstance(mod, torch.nn.Linear):
            total += 2.0 * out.numel() * mod.in_features

    hooks = [m.register_forward_hook(count) for m in net.module.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    try:
        with torch.no_grad():
            net(weights, torch.zeros(1, *input_shape))
    finally:
        for h in hooks:
            h.remove()
    return total


def scaling_rows(train: Sequence[np.ndarray], held_out: Iterable[int]) -> np.ndarray:
    """The samples ``data.normalize`` fits on: the devices' training samples (``train``, one array per device),
    held-out devices' (their positions in ``train``) excepted."""
    skip = set(held_out)
    return np.concatenate([np.zeros(0, np.int64), *(t for d, t in enumerate(train) if d not in skip)])


def check_validation(cfg: ExperimentConfig, train_sizes: np.ndarray) -> None:
    """``data.val_fraction`` leaves every device a training and a validation sample (hosts' train sizes)."""
    if cfg.data.val_fraction > 0:
        try:
            validation_sizes(train_sizes, cfg.data.val_fraction)
        except PartitionError as exc:
            raise data_error(cfg, GENERATED, exc) from None
