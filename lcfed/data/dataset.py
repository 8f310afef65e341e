"""One dataset's samples as arrays (:class:`Dataset`), the error its files raise, and the cache's stamp:
the leaf that the built-in sources and the file formats both build on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lcfed.errors import DataError

__all__ = ["CACHE_DIR", "DataError", "Dataset"]

#: folder under the data dir that holds the decoded arrays
CACHE_DIR = ".lcfed-cache"


@dataclass(frozen=True, eq=False)  # eq=False: elementwise array comparison has no truth value
class Dataset:
    """All samples of one dataset: inputs ``x``, labels ``y`` (N,) int64 and the class count.

    ``x`` is either images, uint8 (N, C, H, W), or feature vectors, float32 (N, F) (tables: CSV,
    parquet, an ``.npz`` of vectors). ``device_ids`` (N,) int64, when the source has them, is the
    device (user, writer, client) each sample came from: what ``data.partition: natural`` splits by.
    ``groups`` (N,) int64, when the source knows them (a generator, or a file's ``data.group_column``), is
    each sample's true cluster: the partition's ground truth (a device's group is its samples' most common).
    ``x_file``, when ``x`` was read from an ``.npy`` file (the decoded-array cache), is that file, and ``x_rows``
    the file's rows ``x`` holds (None: all of them), and ``x_version`` the file's version when it was read
    (:func:`lcfed.data.cache.file_version`): a Ray host whose node sees that version reads its own devices' rows
    there instead of being sent them.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    device_ids: np.ndarray | None = None
    groups: np.ndarray | None = None
    x_file: str | None = None
    x_rows: np.ndarray | None = None
    x_version: tuple[int, int, str] | None = None

    def __post_init__(self) -> None:
        if not ((self.x.ndim == 4 and self.x.dtype == np.uint8) or (self.x.ndim == 2 and self.x.dtype == np.float32)):
            raise ValueError(f"{self.name}: x must be uint8 images (N, C, H, W) or float32 features (N, F), "
                             f"got {self.x.dtype} {self.x.shape}")
        if self.y.shape != (len(self.x),) or self.y.dtype != np.int64:
            raise ValueError(f"{self.name}: y must be int64 ({len(self.x)},), got {self.y.dtype} {self.y.shape}")
        if self.device_ids is not None and (self.device_ids.shape != (len(self.x),) or self.device_ids.dtype != np.int64):
            raise ValueError(f"{self.name}: device_ids must be int64 ({len(self.x)},), "
                             f"got {self.device_ids.dtype} {self.device_ids.shape}")
        if self.groups is not None and (self.groups.shape != (len(self.x),) or self.groups.dtype != np.int64):
            raise ValueError(f"{self.name}: groups must be int64 ({len(self.x)},), "
                             f"got {self.groups.dtype} {self.groups.shape}")
        if self.x_rows is not None and (self.x_rows.shape != (len(self.x),) or self.x_rows.dtype != np.int64):
            raise ValueError(f"{self.name}: x_rows must be int64 ({len(self.x)},), "
                             f"got {self.x_rows.dtype} {self.x_rows.shape}")
        if len(self.y) and (int(self.y.min()) < 0 or int(self.y.max()) >= self.num_classes):
            bad = int(self.y.min()) if int(self.y.min()) < 0 else int(self.y.max())
            raise DataError(f"{self.name}: label {bad} in the files; labels must be 0-{self.num_classes - 1} "
                            "(corrupt files: import them again with `lcfed data import`)")

    @property
    def is_image(self) -> bool:
        """Images (N, C, H, W) rather than feature vectors (N, F)."""
        return self.x.ndim == 4

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample, (C, H, W) or (F,), as the model builder needs it."""
        return tuple(int(s) for s in self.x.shape[1:])

    def take(self, rows: np.ndarray) -> Dataset:
        """The samples ``rows`` (their device ids and groups too), as a new dataset of the same name and classes."""
        ids = None if self.device_ids is None else np.ascontiguousarray(self.device_ids[rows])
        groups = None if self.groups is None else np.ascontiguousarray(self.groups[rows])
        file_rows = None if self.x_file is None else np.asarray(rows if self.x_rows is None else self.x_rows[rows])
        return Dataset(self.name, self.x[rows], self.y[rows], self.num_classes, ids, groups, self.x_file, file_rows,
                       self.x_version)


def _stamp(folder: Path) -> list[list[object]] | None:
    """(relative path, size, mtime) of every file under ``folder``; None if it does not exist."""
    if not folder.is_dir():
        return None
    out: list[list[object]] = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            st = path.stat()
            out.append([str(path.relative_to(folder)), st.st_size, st.st_mtime_ns])
    return out
