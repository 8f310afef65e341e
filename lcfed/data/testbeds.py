"""Testbeds with known clusters, on top of any dataset: devices fall into ``k`` groups and each group
sees the data through its own transformation, so a clustered method has a right answer to recover.

- ``rotated``: group g's images are turned by g quarter turns (0, 90, 180, 270 degrees,
  counter-clockwise), IFCA's rotated MNIST (Ghosh et al., NeurIPS 2020, section 6); k <= 4.
- ``label_permuted``: group 0 keeps the labels, group g > 0 relabels class c as ``perm_g[c]`` with a
  seeded permutation of its own (all k distinct), as CFL's label swaps (Sattler et al., 2020); any
  dataset, images or features; k <= C!.
- ``feature_shift``: group g's images pass through :data:`FEATURE_SHIFTS` [g]: unchanged, colour
  inversion, halved contrast, additive Gaussian noise; k <= 4.

Which devices and samples form each group is :func:`lcfed.data.schemes.group_layout` (seeded, a
function of the sizes alone); the partition scheme then splits each group's samples over its devices,
and the partition carries each device's group as its ground truth. The transformation is applied to
the dataset once, before the partition and the input standardization, so both see what devices see.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from lcfed.data.dataset import Dataset
from lcfed.data.schemes import PartitionError, group_layout

__all__ = ["FEATURE_SHIFTS", "MAX_GROUPS", "TESTBEDS", "apply_testbed", "label_permutations", "rotate", "shift"]

TESTBEDS = ("none", "rotated", "label_permuted", "feature_shift")
"""``data.testbed``: ``none`` = no known clusters (the partition scheme alone)."""

#: noise of the ``noise`` shift: standard deviation in pixel levels (0-255)
NOISE_STD = 32.0

FEATURE_SHIFTS = ("identity", "invert", "contrast", "noise")
"""``feature_shift``'s transformation of group g: ``identity`` (x), ``invert`` (255 - x), ``contrast``
((x - 128) // 2 + 128: half the contrast around mid-grey), ``noise`` (x + N(0, 32^2) per pixel, rounded
and clipped to 0-255, seeded)."""

MAX_GROUPS = {"rotated": 4, "feature_shift": len(FEATURE_SHIFTS)}
"""The most groups a testbed has distinct transformations for (``label_permuted``: C!)."""

#: the testbed transformations' stream (with the seed): label permutations and noise
_STREAM = 0x7E58


def rotate(x: np.ndarray, quarter_turns: int) -> np.ndarray:
    """Images (N, C, H, W) turned counter-clockwise by ``quarter_turns`` x 90 degrees (exact: pixels move)."""
    return np.ascontiguousarray(np.rot90(x, k=quarter_turns, axes=(2, 3)))


def shift(x: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Images (N, C, H, W) uint8 under the feature shift ``kind`` (one of :data:`FEATURE_SHIFTS`)."""
    if kind == "identity":
        return x.copy()
    if kind == "invert":
        return 255 - x
    if kind == "contrast":
        return ((x.astype(np.int16) - 128) // 2 + 128).astype(np.uint8)
    if kind == "noise":
        noisy = x.astype(np.float64) + rng.normal(0.0, NOISE_STD, size=x.shape)
        return np.clip(np.round(noisy), 0, 255).astype(np.uint8)
    raise ValueError(f"unknown feature shift {kind!r}; known: {', '.join(FEATURE_SHIFTS)}")


def label_permutations(num_classes: int, groups: int, seed: int) -> np.ndarray:
    """(groups, C) int64: row 0 the identity, every other row a seeded random permutation of 0..C-1,
    all rows distinct."""
    if groups > math.factorial(min(num_classes, 20)):
        raise ValueError(f"{num_classes} classes have only {math.factorial(num_classes)} permutations, "
                         f"fewer than {groups} groups")
    rng = np.random.default_rng([seed, _STREAM, 1])
    perms = [np.arange(num_classes, dtype=np.int64)]
    seen = {tuple(perms[0].tolist())}
    while len(perms) < groups:
        p = rng.permutation(num_classes).astype(np.int64)
        if tuple(p.tolist()) not in seen:
            seen.add(tuple(p.tolist()))
            perms.append(p)
    return np.stack(perms)


def apply_testbed(ds: Dataset, kind: str, groups: int, num_devices: int, seed: int) -> Dataset:
    """``ds`` as the devices of testbed ``kind`` see it: each sample transformed by its group's
    transformation (:func:`lcfed.data.schemes.group_layout` says which group each sample is in).
    ``none`` returns ``ds`` itself. A dataset the testbed cannot transform is a :class:`PartitionError`
    naming ``testbed`` or ``testbed_groups``."""
    if kind == "none":
        return ds
    if kind not in TESTBEDS:
        raise ValueError(f"unknown testbed {kind!r}; known: {', '.join(TESTBEDS)}")
    limit = MAX_GROUPS.get(kind)
    if limit is not None and groups > limit:
        raise PartitionError("testbed_groups", f"the {kind} testbed has {limit} distinct transformations, "
                             f"so at most {limit} groups")
    if kind != "label_permuted" and not ds.is_image:
        raise PartitionError("testbed", f"the {kind} testbed transforms images, and {ds.name} holds feature vectors "
                             f"{ds.input_shape}; label_permuted works on any dataset")
    if kind == "rotated" and groups > 1 and ds.x.shape[2] != ds.x.shape[3]:
        raise PartitionError("testbed", f"quarter turns need square images, and {ds.name}'s are "
                             f"{ds.x.shape[2]}x{ds.x.shape[3]} (set data.image_size for a file dataset)")
    try:
        _, sample_group = group_layout(len(ds.y), num_devices, groups, seed)
    except ValueError as exc:
        raise PartitionError("testbed_groups", str(exc)) from None
    members = [np.flatnonzero(sample_group == g) for g in range(groups)]
    if kind == "label_permuted":
        try:
            perms = label_permutations(ds.num_classes, groups, seed)
        except ValueError as exc:
            raise PartitionError("testbed_groups", f"{ds.name}: {exc}") from None
        y = ds.y.copy()
        for g, rows in enumerate(members):
            y[rows] = perms[g][ds.y[rows]]
        # the same inputs: still the file's rows, which Ray hosts may read themselves
        return Dataset(ds.name, ds.x, y, ds.num_classes, ds.device_ids, x_file=ds.x_file, x_rows=ds.x_rows,
                       x_version=ds.x_version)
    x = np.array(ds.x, copy=True)
    transform: Callable[[np.ndarray, int], np.ndarray]
    if kind == "rotated":
        def transform(block: np.ndarray, g: int) -> np.ndarray:
            return rotate(block, g)
    else:
        def transform(block: np.ndarray, g: int) -> np.ndarray:
            return shift(block, FEATURE_SHIFTS[g], np.random.default_rng([seed, _STREAM, 2, g]))
    for g, rows in enumerate(members):
        if len(rows):
            x[rows] = transform(x[rows], g)
    return Dataset(ds.name, x, ds.y.copy(), ds.num_classes, ds.device_ids)
