"""The experiment's setup, built once from a config (:func:`prepare`): the partition (driver side), the
server-visible facts, and what every engine's hosts build from them (:class:`Setup`'s methods: the strategy,
the model skeletons, the local work, the devices' data).

The partition is a pure function of the seed, so the driver computes it once from the labels and
each host loads only its own devices' samples; raw samples never pass through the driver or server.
The setup travels to the hosts whole (pickled to Ray's actors), so they build what they need from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcfed import numerics, registry
from lcfed.config import ExperimentConfig
from lcfed.config_rules import holdout_count
from lcfed.data import (
    DataError,
    Dataset,
    FileSource,
    Partition,
    PartitionError,
    Scaling,
    load_dataset,
    make_partition,
    partition_stats,
    split_validation,
)
from lcfed.data.generated import CLASSES, FEATURES, GENERATED, GeneratedSpec, generate_devices, leaf_synthetic
from lcfed.data.schemes import pieces
from lcfed.data.sources import synthetic_dataset
from lcfed.data.testbeds import apply_testbed
from lcfed.errors import ConfigError, require
from lcfed.local_update import DeviceData, LocalWork
from lcfed.methods import Strategy
from lcfed.methods.base import Federation
from lcfed.models import Network, build_network


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
        t = self.cfg.train
        return LocalWork(lr=t.lr, batch_size=t.batch_size, steps=t.local_steps, epochs=t.local_epochs)

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


def data_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg.data.data_dir).expanduser()


def file_source(cfg: ExperimentConfig) -> FileSource | None:
    """The file a ``data.dataset: file`` config reads, and how (None for the other datasets)."""
    d = cfg.data
    if d.dataset != "file":
        return None
    return FileSource(d.path, d.format, d.label_column, d.device_column, tuple(d.image_size), d.group_column)


def source_key(cfg: ExperimentConfig) -> tuple[Any, ...]:
    """What decides which files are read (or what is generated): configs with equal keys share one loaded
    dataset. The directory as written (``~`` unexpanded): the key must match on nodes whose home differs."""
    d = cfg.data
    generated = ((d.num_devices, d.synthetic_alpha, d.synthetic_beta, d.synthetic_clusters, d.min_samples)
                 if d.dataset == GENERATED else ())
    return d.dataset, d.data_dir, d.download, file_source(cfg), d.synthetic_samples, generated


def load_source(cfg: ExperimentConfig) -> Dataset:
    """The configured dataset's every sample, read from ``data.data_dir`` (or embedded, or generated:
    ``data.synthetic_samples``)."""
    d = cfg.data
    if d.dataset == "synthetic" and d.synthetic_samples:
        return synthetic_dataset(d.synthetic_samples)
    if d.dataset == GENERATED:
        return leaf_synthetic(d.num_devices, d.synthetic_alpha, d.synthetic_beta, d.synthetic_clusters,
                              d.synthetic_samples, d.min_samples)
    loader = None
    if d.dataset != "file":  # a built-in's or a plugin's loader, by its name
        try:
            loader = registry.dataset(d.dataset)
        except registry.PluginError as exc:
            raise DataError(str(exc)) from None
    return load_dataset(d.dataset, data_dir(cfg), d.download, file_source(cfg), loader)


def network(cfg: ExperimentConfig, input_shape: tuple[int, ...], num_classes: int) -> tuple[Network, torch.Tensor]:
    """``model.name``'s network (a built-in's or a plugin's builder) and its seeded initial weights."""
    try:
        builder = registry.model(cfg.model.name)
    except registry.PluginError as exc:
        raise ValueError(str(exc)) from None
    return build_network(builder, input_shape, num_classes, cfg.seed, name=cfg.model.name)


def load(cfg: ExperimentConfig, source: Dataset | None = None) -> Dataset:
    """The configured dataset (``source`` if already loaded), reduced to a seeded random
    ``data.subset`` of samples if set, then as a ``data.testbed``'s devices see it."""
    ds = source if source is not None else load_source(cfg)
    if 0 < cfg.data.subset < len(ds.y):
        keep = np.sort(np.random.default_rng([cfg.seed, 0x5B5]).choice(len(ds.y), cfg.data.subset, replace=False))
        ds = ds.take(keep)
    d = cfg.data
    try:
        return apply_testbed(ds, d.testbed, d.testbed_groups, d.num_devices, cfg.seed)
    except PartitionError as exc:
        raise ConfigError(f"data.{exc.param}", getattr(d, exc.param), f"does not fit {ds.name}: {exc}") from None


def check_against_data(cfg: ExperimentConfig, ds: Dataset) -> Partition:
    """The limits only the dataset knows (its size and class count, the devices' sizes), as config
    errors; returns the partition, which had to be computed for the last of these."""
    d = cfg.data
    require(
        d.num_devices * d.min_samples <= len(ds.y),
        "data.num_devices",
        d.num_devices,
        f"num_devices x min_samples ({d.num_devices} x {d.min_samples}) must be <= the {len(ds.y)} samples of {ds.name}",
    )
    if d.partition == "pathological":
        require(
            d.classes_per_device <= ds.num_classes,
            "data.classes_per_device",
            d.classes_per_device,
            f"must be <= the {ds.num_classes} classes of {ds.name}",
        )
    try:
        net, _ = network(cfg, ds.input_shape, ds.num_classes)
        with torch.no_grad():
            out = net.module(torch.zeros(1, *ds.input_shape))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, ds.num_classes):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"one sample gives {got}, not logits of shape (1, {ds.num_classes})")
    except Exception as exc:  # a plugin model can fail in any way: one line, before any work
        raise ConfigError("model.name", cfg.model.name, f"does not fit {ds.name} "
                          f"({'x'.join(map(str, ds.input_shape))}, {ds.num_classes} classes): "
                          f"{registry.one_line(exc)}") from None
    return partition(cfg, ds)


def partition(cfg: ExperimentConfig, ds: Dataset) -> Partition:
    """The devices' train/test indices into ``ds`` (a pure function of the config and the labels),
    with ``data.val_fraction`` of each device's training share held out for validation; settings
    these labels cannot meet are a :class:`ConfigError` naming the ``data.`` field."""
    d = cfg.data
    try:
        part = make_partition(
            ds.y,
            scheme=d.partition,
            num_devices=d.num_devices,
            alpha=d.alpha,
            classes_per_device=d.classes_per_device,
            min_samples=d.min_samples,
            test_fraction=d.test_fraction,
            seed=cfg.seed,
            quantity=tuple(d.samples_per_device) if d.samples_per_device else None,
            primary=tuple(d.primary),
            secondary=tuple(d.secondary),
            dirichlet_convention=d.dirichlet_convention,
            min_test_samples=d.min_test_samples,
            device_ids=ds.device_ids,
            user_selection=d.user_selection,
            testbed=d.testbed,
            testbed_groups=d.testbed_groups,
            sample_groups=ds.groups,
            group_kind=ds.name,
        )
        # carved after the partition, from its own stream: devices and test sets stay as without it
        return split_validation(part, d.val_fraction, cfg.seed) if d.val_fraction > 0 else part
    except PartitionError as exc:
        raise ConfigError(f"data.{exc.param}", getattr(d, exc.param), f"does not fit {ds.name}: {exc}") from None


#: the held-out devices' stream (with the seed): no other draw uses it
_HOLDOUT_STREAM = 0x401D


def held_out_devices(cfg: ExperimentConfig) -> tuple[int, ...]:
    """The devices ``data.holdout_fraction`` keeps out of training (sorted): ``round(fraction x m)`` of
    them, a pure function of the seed and ``m`` drawn from a stream of its own, so the partition and
    every other draw stay as without it."""
    m = cfg.data.num_devices
    n = holdout_count(m, cfg.data.holdout_fraction)
    if n == 0:
        return ()
    rng = np.random.default_rng([cfg.seed, _HOLDOUT_STREAM])
    return tuple(sorted(int(d) for d in rng.choice(m, size=n, replace=False)))


#: fits the input scaling from the partition and the held-out devices, where the samples are (hosts')
ScalingFit = Callable[[Partition, Sequence[int]], Scaling]


def prepare(cfg: ExperimentConfig, dataset: Dataset | None = None, fit_scaling: ScalingFit | None = None) -> Setup:
    """The experiment's :class:`Setup`: the dataset partitioned and the federation described (sizes,
    groups, model layout, init, partition statistics). ``fit_scaling`` fits ``data.normalize``'s scaling
    where ``dataset`` holds labels only (:func:`labels_dataset`: the samples are on the hosts)."""
    ds = dataset if dataset is not None else load(cfg)
    part = check_against_data(cfg, ds)
    net, init = network(cfg, ds.input_shape, ds.num_classes)
    fed = Federation(
        num_devices=part.num_devices,
        train_sizes=part.sizes(),
        groups=part.groups,
        group_kind=part.group_kind,
        spec=net.spec,
        init=init,
        num_classes=ds.num_classes,
        seed=cfg.seed,
        flops_per_sample=forward_flops(net, init, ds.input_shape),
        partition_stats=partition_stats(part, ds.y),
        label_dist=label_distributions(part, ds.y, ds.num_classes),
        input_shape=ds.input_shape,
        held_out=held_out_devices(cfg),
    )
    if fit_scaling is not None and cfg.data.normalize != "unit":
        scaling = fit_scaling(part, fed.held_out)
    else:
        scaling = input_scaling(cfg, ds, part, fed.held_out)
    fed = replace(fed, scaling=scaling)
    if cfg.devices.simulate:  # here: traces are read on the driver, before any work
        from lcfed.devices.schedule import make_fleet

        fed = replace(fed, fleet=make_fleet(cfg, fed))
    return Setup(cfg, part, fed, ds.input_shape, scaling)


def label_distributions(part: Partition, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(devices, classes): the share of each class in each device's training samples."""
    counts = np.stack([np.bincount(labels[idx], minlength=num_classes) for idx in part.train]).astype(np.float64)
    return counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)


def input_scaling(cfg: ExperimentConfig, ds: Dataset, part: Partition, held_out: Sequence[int] = ()) -> Scaling:
    """``data.normalize``: standardize with the per-channel mean/std of the devices' training
    samples (never their validation or test samples, nor any sample of a held-out device: newcomers
    find the scaling as it is), or plain [0, 1]."""
    if cfg.data.normalize == "unit":
        return Scaling.unit(ds.input_shape[0])
    return Scaling.fit(ds.x, scaling_rows(part, held_out))


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


def scaling_rows(part: Partition, held_out: Sequence[int]) -> np.ndarray:
    """The samples ``data.normalize`` fits on: the devices' training samples, held-out devices' excepted."""
    skip = set(held_out)
    return np.concatenate([np.zeros(0, np.int64), *(t for d, t in enumerate(part.train) if d not in skip)])


def node_generated(cfg: ExperimentConfig) -> GeneratedSpec | None:
    """What a host generates its devices' samples from, when the config's data can be built on every node
    (``leaf_synthetic``, whole: no ``data.subset`` of it); else None."""
    d = cfg.data
    if d.dataset != GENERATED or d.testbed != "none":
        return None
    spec = GeneratedSpec(d.num_devices, d.synthetic_alpha, d.synthetic_beta, d.synthetic_clusters, d.synthetic_samples,
                         d.min_samples)
    return spec if d.subset <= 0 or d.subset >= int(spec.starts()[-1]) else None


def labels_dataset(spec: GeneratedSpec, labels: np.ndarray) -> Dataset:
    """The generated federation as the driver holds it: its labels, device ids and groups, and no sample (``x``
    is a read-only view of one zero row)."""
    starts = spec.starts()
    owner = np.repeat(np.arange(spec.num_devices, dtype=np.int64), np.diff(starts))
    groups = spec.device_groups()
    x = np.broadcast_to(np.zeros((1, FEATURES), dtype=np.float32), (len(labels), FEATURES))
    return Dataset(GENERATED, x, np.asarray(labels, dtype=np.int64), CLASSES, owner,
                   None if groups is None else np.ascontiguousarray(groups[owner]).astype(np.int64))


@dataclass(frozen=True)
class NodeShard:
    """A host's devices ``first``..``stop - 1`` to generate on its own node (``spec``), with their part of the
    partition once the driver made it (:func:`node_shard`): ``sizes`` (splits, devices) and the indices
    ``flat`` from the first of their rows, train of each device, then test, then validation; flat arrays,
    which cross Ray at once (a tuple of 10^6 arrays takes seconds to pickle)."""

    spec: GeneratedSpec
    first: int
    stop: int
    sizes: np.ndarray | None = None
    flat: np.ndarray | None = None
    groups: np.ndarray | None = None
    group_kind: str = ""

    def generate(self) -> Dataset:
        return generate_devices(self.spec, self.first, self.stop)

    def partition(self) -> Partition:
        """The partition as the host uses it: its devices' indices, the other devices' empty."""
        assert self.sizes is not None and self.flat is not None and self.groups is not None
        empty = np.zeros(0, dtype=np.int64)
        n, rest = self.stop - self.first, self.spec.num_devices - self.stop
        arrays = pieces(self.flat, self.sizes.ravel())
        split = [tuple([empty] * self.first + arrays[k * n:(k + 1) * n] + [empty] * rest) for k in range(len(self.sizes))]
        return Partition(split[0], split[1], self.groups, split[2] if len(split) > 2 else (), self.group_kind)

    def build(self, ds: Dataset | None = None) -> tuple[Dataset, Partition]:
        """The host's (samples, partition) as :func:`shard` cuts them from the whole dataset, bit for bit."""
        ds = ds if ds is not None else self.generate()
        assert self.sizes is not None
        if int(self.sizes.sum()) == len(ds.y):  # every row is some device's (natural): shard's cut is the identity
            return Dataset(ds.name, ds.x, ds.y, ds.num_classes), self.partition()
        return shard(ds, self.partition(), range(self.first, self.stop))


def node_shard(spec: GeneratedSpec, first: int, stop: int, part: Partition) -> NodeShard:
    """The :class:`NodeShard` of devices ``first``..``stop - 1`` with their part of ``part``."""
    splits = [part.train, part.test, *([part.val] if part.val else [])]
    devices = range(first, stop)
    sizes = np.array([[len(s[d]) for d in devices] for s in splits], dtype=np.int64).reshape(len(splits), len(devices))
    offset = int(spec.starts()[first])
    flat = np.concatenate([np.zeros(0, np.int64), *(s[d] for s in splits for d in devices)]) - offset
    return NodeShard(spec, first, stop, sizes, flat, part.groups, part.group_kind)


def shard(ds: Dataset, part: Partition, devices: Iterable[int]) -> tuple[Dataset, Partition]:
    """The samples of ``devices`` only, with the partition's indices remapped into them.

    What a host needs, cut out by the process that loaded the dataset and shipped to the host (on
    Ray through the object store), so hosts read no files: a worker node needs the code only.
    Other devices keep empty index arrays.
    """
    devs = sorted(set(devices))
    val = part.val or tuple(np.zeros(0, np.int64) for _ in part.train)
    rows = np.unique(np.concatenate([a[d] for a in (part.train, part.test, val) for d in devs] + [np.zeros(0, np.int64)]))
    empty = np.zeros(0, dtype=np.int64)
    hosted = set(devs)

    def remap(idx: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        return tuple(np.searchsorted(rows, a).astype(np.int64) if d in hosted else empty for d, a in enumerate(idx))

    sub = Dataset(ds.name, np.ascontiguousarray(ds.x[rows]), np.ascontiguousarray(ds.y[rows]), ds.num_classes)
    return sub, Partition(remap(part.train), remap(part.test), part.groups, remap(part.val) if part.val else (),
                          part.group_kind)


class LazyDeviceData(Mapping[int, DeviceData]):
    """Device id -> :class:`DeviceData`, each built from the dataset when read."""

    def __init__(self, ds: Dataset, part: Partition, devices: Iterable[int], where: torch.device, scaling: Scaling) -> None:
        self.ds, self.part, self.where, self.scaling = ds, part, where, scaling
        self.devices = tuple(devices)
        self._hosted = frozenset(self.devices)
        self._y = torch.from_numpy(np.asarray(ds.y, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.devices)

    def __contains__(self, dev: object) -> bool:
        return dev in self._hosted

    def __getitem__(self, dev: int) -> DeviceData:
        if dev not in self._hosted:
            raise KeyError(dev)
        part, ds, scaling, where = self.part, self.ds, self.scaling, self.where
        tr, te = part.train[dev], part.test[dev]
        val = part.val[dev] if part.val else None
        return DeviceData(
            scaling.apply(ds.x[tr]).to(where),
            self._y[tr].to(where),
            scaling.apply(ds.x[te]).to(where),
            self._y[te].to(where),
            None if val is None else scaling.apply(ds.x[val]).to(where),
            None if val is None else self._y[val].to(where),
        )
