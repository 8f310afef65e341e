"""The data and the model a config names, and their checks against each other: the dataset loaded (or
taken from the cache), the model built on its input shape, the partition cut and the held-out devices drawn,
each failure a :class:`~lcfed.errors.ConfigError` naming the field; and a host's lazy view of its devices'
samples (:class:`LazyDeviceData`), built on the device that trains them when first read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcfed import registry
from lcfed.config import ExperimentConfig
from lcfed.config.data import holdout_count
from lcfed.data import (
    DataError,
    Dataset,
    FileSource,
    Partition,
    PartitionError,
    Scaling,
    load_dataset,
    make_partition,
    split_validation,
)
from lcfed.data.generated import GENERATED, leaf_synthetic
from lcfed.data.sources import synthetic_dataset
from lcfed.data.testbeds import apply_testbed
from lcfed.errors import ConfigError, require
from lcfed.learning.local_update import DeviceData
from lcfed.learning.models import Network, build_network


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
    check_model(cfg, ds.name, ds.input_shape, ds.num_classes)
    part = partition(cfg, ds)
    sample_delta = cfg.privacy.sample_delta
    if cfg.privacy.sample_on and sample_delta is not None:
        held = set(held_out_devices(cfg))
        n = min((int(k) for d, k in enumerate(part.sizes()) if d not in held and k > 0), default=0)
        require(not n or sample_delta < 1 / n, "privacy.sample_delta", sample_delta,
                f"must be below 1/n = {1 / max(n, 1):.3g} for the smallest training device's n = {n} samples "
                "(null: n^-1.1)")
    return part


def check_model(cfg: ExperimentConfig, data_name: str, input_shape: tuple[int, ...], num_classes: int) -> None:
    """``model.name`` takes one sample of ``input_shape`` to ``num_classes`` logits, else a config error."""
    try:
        net, _ = network(cfg, input_shape, num_classes)
        with torch.no_grad():
            out = net.module(torch.zeros(1, *input_shape))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, num_classes):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"one sample gives {got}, not logits of shape (1, {num_classes})")
    except Exception as exc:  # a plugin model can fail in any way: one line, before any work
        raise ConfigError("model.name", cfg.model.name, f"does not fit {data_name} "
                          f"({'x'.join(map(str, input_shape))}, {num_classes} classes): "
                          f"{registry.one_line(exc)}") from None


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
        raise data_error(cfg, ds.name, exc) from None


def data_error(cfg: ExperimentConfig, data_name: str, exc: PartitionError) -> ConfigError:
    """A partition's refusal as the config error naming its ``data.`` field."""
    return ConfigError(f"data.{exc.param}", getattr(cfg.data, exc.param), f"does not fit {data_name}: {exc}")


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
