"""Splitting a dataset's samples across devices (non-IID) and each device's share into train/test.

Everything here is a pure function of its seed: the driver computes the partition from the labels
alone, and every host recomputes the same one instead of receiving index lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from lcfed.data.schemes import (
    _TESTBED_STREAM,
    DIRICHLET_CONVENTIONS,
    PartitionError,
    _check_labels,
    dominant_label,
    group_layout,
    iid,
    natural,
    pathological,
    primary_secondary,
    quantity_skew,
)
from lcfed.data.split import split_train_test

__all__ = [
    "NATURAL",
    "PARTITIONERS",
    "Partition",
    "PartitionParams",
    "Partitioner",
    "make_partition",
    "partition_schemes",
    "split_validation",
]


@dataclass(frozen=True, eq=False)  # eq=False: elementwise array comparison has no truth value
class Partition:
    """Per-device local train/test sample indices plus each device's ground-truth group, and the
    validation indices held out of each device's training share (``val``; empty tuple: none).

    ``groups`` is what the scheme knows of each device: a proxy (its dominant or primary class, its
    class set) for the label-skew schemes, and the true cluster for a testbed, which ``group_kind``
    then names (``rotated``, ...; ``""``: a proxy)."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    groups: np.ndarray
    val: tuple[np.ndarray, ...] = ()
    group_kind: str = ""

    def __post_init__(self) -> None:
        if not len(self.train) == len(self.test) == len(self.groups):
            raise ValueError(
                f"train/test/groups lengths differ: {len(self.train)}, {len(self.test)}, {len(self.groups)}"
            )
        if self.val and len(self.val) != len(self.train):
            raise ValueError(f"val holds {len(self.val)} devices, train {len(self.train)}")

    @property
    def num_devices(self) -> int:
        """The number of devices m."""
        return len(self.train)

    def sizes(self) -> np.ndarray:
        """The local train sample count of every device, (m,) int64 (aggregation weights)."""
        return np.fromiter((len(t) for t in self.train), dtype=np.int64, count=len(self.train))


@dataclass(frozen=True)
class PartitionParams:
    """The knobs of all schemes; each partitioner reads the ones it needs."""

    num_devices: int
    alpha: float = 0.5
    classes_per_device: int = 2
    min_samples: int = 10
    seed: int = 0
    primary: tuple[float, float] = (0.4, 0.6)
    secondary: tuple[float, float] = (0.2, 0.4)
    dirichlet_convention: str = "rebalance"
    user_selection: str = "largest"
    # per-sample device (user) ids of the dataset, when it has them (natural)
    device_ids: np.ndarray | None = field(default=None, compare=False, repr=False)


Partitioner = Callable[[np.ndarray, PartitionParams], tuple[list[np.ndarray], np.ndarray]]
"""labels, params -> (sample indices per device, ground-truth group per device)."""

def _dirichlet_scheme(labels: np.ndarray, p: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
    try:
        split = DIRICHLET_CONVENTIONS[p.dirichlet_convention]
    except KeyError:
        raise ValueError(f"unknown dirichlet_convention {p.dirichlet_convention!r}; "
                         f"known: {', '.join(sorted(DIRICHLET_CONVENTIONS))}") from None
    devices = split(labels, p.num_devices, p.alpha, p.min_samples, p.seed)
    return devices, dominant_label(devices, labels)


def _pathological_scheme(labels: np.ndarray, p: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
    return pathological(labels, p.num_devices, p.classes_per_device, p.seed)


def _primary_secondary_scheme(labels: np.ndarray, p: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
    return primary_secondary(labels, p.num_devices, p.primary, p.secondary, p.seed)


def _iid_scheme(labels: np.ndarray, p: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
    return iid(len(labels), p.num_devices, p.seed), np.zeros(p.num_devices, dtype=np.int64)


def _natural_scheme(labels: np.ndarray, p: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
    if p.device_ids is None:
        raise PartitionError(
            "partition",
            "the dataset has no per-sample device ids, which a natural partition splits by (a file dataset "
            "holds them in the .npz key or table column that data.device_column names; `lcfed data import "
            "--leaf` writes them for LEAF's JSON files)",
        )
    if len(p.device_ids) != len(labels):
        raise ValueError(f"device_ids hold {len(p.device_ids)} samples, labels {len(labels)}")
    devices = natural(p.device_ids, p.num_devices, p.min_samples, p.user_selection, p.seed)
    return devices, dominant_label(devices, labels)


PARTITIONERS: dict[str, Partitioner] = {
    # groups: each device's dominant class
    "dirichlet": _dirichlet_scheme,
    # groups: id of each device's class set
    "pathological": _pathological_scheme,
    # groups: each device's primary class
    "primary_secondary": _primary_secondary_scheme,
    # groups: none (all 0)
    "iid": _iid_scheme,
}
"""Scheme name -> partitioner of the labels alone; :func:`make_partition` dispatches through it."""

NATURAL = "natural"
"""The scheme that splits by the dataset's own device ids (:func:`natural`), not by the labels."""


def partition_schemes() -> list[str]:
    """Every ``data.partition`` name: the :data:`PARTITIONERS` and :data:`NATURAL`, sorted."""
    return sorted([*PARTITIONERS, NATURAL])


def split_seed(seed: int) -> int:
    """A seed for the train/test split that is independent of the partitioner's stream."""
    return int(np.random.SeedSequence((seed, 1)).generate_state(1)[0])


def make_partition(
    labels: np.ndarray,
    *,
    scheme: str,
    num_devices: int,
    alpha: float = 0.5,
    classes_per_device: int = 2,
    min_samples: int = 10,
    test_fraction: float = 0.2,
    seed: int = 0,
    quantity: Sequence[int] | None = None,
    primary: Sequence[float] = (0.4, 0.6),
    secondary: Sequence[float] = (0.2, 0.4),
    dirichlet_convention: str = "rebalance",
    min_test_samples: int = 0,
    device_ids: np.ndarray | None = None,
    user_selection: str = "largest",
    testbed: str = "none",
    testbed_groups: int = 4,
    sample_groups: np.ndarray | None = None,
    group_kind: str = "",
) -> Partition:
    """Partition ``labels`` across devices with ``scheme``, then split each device into train/test.

    The devices' samples (train + test) are exactly what ``PARTITIONERS[scheme]`` returns for the
    same seed (then cut to ``quantity = (low, high)`` samples each when given); the split uses a
    stream derived from the seed, with at least ``min_test_samples`` test samples per device (see
    :func:`split_train_test`). Settings these labels cannot satisfy raise :class:`PartitionError`.

    ``device_ids`` (per sample) are the users a ``natural`` partition keeps (``user_selection``). With
    a ``testbed`` (any name but ``none``), the devices and samples first form ``testbed_groups`` groups
    (:func:`group_layout`), ``scheme`` splits each group's samples over the group's devices (with a
    seed of its own), and each device's group is its ground truth (``group_kind`` = ``testbed``).
    A dataset that knows its samples' true clusters (``sample_groups``, per sample: a generated one, or
    a file's ``data.group_column``) gives each device the most common group among its samples (ties: the
    smallest id) as its ground truth, named ``group_kind``: in a ``natural`` partition all of a user's
    samples (which should share one group), in the others the device's training samples.
    """
    try:
        partitioner = _natural_scheme if scheme == NATURAL else PARTITIONERS[scheme]
    except KeyError:
        raise ValueError(f"unknown partition scheme {scheme!r}; known: {', '.join(partition_schemes())}") from None
    labels = _check_labels(labels)
    params = PartitionParams(num_devices, alpha, classes_per_device, min_samples, seed,
                             (float(primary[0]), float(primary[1])), (float(secondary[0]), float(secondary[1])),
                             dirichlet_convention, user_selection, device_ids)
    kind = ""
    if testbed != "none":
        devices, groups = _within_groups(labels, partitioner, params, testbed_groups)
        kind = testbed
    else:
        devices, groups = partitioner(labels, params)
        if sample_groups is not None:
            if len(sample_groups) != len(labels):
                raise ValueError(f"sample_groups has {len(sample_groups)} entries for {len(labels)} samples")
            kind = group_kind or "generated"
            if partitioner is _natural_scheme:
                groups = _majority_groups(devices, sample_groups)
    if quantity is not None:
        devices = quantity_skew(devices, int(quantity[0]), int(quantity[1]), seed)
    if scheme in _FLOORED:
        _check_floor(devices, scheme, min_samples, testbed != "none")
    train, test = split_train_test(devices, labels, test_fraction, split_seed(seed), min_test_samples)
    if sample_groups is not None and testbed == "none" and partitioner is not _natural_scheme:
        groups = _majority_groups(train, sample_groups)
    return Partition(tuple(train), tuple(test), np.asarray(groups, dtype=np.int64), group_kind=kind)


#: the schemes held to ``min_samples`` per device: the built-in ones (a partitioner registered in
#: :data:`PARTITIONERS` later decides its devices' sizes itself)
_FLOORED = frozenset([*PARTITIONERS, NATURAL])


def _check_floor(devices: Sequence[np.ndarray], scheme: str, min_samples: int, testbed: bool) -> None:
    """Every device holds at least ``min_samples`` samples, else :class:`PartitionError` naming ``min_samples``.

    ``dirichlet`` and ``natural`` meet the floor by construction; ``pathological`` splits each class among
    its holders, so a small class (or a ``data.subset`` that left few of it) can give its holders less, and
    a testbed splits each group's pool on its own. A device below the floor would train on next to nothing
    (or nothing: a class with fewer samples than holders), so such settings are refused, not run."""
    sizes = np.fromiter((len(d) for d in devices), dtype=np.int64, count=len(devices))
    short = np.flatnonzero(sizes < min_samples)
    if not len(short):
        return
    d, smallest = int(short[0]), int(sizes.min())
    more = {"pathological": ", more data.classes_per_device", "iid": "", "primary_secondary": ""}.get(scheme, "")
    lower = f"lower data.min_samples to at most {smallest}, or " if smallest >= 2 else ""  # (2: one train, one test)
    raise PartitionError(
        "min_samples",
        f"the {scheme} split{' within the testbed groups' if testbed else ''} gives device {d} only {sizes[d]} samples "
        f"({len(short)} of {len(sizes)} devices hold fewer than min_samples = {min_samples}; the smallest holds "
        f"{smallest}): {lower}give every device more samples (fewer data.num_devices{more}, a larger data.subset)",
    )


def _majority_groups(devices: Sequence[np.ndarray], sample_groups: np.ndarray) -> np.ndarray:
    """Each device's most common group among its samples ``devices[d]`` (ties: the smallest id; -1 for none)."""
    out = np.full(len(devices), -1, dtype=np.int64)
    for d, idx in enumerate(devices):
        if len(idx):
            out[d] = int(np.argmax(np.bincount(np.asarray(sample_groups)[idx])))
    return out


def _within_groups(
    labels: np.ndarray, partitioner: Partitioner, params: PartitionParams, groups: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """A testbed's devices: ``partitioner`` run on each group's sample pool for the group's devices."""
    if partitioner is _natural_scheme:
        raise PartitionError("testbed", "a testbed deals the samples to devices itself; it does not combine with "
                             "data.partition=natural (use iid, dirichlet, pathological or primary_secondary)")
    device_group, sample_group = group_layout(len(labels), params.num_devices, groups, params.seed)
    devices: list[np.ndarray] = [np.empty(0, np.int64)] * params.num_devices
    for g in range(groups):
        members = np.flatnonzero(device_group == g)
        pool = np.flatnonzero(sample_group == g)
        seed = int(np.random.default_rng([params.seed, _TESTBED_STREAM, g]).integers(2**31))
        try:
            local, _ = partitioner(labels[pool], replace(params, num_devices=len(members), seed=seed))
        except PartitionError:
            raise
        except ValueError as exc:  # the scheme's own argument checks, on this group's pool
            raise PartitionError("testbed_groups", f"group {g} ({len(members)} devices, {len(pool)} samples) "
                                 f"cannot be partitioned: {exc}; use fewer data.testbed_groups or devices") from None
        for d, idx in zip(members, local, strict=True):
            devices[d] = pool[idx]
    return devices, device_group


#: the validation split's stream (with the seed and the device id): no other draw uses it
_VAL_STREAM = 0x7A1


def split_validation(part: Partition, fraction: float, seed: int) -> Partition:
    """Hold out ``round(fraction x n)`` (halves up) of each device's ``n`` training samples as its
    validation set, drawn at random by a generator of (``seed``, device) alone, so a device's split
    does not depend on the others, on the host or on any other stream; test sets stay as they are.

    Every device must keep at least one training and one validation sample, else
    :class:`PartitionError` naming ``val_fraction`` and the first device that cannot.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    n_val = validation_sizes(part.sizes(), fraction)
    train, val = hold_out_validation(part.train, n_val, seed, range(len(part.train)))
    return Partition(tuple(train), part.test, part.groups, tuple(val), part.group_kind)


def validation_sizes(sizes: np.ndarray, fraction: float) -> np.ndarray:
    """Each device's validation count for ``fraction`` of its ``sizes`` training samples, or
    :class:`PartitionError` (``val_fraction``) naming the first device that cannot keep one of each."""
    n_val = np.floor(sizes * fraction + 0.5).astype(np.int64)
    bad = np.flatnonzero((n_val < 1) | (n_val >= sizes))
    if len(bad):
        d, small = int(bad[0]), int(sizes.min())
        fits = (f"with these devices (the smallest holds {small} training samples) it must be in "
                f"[{0.5 / small:.4g}, {1 - 0.5 / small:.4g})" if small >= 2 else "no value fits a device of 1 training sample")
        raise PartitionError(
            "val_fraction",
            f"would leave device {d} ({sizes[d]} training samples) {n_val[d]} validation and {sizes[d] - n_val[d]} "
            f"training samples ({len(bad)} of {len(sizes)} devices cannot keep one of each); {fits}, or give every "
            "device more samples (data.min_samples, fewer data.num_devices)",
        )
    return n_val


def hold_out_validation(train: Sequence[np.ndarray], n_val: np.ndarray, seed: int, devices: Sequence[int]
                        ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``n_val`` of each device's ``train`` samples held out, drawn by a generator of (``seed``, its id in
    ``devices``) alone: (train, validation), both in the training order."""
    out_train, out_val = [], []
    for idx, n, d in zip(train, n_val, devices, strict=True):
        held = np.zeros(len(idx), dtype=bool)
        held[np.random.default_rng([seed, int(d), _VAL_STREAM]).permutation(len(idx))[:n]] = True
        out_train.append(idx[~held])  # both keep the training order, as drawn by the train/test split
        out_val.append(idx[held])
    return out_train, out_val
