"""A setup that the hosts build themselves: generated data made on each node (:class:`NodeShard`,
:func:`setup_on_hosts`), the input scaling fitted from the hosts' pieces, and the rows a host reads from a
cached file (:class:`FileShard`). The driver holds no sample: it gathers each host's facts (sizes, label
counts, scaling rows) and finishes the same :class:`~lcfed.run.setup.Setup` the driver-side path builds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from lcfed.config import ExperimentConfig
from lcfed.data import (
    Dataset,
    Partition,
    PartitionError,
    Scaling,
)
from lcfed.data.cache import read_rows
from lcfed.data.generated import CLASSES, FEATURES, GENERATED, GeneratedSpec, generate_devices
from lcfed.data.partition import hold_out_validation, split_seed, validation_sizes
from lcfed.data.partition_stats import stats_of
from lcfed.data.schemes import pieces
from lcfed.data.sources import SCALING_CHUNK, feature_spreads, feature_sums
from lcfed.data.split import SplitPart, check_test_floor, split_part
from lcfed.run.setup import Setup, check_validation, federation, finish_setup, label_shares, scaling_rows
from lcfed.run.sources import check_model, data_error, held_out_devices


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
    along (a testbed may have permuted them), as does the file's version (size, mtime, hash), so a host never reads
    another version of it."""

    path: str
    version: tuple[int, int, str]
    name: str
    num_classes: int
    rows: np.ndarray
    y: np.ndarray
    partition: Partition

    @classmethod
    def cut(cls, ds: Dataset, part: Partition, devices: Iterable[int], version: tuple[int, int, str]
            ) -> FileShard:
        """``devices``' part of ``ds``, which must have an ``x_file`` (of :func:`~lcfed.data.cache.file_version`
        ``version``)."""
        assert ds.x_file is not None
        rows, sub = shard_rows(part, devices)
        file_rows = rows if ds.x_rows is None else ds.x_rows[rows]  # a subset's rows are a map into the file's
        return cls(ds.x_file, version, ds.name, ds.num_classes, file_rows, np.ascontiguousarray(ds.y[rows]), sub)

    def build(self) -> tuple[Dataset, Partition]:
        """The host's (samples, partition), exactly as :func:`shard` would have sent them."""
        return Dataset(self.name, read_rows(self.path, self.version, self.rows), self.y, self.num_classes), self.partition
