"""A dataset plugin: a loader (data_dir, download) -> lcfed.data.Dataset, here from ``<data_dir>/example.npz``
with ``x`` (images, N x H x W or N x C x H x W, uint8) and ``y`` (labels 0..K-1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lcfed.data import DataError, Dataset


def load_npz(data_dir: Path, download: bool = False) -> Dataset:
    path = Path(data_dir) / "example.npz"
    if not path.is_file():
        raise DataError(f"{path}: no such file (write one with numpy.savez(path, x=images, y=labels))")
    with np.load(path) as f:
        x, y = np.asarray(f["x"], dtype=np.uint8), np.asarray(f["y"], dtype=np.int64)
    if x.ndim == 3:
        x = x[:, None]  # one channel
    return Dataset("npz", np.ascontiguousarray(x), y, int(y.max()) + 1)
