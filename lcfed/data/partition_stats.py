"""What a partition looks like, as numbers (logged at a run's start) and as the lines `lcfed data stats` prints."""

from __future__ import annotations

import numpy as np

from lcfed.data.partition import Partition
from lcfed.data.schemes import _check_labels


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
    return stats_of(train, test, val, held.sum(axis=1), part.groups if part.group_kind else None)


def stats_of(train: np.ndarray, test: np.ndarray, val: np.ndarray, classes: np.ndarray,
             groups: np.ndarray | None) -> dict[str, float]:
    """:func:`partition_stats` from each device's train, test and validation sizes (``val`` empty without a
    split), the number of classes it holds, and its known group (None without known clusters)."""
    m = len(train)
    out: dict[str, float] = {"devices": float(m), "samples": float(train.sum() + test.sum() + val.sum())}
    for name, values in (("train", train), ("test", test), ("val", val)):
        if len(values) == m:  # no val_* without a validation split
            out.update({f"{name}_min": float(values.min()), f"{name}_median": float(np.median(values)),
                        f"{name}_max": float(values.max())})
    out.update({"classes_mean": float(classes.mean()), "classes_min": float(classes.min()),
                "classes_max": float(classes.max())})
    if groups is not None:  # a testbed's known clusters: how many, and their sizes in devices
        members = np.bincount(groups)
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
