"""The partition schemes: which samples each device gets (Dirichlet label skew in two conventions,
pathological class sets, primary/secondary classes, IID, natural users, testbed groups, quantity skew).

Each is a pure function of the labels, the sizes and the seed; :func:`lcfed.data.partition.make_partition`
puts one together with the train/test split into a :class:`~lcfed.data.partition.Partition`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def pieces(flat: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """``flat`` cut into consecutive arrays of ``sizes``, each a copy of its own (``np.split``'s pieces, without
    its per-piece overhead: 5x faster at 10^6 devices)."""
    ends = np.cumsum(sizes)
    return [flat[e - n:e].copy() for e, n in zip(ends.tolist(), np.asarray(sizes).tolist(), strict=True)]


class PartitionError(ValueError):
    """These labels cannot be partitioned with these settings; ``param`` names the setting to change
    (a :func:`make_partition` keyword, which is also the ``data.`` config field of that name)."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(message)


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
    return pieces(order.astype(np.int64), sizes)


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
    if not 1 <= classes_per_device <= num_classes:  # the classes present: a subset or a file may lack some
        raise PartitionError(
            "classes_per_device",
            f"these labels hold {num_classes} distinct class{'es' if num_classes != 1 else ''}, so classes_per_device "
            f"must be in [1, {num_classes}] (a data.subset, a testbed group or a file may hold fewer classes than "
            "the dataset has)",
        )
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
    if num_classes < 3:  # the classes present: a subset or a file may lack some
        raise PartitionError(
            "partition",
            f"primary_secondary needs labels of >= 3 distinct classes (a primary, a secondary and the rest), these "
            f"hold {num_classes}: use another data.partition (iid, dirichlet, pathological)",
        )
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
    per_user = pieces(order.astype(np.int64), counts)
    return [per_user[u] for u in np.sort(chosen)]  # pieces are copies already


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
