"""LEAF's JSON files (Caldas et al., 2018: FEMNIST, Synthetic, ...) -> one ``.npz`` with device ids.

A LEAF file is ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``;
a dataset is several such files (LEAF's ``data/train/*.json`` and ``data/test/*.json``: the same users
in both). The import merges them into the arrays ``data.dataset: file`` reads: ``x`` (FEMNIST's 784
floats in [0, 1] per sample become uint8 1x28x28 images; other lengths stay float32 feature vectors,
or images of a given ``shape``), ``y``, ``device`` (each sample's user, numbered in sorted order of the
names) and ``users`` (the names), so ``data.partition: natural`` makes one device per user.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lcfed.data.dataset import DataError

__all__ = ["FEMNIST_SHAPE", "LeafImport", "import_leaf", "read_leaf"]

FEMNIST_SHAPE = (1, 28, 28)
"""What 784 values per sample are taken as, unless a shape is given: FEMNIST's 28x28 grey images."""


@dataclass(frozen=True)
class LeafImport:
    """What an import wrote: the file, its sample and user counts, one sample's shape and the class count."""

    path: Path
    samples: int
    users: int
    shape: tuple[int, ...]
    num_classes: int
    images: bool


def _files(sources: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for src in sources:
        p = Path(src).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.glob("*.json") if f.is_file())
            if not found:
                raise DataError(f"{p}: no .json files (LEAF writes data/train/*.json and data/test/*.json)")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise DataError(f"{p}: no such file or directory")
    if not out:
        raise DataError("no LEAF JSON files given")
    return out


def _read_one(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise DataError(f"{path}: not a readable JSON file ({exc})") from None
    missing = [k for k in ("users", "user_data") if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise DataError(f"{path}: no {' or '.join(repr(k) for k in missing)}; a LEAF file holds users, num_samples "
                        "and user_data {user: {x, y}}")
    if not isinstance(doc["users"], list) or not isinstance(doc["user_data"], dict):
        raise DataError(f"{path}: users must be a list and user_data a mapping of user -> {{x, y}}")
    return doc


def read_leaf(sources: Sequence[str | Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``(x (N, F) float32, y (N,) int64, device (N,) int64, user names)`` of LEAF JSON files (or folders
    of them), checked: every user's x and y of equal length and as ``num_samples`` says, every sample of
    the same length F, labels whole numbers >= 0. Samples in file order, then user order."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    names: list[str] = []
    width: int | None = None
    first: Path | None = None
    for path in _files(sources):
        doc = _read_one(path)
        counts = doc.get("num_samples")
        if counts is not None and (not isinstance(counts, list) or len(counts) != len(doc["users"])):
            raise DataError(f"{path}: num_samples must list one count per user ({len(doc['users'])} users)")
        for i, user in enumerate(doc["users"]):
            data = doc["user_data"].get(user)
            if not isinstance(data, dict) or "x" not in data or "y" not in data:
                raise DataError(f"{path}: user {user!r} has no user_data with x and y")
            x_list, y_list = data["x"], data["y"]
            if not isinstance(x_list, list) or not isinstance(y_list, list) or len(x_list) != len(y_list):
                raise DataError(f"{path}: user {user!r} has {len(x_list)} x but {len(y_list)} y: one label per sample")
            if counts is not None and counts[i] != len(y_list):
                raise DataError(f"{path}: user {user!r} has {len(y_list)} samples, but num_samples says {counts[i]}")
            if not y_list:
                continue
            try:
                x = np.asarray(x_list, dtype=np.float32)
            except (ValueError, TypeError):
                raise DataError(f"{path}: user {user!r}'s x is not a list of equal-length lists of numbers (LEAF "
                                "datasets of text or image file names are not supported: vectors only)") from None
            if x.ndim != 2:
                raise DataError(f"{path}: user {user!r}'s x has shape {x.shape}; each sample must be a list of numbers")
            if width is None:
                width, first = x.shape[1], path
            elif x.shape[1] != width:
                raise DataError(f"{path}: user {user!r}'s samples hold {x.shape[1]} values, but those in {first} "
                                f"hold {width}: every sample must have the same length")
            if not np.isfinite(x).all():
                raise DataError(f"{path}: user {user!r}'s x holds values that are not finite")
            y = np.asarray(y_list)
            if not (np.issubdtype(y.dtype, np.integer) or (np.issubdtype(y.dtype, np.floating)
                                                           and bool((y == np.round(y)).all()))) or y.ndim != 1:
                raise DataError(f"{path}: user {user!r}'s y must be class indices (whole numbers)")
            if (y < 0).any():
                raise DataError(f"{path}: user {user!r} has label {int(y.min())}; labels must be 0..C-1")
            xs.append(x)
            ys.append(y.astype(np.int64))
            names += [str(user)] * len(y)
    if not xs:
        raise DataError(f"{', '.join(str(s) for s in sources)}: the LEAF files hold no samples")
    users, device = np.unique(np.asarray(names), return_inverse=True)
    return np.concatenate(xs), np.concatenate(ys), device.astype(np.int64), [str(u) for u in users]


def import_leaf(sources: Sequence[str | Path], out: str | Path, shape: Sequence[int] | None = None) -> LeafImport:
    """Merge LEAF JSON files (or folders of them) into the ``.npz`` at ``out`` (replaced atomically).

    Samples of 784 values are FEMNIST's 28x28 images in [0, 1] and become uint8 (1, 28, 28) images
    (round(255 x)); ``shape`` (C, H, W) says the same for other lengths; any other sample stays a
    float32 feature vector. Raises :class:`DataError` naming the file and the problem.
    """
    x, y, device, users = read_leaf(sources)
    width = x.shape[1]
    image_shape = tuple(int(s) for s in shape) if shape else (FEMNIST_SHAPE if width == math.prod(FEMNIST_SHAPE) else None)
    if image_shape is not None:
        if len(image_shape) != 3 or math.prod(image_shape) != width:
            raise DataError(f"shape {list(image_shape)} does not hold the {width} values of each sample (C, H, W "
                            "with C x H x W = the sample's length)")
        if x.min() < 0 or x.max() > 1:
            raise DataError(f"pixel values must lie in [0, 1] to become images (found {x.min():g} to {x.max():g}); "
                            "import them as feature vectors (no --shape) instead")
        arr: np.ndarray = np.round(x * 255.0).astype(np.uint8).reshape(len(x), *image_shape)
    else:
        arr = x
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, x=arr, y=y, device=device, users=np.asarray(users))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return LeafImport(out, len(y), len(users), tuple(arr.shape[1:]), int(y.max()) + 1, image_shape is not None)
