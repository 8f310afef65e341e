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
from typing import Any, Protocol

import numpy as np
import torch

from lcfed import numerics, registry
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
    partition_stats,
    split_validation,
)
from lcfed.data.cache import read_rows
from lcfed.data.generated import CLASSES, FEATURES, GENERATED, GeneratedSpec, generate_devices, leaf_synthetic
from lcfed.data.partition import hold_out_validation, split_seed, validation_sizes
from lcfed.data.partition_stats import stats_of
from lcfed.data.schemes import pieces
from lcfed.data.sources import SCALING_CHUNK, feature_spreads, feature_sums, synthetic_dataset
from lcfed.data.split import SplitPart, check_test_floor, split_part
from lcfed.data.testbeds import apply_testbed
from lcfed.errors import ConfigError, require
from lcfed.learning.local_update import DeviceData, LocalWork
from lcfed.learning.models import Network, build_network
from lcfed.methods import Strategy
from lcfed.methods.round import Federation


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
    check_model(cfg, ds.name, ds.input_shape, ds.num_classes)
    return partition(cfg, ds)


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


def node_generated(cfg: ExperimentConfig) -> GeneratedSpec | None:
    """What a host generates its devices' samples from, when the config's data can be built on every node
    (``leaf_synthetic``, whole: no ``data.subset`` of it); else None."""
    d = cfg.data
    if d.dataset != GENERATED or d.testbed != "none":
        return None
    spec = GeneratedSpec(d.num_devices, d.synthetic_alpha, d.synthetic_beta, d.synthetic_clusters, d.synthetic_samples,
                         d.min_samples)
    return spec if d.subset <= 0 or d.subset >= int(spec.starts()[-1]) else None


@dataclass(frozen=True)
class NodeSplit:
    """How a host partitions its generated devices as the driver would the whole federation (``natural``: each
    device holds its own samples, in order): the train/test split's seed and settings, the split's draws before
    this host's train and test samples (:meth:`lcfed.data.split.SplitPart.order`), the validation split's."""

    seed: int
    test_fraction: float
    min_test: int
    val_fraction: float
    val_seed: int
    train_draws: int = 0
    test_draws: int = 0

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> NodeSplit:
        d = cfg.data
        return cls(split_seed(cfg.seed), d.test_fraction, d.min_test_samples, d.val_fraction, cfg.seed)


@dataclass(frozen=True)
class NodeShard:
    """A host's devices ``first``..``stop - 1``, whose samples it generates on its own node (``spec``) and
    partitions itself (``split``), as the driver would have from the whole dataset, bit for bit."""

    spec: GeneratedSpec
    first: int
    stop: int
    split: NodeSplit

    def generate(self) -> Dataset:
        return generate_devices(self.spec, self.first, self.stop)

    def devices(self) -> list[np.ndarray]:
        """Each device's rows among this host's (the natural partition of the generated samples)."""
        starts = self.spec.starts()[self.first:self.stop + 1]
        return pieces(np.arange(int(starts[-1] - starts[0]), dtype=np.int64), np.diff(starts))

    def test_split(self, ds: Dataset) -> SplitPart:
        """The train/test split's per-device part, with the draws of every sample before this host's."""
        sp = self.split
        return split_part(self.devices(), ds.y, sp.test_fraction, sp.seed, sp.min_test,
                          int(self.spec.starts()[self.first]))

    def lists(self, ds: Dataset, part: SplitPart | None = None) -> tuple[list[np.ndarray], ...]:
        """The devices' train, test and validation rows (validation empty without the split)."""
        sp, n = self.split, self.stop - self.first
        train, test = (part or self.test_split(ds)).order(n, sp.seed, sp.train_draws, sp.test_draws)
        if sp.val_fraction <= 0:
            return train, test, []
        n_val = validation_sizes(np.fromiter((len(t) for t in train), dtype=np.int64, count=n), sp.val_fraction)
        train, val = hold_out_validation(train, n_val, sp.val_seed, range(self.first, self.stop))
        return train, test, val

    def build(self, ds: Dataset | None = None, lists: tuple[list[np.ndarray], ...] | None = None
              ) -> tuple[Dataset, Partition]:
        """The host's (samples, partition): every device of the federation, the others' indices empty."""
        ds = ds if ds is not None else self.generate()
        train, test, val = lists if lists is not None else self.lists(ds)
        empty = np.zeros(0, dtype=np.int64)
        before, after = [empty] * self.first, [empty] * (self.spec.num_devices - self.stop)

        def whole(local: list[np.ndarray]) -> tuple[np.ndarray, ...]:
            return tuple(before + local + after)

        groups = np.zeros(self.spec.num_devices, dtype=np.int64)  # hosts do not read the groups: the server's facts
        part = Partition(whole(train), whole(test), groups, whole(val) if val else ())
        return Dataset(ds.name, ds.x, ds.y, ds.num_classes), part


def check_generated(cfg: ExperimentConfig, spec: GeneratedSpec) -> None:
    """What :func:`prepare` would refuse in generated data, checked before any host starts: the model fits, and
    every device can keep ``data.min_test_samples`` test samples and one to train on."""
    check_model(cfg, GENERATED, (FEATURES,), CLASSES)
    try:
        check_test_floor(np.diff(spec.starts()), cfg.data.min_test_samples)
    except PartitionError as exc:
        raise data_error(cfg, GENERATED, exc) from None


def check_validation(cfg: ExperimentConfig, train_sizes: np.ndarray) -> None:
    """``data.val_fraction`` leaves every device a training and a validation sample (hosts' train sizes)."""
    if cfg.data.val_fraction > 0:
        try:
            validation_sizes(train_sizes, cfg.data.val_fraction)
        except PartitionError as exc:
            raise data_error(cfg, GENERATED, exc) from None


def node_facts(shard: NodeShard, ds: Dataset, lists: tuple[list[np.ndarray], ...]) -> dict[str, Any]:
    """What the driver needs of a host's devices for the federation's facts: their train / test / validation
    sizes, the classes each holds, its dominant label and its training samples' label counts."""
    train, test, val = lists
    n, classes = shard.stop - shard.first, ds.num_classes
    starts = shard.spec.starts()[shard.first:shard.stop + 1] - shard.spec.starts()[shard.first]
    owner = np.repeat(np.arange(n), np.diff(starts))
    held = np.bincount(owner * classes + ds.y, minlength=n * classes).reshape(n, classes)
    sizes = [np.fromiter((len(a) for a in split), dtype=np.int64, count=len(split)) for split in (train, test, val)]
    dev = np.repeat(np.arange(n), sizes[0])
    y_train = ds.y[np.concatenate([np.zeros(0, np.int64), *train])]
    counts = np.bincount(dev * classes + y_train, minlength=n * classes).reshape(n, classes)
    # int32: half the bytes to the driver, whose reads of Ray's shared memory count in its RSS (int64 there)
    return {"train": sizes[0].astype(np.int32), "test": sizes[1].astype(np.int32), "val": sizes[2].astype(np.int32),
            "classes": (held > 0).sum(axis=1).astype(np.int32), "dominant": held.argmax(axis=1).astype(np.int32),
            "label_counts": counts.astype(np.int32)}


def generated_setup(cfg: ExperimentConfig, spec: GeneratedSpec, facts: Sequence[dict[str, Any]], scaling: Scaling
                    ) -> Setup:
    """The :class:`Setup` of generated data partitioned by its hosts (:func:`node_facts`, in device order): the
    facts :func:`prepare` would find for the whole dataset. Its partition is empty: the hosts hold theirs."""
    def cat(key: str) -> np.ndarray:
        return np.concatenate([f[key] for f in facts]).astype(np.int64)

    train, test, val = cat("train"), cat("test"), cat("val")
    groups = spec.device_groups()
    kind = GENERATED if groups is not None else ""  # known clusters, else each device's dominant label
    groups = np.asarray(groups if groups is not None else cat("dominant"), dtype=np.int64)
    stats = stats_of(train, test, val, cat("classes"), groups if kind else None)
    shares = label_shares(np.concatenate([f["label_counts"] for f in facts]))  # int32 to float64 at once
    fed = federation(cfg, (FEATURES,), CLASSES, train, groups, kind, stats, shares)
    return finish_setup(cfg, fed, Partition((), (), np.zeros(0, dtype=np.int64)), scaling)


class GeneratingHosts(Protocol):
    """Hosts that generated their devices' samples (each a :class:`NodeShard` of consecutive devices, in device
    order) and answer for all of them at once: the Ray engine's device actors, or a test's in-process hosts."""

    def test_split(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each host's per-device train and test counts (:meth:`NodeShard.test_split`)."""
        ...

    def partition(self, shards: Sequence[NodeShard], held_out: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """Each host partitions its devices as ``shards`` say (the draws before them now known): its
        :func:`node_facts`, with ``scaling_rows``, how many of its rows the input scaling fits on."""
        ...

    def feature_pieces(self, before: Sequence[int], total: int, mean: np.ndarray | None
                       ) -> list[tuple[dict[int, np.ndarray], dict[int, np.ndarray]]]:
        """Each host's :func:`feature_pieces` (``before``: the scaling's rows of the hosts before each)."""
        ...


def setup_on_hosts(cfg: ExperimentConfig, spec: GeneratedSpec, shards: Sequence[NodeShard], hosts: GeneratingHosts
                   ) -> tuple[Setup, list[NodeShard]]:
    """The :class:`Setup` :func:`prepare` would make of the whole generated dataset, from hosts holding it in
    parts (``shards``, with ``split`` but no draws yet), and each host's shard with its draws: the split takes one
    draw per sample, then per train sample, then per test sample, each in device order, so a host's draws follow
    from the counts of the hosts before it. The driver holds no sample and no partition."""
    counts = hosts.test_split()
    n_train = np.concatenate([tr for tr, _ in counts])
    check_validation(cfg, n_train)
    total, trains = int(spec.starts()[-1]), [int(tr.sum()) for tr, _ in counts]
    tests = [int(te.sum()) for _, te in counts]
    before_train, before_test = np.cumsum([0, *trains]), np.cumsum([0, *tests])
    done = [replace(sh, split=replace(sh.split, train_draws=total + int(before_train[i]),
                                      test_draws=total + sum(trains) + int(before_test[i])))
            for i, sh in enumerate(shards)]
    held = held_out_devices(cfg)
    facts = hosts.partition(done, [[d for d in held if sh.first <= d < sh.stop] for sh in done])
    if cfg.data.normalize == "unit":
        scaling = Scaling.unit(FEATURES)
    else:
        rows = [int(f["scaling_rows"]) for f in facts]
        before = [int(b) for b in np.cumsum([0, *rows])[:-1]]
        first = hosts.feature_pieces(before, sum(rows), None)
        scaling = scaling_of_pieces(first, lambda mean: [w for w, _ in hosts.feature_pieces(before, sum(rows), mean)],
                                    sum(rows))
    return generated_setup(cfg, spec, facts, scaling), done


def scaling_of_pieces(first: Sequence[tuple[dict[int, np.ndarray], dict[int, np.ndarray]]],
                      second: Callable[[np.ndarray], Sequence[dict[int, np.ndarray]]], total: int,
                      chunk: int = SCALING_CHUNK) -> Scaling:
    """:meth:`Scaling.fit` from the hosts' :func:`feature_pieces` (``first``: their first pass, in row order;
    ``second``: their second, given the mean): the chunks they share are summed here from their rows, and the
    sums added in the chunks' order, so the bits are the whole dataset's."""
    if total == 0:
        return Scaling.unit(FEATURES)
    sums: dict[int, np.ndarray] = {}
    shared: dict[int, list[np.ndarray]] = {}
    for whole, part in first:
        sums.update(whole)
        for k, rows in part.items():
            shared.setdefault(k, []).append(rows)
    rows_of = {k: np.concatenate(v) for k, v in shared.items()}
    chunks = range(-(-total // chunk))

    def own(k: int) -> list[np.ndarray]:
        return [np.arange(len(rows_of[k]))]

    mean = Scaling.mean_of([sums[k] if k in sums else feature_sums(rows_of[k], own(k))[0] for k in chunks], total)
    spreads: dict[int, np.ndarray] = {}
    for whole in second(mean):
        spreads.update(whole)
    return Scaling.from_spreads(
        mean, [spreads[k] if k in spreads else feature_spreads(rows_of[k], own(k), mean)[0] for k in chunks], total)


def shard_scaling_rows(shard: NodeShard, train: list[np.ndarray], held_out: Iterable[int]) -> np.ndarray:
    """The host's rows the input scaling fits on (its devices' training rows, held-out devices' excepted), sorted."""
    return np.sort(scaling_rows(train, (d - shard.first for d in held_out)))


def feature_pieces(x: np.ndarray, rows: np.ndarray, before: int, total: int, mean: np.ndarray | None = None,
                   chunk: int = SCALING_CHUNK) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """A host's part of :meth:`Scaling.fit`'s chunks over every host's ``total`` rows, of which ``before`` are
    the hosts' before it: the chunks wholly here summed (or, given ``mean``, their squared deviations), and
    the rows of the chunks it shares with other hosts (for the driver to sum, the first pass only)."""
    whole: dict[int, np.ndarray] = {}
    shared: dict[int, np.ndarray] = {}
    for k in range(before // chunk, -(-(before + len(rows)) // chunk)):
        lo, hi = k * chunk, min(k * chunk + chunk, total)
        mine = rows[max(lo - before, 0):hi - before]
        if lo >= before and hi <= before + len(rows):
            whole[k] = (feature_sums(x, [mine]) if mean is None else feature_spreads(x, [mine], mean))[0]
        elif mean is None:
            shared[k] = np.asarray(x[mine])
    return whole, shared


def shard_rows(part: Partition, devices: Iterable[int]) -> tuple[np.ndarray, Partition]:
    """The dataset rows ``devices`` use (sorted) and the partition with their indices remapped into those rows;
    other devices keep empty index arrays."""
    devs = sorted(set(devices))
    val = part.val or tuple(np.zeros(0, np.int64) for _ in part.train)
    rows = np.unique(np.concatenate([a[d] for a in (part.train, part.test, val) for d in devs] + [np.zeros(0, np.int64)]))
    empty = np.zeros(0, dtype=np.int64)
    hosted = set(devs)

    def remap(idx: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        return tuple(np.searchsorted(rows, a).astype(np.int64) if d in hosted else empty for d, a in enumerate(idx))

    return rows, Partition(remap(part.train), remap(part.test), part.groups, remap(part.val) if part.val else (),
                           part.group_kind)


def shard(ds: Dataset, part: Partition, devices: Iterable[int]) -> tuple[Dataset, Partition]:
    """The samples of ``devices`` only, with the partition's indices remapped into them.

    What a host needs, cut out by the process that loaded the dataset and shipped to the host (on
    Ray through the object store), so hosts read no files: a worker node needs the code only.
    """
    rows, sub = shard_rows(part, devices)
    return Dataset(ds.name, np.ascontiguousarray(ds.x[rows]), np.ascontiguousarray(ds.y[rows]), ds.num_classes), sub


@dataclass(frozen=True, eq=False)
class FileShard:
    """What :func:`shard` would send a host, less the inputs: the host reads its rows of the dataset's cached
    ``.npy`` file (``path``, at the same path on its node; ``rows`` are the file's) itself. The labels come
    along (a testbed may have permuted them), as does the file's size and mtime, so a host never reads another
    version of it."""

    path: str
    stamp: tuple[int, int]
    name: str
    num_classes: int
    rows: np.ndarray
    y: np.ndarray
    partition: Partition

    @classmethod
    def cut(cls, ds: Dataset, part: Partition, devices: Iterable[int], stamp: tuple[int, int]) -> FileShard:
        """``devices``' part of ``ds``, which must have an ``x_file`` (of size and mtime ``stamp``)."""
        assert ds.x_file is not None
        rows, sub = shard_rows(part, devices)
        file_rows = rows if ds.x_rows is None else ds.x_rows[rows]  # a subset's rows are a map into the file's
        return cls(ds.x_file, stamp, ds.name, ds.num_classes, file_rows, np.ascontiguousarray(ds.y[rows]), sub)

    def build(self) -> tuple[Dataset, Partition]:
        """The host's (samples, partition), exactly as :func:`shard` would have sent them."""
        return Dataset(self.name, read_rows(self.path, self.stamp, self.rows), self.y, self.num_classes), self.partition


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
