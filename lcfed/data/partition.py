"""Splitting a dataset's samples across devices (non-IID) and each device's share into train/test.

Everything here is a pure function of its seed: the driver computes the partition from the labels
alone, and every host recomputes the same one instead of receiving index lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = [
    "DIRICHLET_CONVENTIONS",
    "NATURAL",
    "NIID_BENCH_MAX_DRAWS",
    "PARTITIONERS",
    "USER_SELECTIONS",
    "Partition",
    "PartitionError",
    "PartitionParams",
    "dirichlet",
    "dirichlet_niid_bench",
    "dominant_label",
    "format_groups",
    "format_stats",
    "iid",
    "make_partition",
    "natural",
    "partition_schemes",
    "partition_stats",
    "pathological",
    "primary_secondary",
    "quantity_skew",
    "split_train_test",
    "split_validation",
    "group_layout",
]


class PartitionError(ValueError):
    """These labels cannot be partitioned with these settings; ``param`` names the setting to change
    (a :func:`make_partition` keyword, which is also the ``data.`` config field of that name)."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(message)


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

USER_SELECTIONS = ("largest", "random")
"""``data.user_selection``: which users a natural partition keeps as its ``num_devices`` devices."""


def _check_labels(labels: np.ndarray, *, nonempty: bool = False) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-d integer array, got {labels.dtype} {labels.shape}")
    if nonempty and len(labels) == 0:
        raise ValueError("labels must not be empty: there is nothing to partition")
    return labels


def _greedy_take(capacity: np.ndarray, amount: int, order: np.ndarray) -> np.ndarray:
    """Take ``amount`` units, draining entries of ``capacity`` fully one by one in ``order``."""
    cap = capacity[order]
    before = np.cumsum(cap) - cap
    taken = np.empty_like(capacity)
    taken[order] = np.clip(amount - before, 0, cap)
    return taken


def _rebalance(counts: np.ndarray, dominant: np.ndarray, min_samples: int, rng: np.random.Generator) -> None:
    """Move samples (in place, as counts) from devices above ``min_samples`` to those below it.

    ``counts`` is (classes, devices). A short device first takes samples of its own dominant
    class, so label skew survives, then any class. Donors keep at least ``min_samples`` and the
    richest donors give first. One pass per class, no redraws: it cannot loop however small
    alpha is. Feasible whenever counts.sum() >= devices * min_samples: a donor that is still
    asked gives its whole surplus over the passes, and total surplus >= total deficit.
    """
    num_classes, num_devices = counts.shape
    totals = counts.sum(axis=0)
    recipient_order = rng.permutation(num_devices)  # who is served first when a class runs dry
    passes = [(c, True) for c in range(num_classes)]
    passes += [(int(c), False) for c in rng.permutation(num_classes)]
    for c, own_class_only in passes:
        need = np.maximum(min_samples - totals, 0)
        if own_class_only:
            need[dominant != c] = 0
        wanted = int(need.sum())
        if wanted == 0:
            continue
        capacity = np.minimum(counts[c], np.maximum(totals - min_samples, 0))
        moved = min(wanted, int(capacity.sum()))
        if moved == 0:
            continue
        take = _greedy_take(capacity, moved, np.argsort(-capacity, kind="stable"))
        give = _greedy_take(need, moved, recipient_order)
        counts[c] += give - take
        totals += give - take


def _assign(class_of: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Deal each class's samples (shuffled) to devices by ``counts`` (classes, devices).

    Returns each device's indices in random order. A class's samples beyond its dealt total stay
    unassigned (pathological: classes that no device holds).
    """
    num_classes, num_devices = counts.shape
    owner = np.full(len(class_of), -1, dtype=np.int64)
    for c in range(num_classes):
        members = rng.permutation(np.flatnonzero(class_of == c))
        dealt = np.repeat(np.arange(num_devices), counts[c])
        owner[members[: len(dealt)]] = dealt
    # Random order within a device: shuffle, then stable-sort by owner.
    order = rng.permutation(len(class_of))
    order = order[np.argsort(owner[order], kind="stable")]
    order = order[np.count_nonzero(owner < 0) :]  # -1 (unassigned) sorts first
    sizes = np.bincount(owner[owner >= 0], minlength=num_devices)
    return [part.copy() for part in np.split(order.astype(np.int64), np.cumsum(sizes)[:-1])]


def dirichlet(labels: np.ndarray, num_devices: int, alpha: float, min_samples: int, seed: int) -> list[np.ndarray]:
    """Label-skewed split: class c goes to devices by proportions p_c ~ Dir(alpha * 1_m).

    Small ``alpha`` concentrates each class on few devices. Every device then gets at least
    ``min_samples`` by direct transfer from devices with a surplus (see :func:`_rebalance`), never
    by redrawing, which can take forever at small alpha. Every sample is used exactly once.
    """
    labels = _check_dirichlet_args(labels, num_devices, alpha, min_samples)
    rng = np.random.default_rng(seed)
    _, class_of, class_sizes = np.unique(labels, return_inverse=True, return_counts=True)
    props = rng.dirichlet(np.full(num_devices, float(alpha)), size=len(class_sizes))
    props /= props.sum(axis=1, keepdims=True)  # multinomial rejects sums a few ulp above 1
    counts = rng.multinomial(class_sizes, props)
    _rebalance(counts, np.argmax(props, axis=0), min_samples, rng)
    return _assign(class_of, counts, rng)


def _check_dirichlet_args(labels: np.ndarray, num_devices: int, alpha: float, min_samples: int) -> np.ndarray:
    labels = _check_labels(labels, nonempty=True)
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_samples < 0:
        raise ValueError(f"min_samples must be >= 0, got {min_samples}")
    if num_devices * min_samples > len(labels):
        raise ValueError(
            f"{num_devices} devices x {min_samples} min_samples = {num_devices * min_samples} > {len(labels)} samples"
        )
    return labels


#: redraws :func:`dirichlet_niid_bench` makes before giving up (NIID-Bench itself loops forever)
NIID_BENCH_MAX_DRAWS = 1000


def _niid_bench_counts(
    class_sizes: np.ndarray, num_devices: int, alpha: float, min_samples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """NIID-Bench's ``noniid-labeldir`` loop on counts: (counts (classes, devices), last proportions, draws).

    Per class in label order: p ~ Dir(alpha 1_m), zeroed for devices that already hold >= N/m samples,
    renormalized; the class is cut at ``floor(cumsum(p) * n_c)``. The whole draw is repeated until
    every device holds >= ``min_samples``. A draw whose surviving proportions are all 0 (possible
    at tiny alpha, where NIID-Bench would divide by zero) counts as failed.
    """
    n_total, num_classes = int(class_sizes.sum()), len(class_sizes)
    for draw in range(1, NIID_BENCH_MAX_DRAWS + 1):
        counts = np.zeros((num_classes, num_devices), dtype=np.int64)
        props = np.zeros((num_classes, num_devices))
        sizes = np.zeros(num_devices, dtype=np.int64)
        ok = True
        for c in range(num_classes):
            p = rng.dirichlet(np.full(num_devices, float(alpha)))
            p = p * (sizes < n_total / num_devices)
            if not p.sum() > 0:
                ok = False
                break
            p = p / p.sum()
            cuts = (np.cumsum(p) * class_sizes[c]).astype(np.int64)[:-1]
            counts[c] = np.diff(np.concatenate(([0], cuts, [class_sizes[c]])))
            props[c] = p
            sizes += counts[c]
        if ok and sizes.min() >= min_samples:
            return counts, props, draw
    raise PartitionError(
        "dirichlet_convention",
        f"niid_bench drew the Dirichlet split {NIID_BENCH_MAX_DRAWS} times and never gave all {num_devices} devices "
        f">= min_samples ({min_samples}) samples at alpha {alpha}: lower data.min_samples or data.num_devices, raise "
        "data.alpha, or use data.dirichlet_convention=rebalance (which guarantees the minimum directly)",
    )


def dirichlet_niid_bench(
    labels: np.ndarray, num_devices: int, alpha: float, min_samples: int, seed: int
) -> list[np.ndarray]:
    """Label-skewed split by NIID-Bench's convention (Li et al., ICDE 2022, ``noniid-labeldir``),
    which the LCFed line of papers follows.

    As :func:`dirichlet`, but a device that already holds N/m samples (N samples, m devices) gets
    nothing of the later classes, and the minimum is met by redrawing the whole split (at most
    :data:`NIID_BENCH_MAX_DRAWS` times, then a :class:`PartitionError`). The cap gives fewer classes
    per device and larger small devices than :func:`dirichlet`. Every sample is used exactly once.
    """
    labels = _check_dirichlet_args(labels, num_devices, alpha, min_samples)
    rng = np.random.default_rng(seed)
    _, class_of, class_sizes = np.unique(labels, return_inverse=True, return_counts=True)
    counts, _, _ = _niid_bench_counts(class_sizes, num_devices, alpha, min_samples, rng)
    return _assign(class_of, counts, rng)


DIRICHLET_CONVENTIONS: dict[str, Callable[[np.ndarray, int, float, int, int], list[np.ndarray]]] = {
    # one draw, then direct transfers up to min_samples; no size cap
    "rebalance": dirichlet,
    # NIID-Bench: devices at N/m get no more classes; redraw until min_samples holds
    "niid_bench": dirichlet_niid_bench,
}
"""How a Dirichlet(alpha) split meets ``min_samples`` and shapes device sizes; ``data.dirichlet_convention``."""


def pathological(
    labels: np.ndarray, num_devices: int, classes_per_device: int, seed: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """Each device holds exactly ``classes_per_device`` distinct classes (McMahan et al.'s shards).

    Class sets are chosen greedily from the least-used classes (random tie-breaking), so usage
    is balanced and every class has a holder when m * n >= C. A class's samples are split among
    its holders as evenly as possible; classes without a holder go unused. (A class with fewer
    samples than holders cannot reach them all, so some devices then see fewer classes.)
    Returns the indices per device and the group of each device: the id of its class set,
    0..G-1 in order of first appearance.
    """
    labels = _check_labels(labels, nonempty=True)
    classes, class_of = np.unique(labels, return_inverse=True)
    num_classes = len(classes)
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if not 1 <= classes_per_device <= num_classes:
        raise ValueError(f"classes_per_device must be in [1, {num_classes}], got {classes_per_device}")
    rng = np.random.default_rng(seed)
    usage = np.zeros(num_classes, dtype=np.int64)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    set_ids: dict[tuple[int, ...], int] = {}
    groups = np.empty(num_devices, dtype=np.int64)
    for dev in range(num_devices):
        # Usage is integral, so a uniform [0, 1) jitter only breaks ties.
        chosen = np.sort(np.argsort(usage + rng.random(num_classes), kind="stable")[:classes_per_device])
        usage[chosen] += 1
        for c in chosen:
            holders[c].append(dev)
        groups[dev] = set_ids.setdefault(tuple(chosen.tolist()), len(set_ids))
    counts = np.zeros((num_classes, num_devices), dtype=np.int64)
    for c, devs in enumerate(holders):
        if devs:
            n = int(np.count_nonzero(class_of == c))
            share = np.full(len(devs), n // len(devs))
            share[rng.permutation(len(devs))[: n % len(devs)]] += 1  # who gets the remainder: random
            counts[c, devs] = share
    return _assign(class_of, counts, rng), groups


def primary_secondary(
    labels: np.ndarray,
    num_devices: int,
    primary: tuple[float, float],
    secondary: tuple[float, float],
    seed: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """DC-PFL's split: every device gets an equal share; a primary class makes up a fraction drawn
    from U(primary), a different secondary class a fraction from U(secondary), and the rest is
    spread evenly over the other classes.

    Primary and secondary classes are dealt round-robin in random order, so every class is primary
    (and secondary) for about m / C devices. A class asked for more than it has is scaled down on
    every device alike, and each device makes up its shortfall from the classes with the most
    samples left (in proportion), so every device gets its full share. Returns the indices per device and each
    device's primary class as its group.
    """
    labels = _check_labels(labels, nonempty=True)
    classes, class_of, class_sizes = np.unique(labels, return_inverse=True, return_counts=True)
    num_classes = len(classes)
    if num_classes < 3:
        raise ValueError(f"primary_secondary needs >= 3 classes, got {num_classes}")
    if num_devices < 1 or num_devices > len(labels):
        raise ValueError(f"num_devices must be in [1, {len(labels)}], got {num_devices}")
    (p_lo, p_hi), (s_lo, s_hi) = primary, secondary
    if not (0 <= p_lo <= p_hi and 0 <= s_lo <= s_hi and p_hi + s_hi <= 1):
        raise ValueError(f"primary {primary} and secondary {secondary} must be ranges in [0, 1] with maxima summing to <= 1")
    rng = np.random.default_rng(seed)
    share = len(labels) // num_devices
    devs = np.arange(num_devices)
    prim = rng.permutation(devs % num_classes)
    sec = (prim + 1 + rng.permutation(devs % (num_classes - 1))) % num_classes  # never the primary
    f_p = rng.uniform(p_lo, p_hi, size=num_devices)
    f_s = rng.uniform(s_lo, s_hi, size=num_devices)
    want = np.zeros((num_classes, num_devices))
    want[:] = ((1 - f_p - f_s) / (num_classes - 2))[None, :]
    want[prim, devs] = f_p
    want[sec, devs] = f_s
    counts = np.floor(want * share).astype(np.int64)
    counts[prim, devs] += share - counts.sum(axis=0)  # rounding goes to the primary class
    demand = counts.sum(axis=1)
    over = demand > class_sizes
    counts[over] = np.floor(counts[over] * (class_sizes[over] / demand[over])[:, None]).astype(np.int64)
    left = class_sizes - counts.sum(axis=1)
    for dev in rng.permutation(num_devices):
        short = share - int(counts[:, dev].sum())
        if short <= 0:
            continue
        add = np.minimum(np.floor(short * left / left.sum()).astype(np.int64), left)  # spread, not lumped
        for c in np.argsort(-(left - add), kind="stable")[: short - int(add.sum())]:
            add[c] += 1
        counts[:, dev] += add
        left -= add
    return _assign(class_of, counts, rng), prim.astype(np.int64)


def iid(num_samples: int, num_devices: int, seed: int) -> list[np.ndarray]:
    """No skew: a uniformly random split into ``num_devices`` shares of equal size (sizes differ by at
    most one). Every sample is used exactly once."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    order = np.random.default_rng(seed).permutation(num_samples).astype(np.int64)
    return [part.copy() for part in np.array_split(order, num_devices)]


def natural(device_ids: np.ndarray, num_devices: int, min_samples: int, selection: str, seed: int) -> list[np.ndarray]:
    """The dataset's own devices: one device per user id in ``device_ids`` (per sample), keeping
    ``num_devices`` of the users that hold at least ``min_samples`` samples, either the largest
    (``selection="largest"``; ties: the smaller id) or a seeded uniform sample (``"random"``). Devices are
    numbered in increasing order of the users' ids; each holds all of its user's samples, in sample order.

    Raises :class:`PartitionError` (``num_devices``) when fewer users are that large.
    """
    ids = np.asarray(device_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"device_ids must be a 1-d integer array, got {ids.dtype} {ids.shape}")
    if selection not in USER_SELECTIONS:
        raise ValueError(f"unknown user selection {selection!r}; known: {', '.join(USER_SELECTIONS)}")
    users, user_of, counts = np.unique(ids, return_inverse=True, return_counts=True)
    eligible = np.flatnonzero(counts >= min_samples)
    if len(eligible) < num_devices:
        raise PartitionError(
            "num_devices",
            f"the dataset has {len(users)} users (device ids), {len(eligible)} of them with >= min_samples "
            f"({min_samples}) samples, fewer than the {num_devices} devices asked for: lower data.num_devices to "
            f"at most {len(eligible)}, or data.min_samples",
        )
    if selection == "largest":
        chosen = eligible[np.lexsort((eligible, -counts[eligible]))][:num_devices]
    else:
        chosen = np.random.default_rng([seed, 0x05E]).choice(eligible, size=num_devices, replace=False)
    order = np.argsort(user_of, kind="stable")  # samples grouped by user, in sample order
    per_user = np.split(order.astype(np.int64), np.cumsum(counts)[:-1])
    return [per_user[u].copy() for u in np.sort(chosen)]


#: the testbed's stream (with the seed): which devices and samples form each group
_TESTBED_STREAM = 0x7E57


def group_layout(num_samples: int, num_devices: int, groups: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which group each device and each sample belongs to in a testbed of ``groups`` known clusters:
    ``(device_group (m,), sample_group (n,))``, both int64, a pure function of the sizes and the seed
    (never of the labels, so it is the same before and after a testbed permutes them).

    Devices are dealt to groups as evenly as possible (sizes differ by at most one) in a seeded random
    order; the samples are split at random into one pool per group, sized in proportion to the
    group's devices (largest remainder), so every group's devices get the same share of samples.
    """
    if not 1 <= groups <= num_devices:
        raise ValueError(f"groups must be in [1, num_devices = {num_devices}], got {groups}")
    rng = np.random.default_rng([seed, _TESTBED_STREAM])
    device_group = rng.permutation(np.arange(num_devices, dtype=np.int64) % groups)
    devices = np.bincount(device_group, minlength=groups)
    pool = num_samples * devices // num_devices
    rest = num_samples * devices % num_devices
    pool[np.lexsort((np.arange(groups), -rest))[: num_samples - int(pool.sum())]] += 1
    sample_group = np.empty(num_samples, dtype=np.int64)
    sample_group[rng.permutation(num_samples)] = np.repeat(np.arange(groups, dtype=np.int64), pool)
    return device_group, sample_group


def quantity_skew(devices: Sequence[np.ndarray], low: int, high: int, seed: int) -> list[np.ndarray]:
    """Keep a uniformly random subset of each device's samples, of a size drawn from U{low..high}
    (devices that hold fewer keep all of theirs): FedAC's 50-350 samples per device on top of any
    label split."""
    if not 1 <= low <= high:
        raise ValueError(f"quantity range must satisfy 1 <= low <= high, got ({low}, {high})")
    rng = np.random.default_rng([seed, 0x0A7])
    sizes = rng.integers(low, high + 1, size=len(devices))
    return [rng.permutation(np.asarray(d, dtype=np.int64))[: min(int(n), len(d))] for d, n in zip(devices, sizes, strict=True)]


def dominant_label(device_indices: Sequence[np.ndarray], labels: np.ndarray) -> np.ndarray:
    """The most frequent label of every device, (m,) int64 (smallest label on ties; empty: smallest)."""
    labels = _check_labels(labels)
    classes, class_of = np.unique(labels, return_inverse=True)
    sizes = np.fromiter((len(d) for d in device_indices), dtype=np.int64, count=len(device_indices))
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in device_indices] + [np.empty(0, np.int64)])
    dev = np.repeat(np.arange(len(sizes)), sizes)
    table = np.bincount(dev * len(classes) + class_of[flat], minlength=len(sizes) * len(classes))
    return classes[table.reshape(len(sizes), len(classes)).argmax(axis=1)].astype(np.int64)


def split_train_test(
    device_indices: Sequence[np.ndarray], labels: np.ndarray, test_fraction: float, seed: int, min_test: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split every device's samples into local train/test, stratified by class.

    Per device and class, round(count * test_fraction) samples (halves rounded up) go to test.
    Then, when ``test_fraction > 0``: a device with >= 2 samples but no test sample moves one of its
    most frequent class to test, and a device whose samples all went to test keeps one for
    training; so train is empty only for empty devices, test only for devices of 1 sample.

    ``min_test`` > 0 is a floor: a device whose test set came out smaller gets exactly ``min_test``
    test samples instead, apportioned over its classes by largest remainder (so its test set keeps
    the device's label mix); devices already at or above the floor keep the same train and test
    samples as without it (their order, which the shuffle draws for all devices at once, may differ). A
    device with fewer than ``min_test + 1`` samples (one must stay for training) is a
    :class:`PartitionError`. Vectorized over all devices at once.
    """
    labels = _check_labels(labels)
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if min_test < 0:
        raise ValueError(f"min_test must be >= 0, got {min_test}")
    m = len(device_indices)
    rng = np.random.default_rng(seed)
    sizes = np.fromiter((len(d) for d in device_indices), dtype=np.int64, count=m)
    if min_test > 0 and m and sizes.min() <= min_test:
        small = int(np.argmin(sizes))
        raise PartitionError(
            "min_test_samples",
            f"device {small} holds {sizes[small]} samples, so a test set of min_test_samples ({min_test}) would "
            f"leave it no training sample ({int(np.count_nonzero(sizes <= min_test))} of {m} devices hold <= "
            f"{min_test}): lower data.min_test_samples, or give every device more samples (data.min_samples for "
            "dirichlet, fewer data.num_devices)",
        )
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in device_indices] + [np.empty(0, np.int64)])
    dev = np.repeat(np.arange(m), sizes)
    lab = labels[flat]
    # Group samples by (device, label), in random order within each group.
    order = np.lexsort((rng.random(len(flat)), lab, dev))
    flat, dev, lab = flat[order], dev[order], lab[order]
    starts_mask = np.ones(len(flat), dtype=bool)
    starts_mask[1:] = (dev[1:] != dev[:-1]) | (lab[1:] != lab[:-1])
    starts = np.flatnonzero(starts_mask)
    group_of = np.cumsum(starts_mask) - 1
    rank = np.arange(len(flat)) - starts[group_of]
    group_size = np.diff(np.append(starts, len(flat)))
    group_dev = dev[starts]
    n_test = np.floor(group_size * test_fraction + 0.5).astype(np.int64)

    if test_fraction > 0 and len(starts):
        # Each device's largest group (first on ties): where a forced move comes from.
        by_size = np.lexsort((-group_size, group_dev))
        first = np.ones(len(by_size), dtype=bool)
        first[1:] = group_dev[by_size[1:]] != group_dev[by_size[:-1]]
        largest = by_size[first]  # one group per non-empty device, in device order
        dev_test = np.bincount(group_dev, weights=n_test, minlength=m).astype(np.int64)
        owners = group_dev[largest]
        n_test[largest[(dev_test[owners] == 0) & (sizes[owners] >= 2)]] += 1
        n_test[largest[dev_test[owners] == sizes[owners]]] -= 1

    if min_test > 0 and len(starts):
        _raise_to_floor(n_test, group_size, group_dev, lab[starts], sizes, min_test)

    is_test = rank < n_test[group_of]
    train = _by_device(flat[~is_test], dev[~is_test], m, rng)
    test = _by_device(flat[is_test], dev[is_test], m, rng)
    return train, test


def _raise_to_floor(
    n_test: np.ndarray, group_size: np.ndarray, group_dev: np.ndarray, group_label: np.ndarray,
    sizes: np.ndarray, floor: int,
) -> None:
    """Set (in place) the per-(device, class) test counts of devices below ``floor`` test samples to
    an apportionment of exactly ``floor``: floor(floor * count / size) each, and the remaining units
    to the largest remainders (ties: larger class count, then smaller label). Integer arithmetic, so
    ties are exact; no class is asked for more samples than the device holds of it."""
    dev_test = np.bincount(group_dev, weights=n_test, minlength=len(sizes)).astype(np.int64)
    low = dev_test[group_dev] < floor
    if not low.any():
        return
    share = floor * group_size[low]
    base, remainder = share // sizes[group_dev[low]], share % sizes[group_dev[low]]
    devs = group_dev[low]
    missing = floor - np.bincount(devs, weights=base, minlength=len(sizes)).astype(np.int64)
    order = np.lexsort((group_label[low], -group_size[low], -remainder, devs))
    first = np.searchsorted(devs[order], devs[order])  # where each device's run starts in ``order``
    rank = np.arange(len(order)) - first
    extra = np.zeros(len(order), dtype=np.int64)
    extra[order] = rank < missing[devs[order]]
    n_test[low] = base + extra


def _by_device(flat: np.ndarray, dev: np.ndarray, m: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``flat`` into one array per device, each in random order."""
    order = np.lexsort((rng.random(len(flat)), dev))
    parts = np.split(flat[order], np.cumsum(np.bincount(dev, minlength=m))[:-1])
    return [p.copy() for p in parts]


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


def _split_seed(seed: int) -> int:
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
    if quantity is not None:
        devices = quantity_skew(devices, int(quantity[0]), int(quantity[1]), seed)
    train, test = split_train_test(devices, labels, test_fraction, _split_seed(seed), min_test_samples)
    return Partition(tuple(train), tuple(test), np.asarray(groups, dtype=np.int64), group_kind=kind)


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
    sizes = part.sizes()
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
    train, val = [], []
    for d, idx in enumerate(part.train):
        held = np.zeros(len(idx), dtype=bool)
        held[np.random.default_rng([seed, d, _VAL_STREAM]).permutation(len(idx))[: n_val[d]]] = True
        train.append(idx[~held])  # both keep the training order, as drawn by the train/test split
        val.append(idx[held])
    return Partition(tuple(train), part.test, part.groups, tuple(val), part.group_kind)


def partition_stats(part: Partition, labels: np.ndarray) -> dict[str, float]:
    """What a partition looks like: train and test sizes (min / median / max) and the number of
    distinct classes a device holds (train + test; mean / min / max). Logged at the start of a run,
    since these decide how noisy the per-device accuracies are. With a validation split, its sizes
    too (``val_*``), and its samples count in ``samples`` and the classes."""
    labels = _check_labels(labels)
    m = part.num_devices
    train = part.sizes()
    test = np.fromiter((len(t) for t in part.test), dtype=np.int64, count=m)
    val = np.fromiter((len(v) for v in part.val), dtype=np.int64, count=len(part.val))
    classes, class_of = np.unique(labels, return_inverse=True)
    flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in (*part.train, *part.test, *part.val)]
                          + [np.empty(0, np.int64)])
    dev = np.concatenate([np.repeat(np.arange(m), n) for n in (train, test, val) if len(n) == m])
    held = np.bincount(dev * len(classes) + class_of[flat], minlength=m * len(classes)).reshape(m, len(classes)) > 0
    per_device = held.sum(axis=1)
    out: dict[str, float] = {"devices": float(m), "samples": float(train.sum() + test.sum() + val.sum())}
    for name, values in (("train", train), ("test", test), ("val", val)):
        if len(values) == m:  # no val_* without a validation split
            out.update({f"{name}_min": float(values.min()), f"{name}_median": float(np.median(values)),
                        f"{name}_max": float(values.max())})
    out.update({"classes_mean": float(per_device.mean()), "classes_min": float(per_device.min()),
                "classes_max": float(per_device.max())})
    if part.group_kind:  # a testbed's known clusters: how many, and their sizes in devices
        members = np.bincount(part.groups)
        out.update({"groups": float(len(members)), "group_devices_min": float(members.min()),
                    "group_devices_max": float(members.max())})
    return out


def format_stats(stats: dict[str, float]) -> str:
    """One line, e.g. ``100 devices, 70,000 samples; train 8 / 344 / 3,520 and test 2 / 86.5 / 880
    (min / median / max); classes per device 4.60 (1-9)``."""

    def n(v: float) -> str:
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"

    sizes = " and ".join(f"{k} {n(stats[k + '_min'])} / {n(stats[k + '_median'])} / {n(stats[k + '_max'])}"
                         for k in ("train", "val", "test") if k + "_min" in stats)
    groups = (f"; {n(stats['groups'])} known groups of {n(stats['group_devices_min'])}-{n(stats['group_devices_max'])} "
              "devices" if "groups" in stats else "")
    return (f"{n(stats['devices'])} devices, {n(stats['samples'])} samples; {sizes} (min / median / max); "
            f"classes per device {stats['classes_mean']:.2f} ({n(stats['classes_min'])}-{n(stats['classes_max'])})"
            f"{groups}")


def format_groups(part: Partition) -> str:
    """Each device's known group, e.g. ``rotated groups (device: group): 0:2 1:0 2:3 ...``; ``""`` when the
    partition's groups are only a proxy (a scheme's dominant class)."""
    if not part.group_kind:
        return ""
    return f"{part.group_kind} groups (device: group): " + " ".join(f"{d}:{g}" for d, g in enumerate(part.groups.tolist()))
