"""The per-sample columns of a user's file, checked whatever the format (:mod:`lcfed.data.formats` decodes the
formats): the labels (integers 0..C-1, or names numbered in sorted order), the device ids of a natural
partition, and the true groups (``data.group_column``). Each problem is a :class:`~lcfed.errors.DataError`
naming the file, the column and the first offending sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lcfed.data.dataset import DataError

MAX_CLASSES = 100_000
"""Labels are class indices 0..C-1; a larger C is almost surely ids, not classes."""


def check_labels(path: Path, what: str, values: np.ndarray, n: int, num_classes: int | None) -> tuple[np.ndarray, int]:
    """Labels as int64 class indices and the class count. Integers (or whole floats) are the indices
    (C = ``num_classes`` if given, else the largest + 1); text labels are class names, numbered in sorted order."""
    values = np.asarray(values)
    if values.shape != (n,):
        raise DataError(f"{path}: {what} has shape {values.shape}, but there are {n} samples: one label per sample")
    if values.dtype.kind in "OUS":  # names
        if any(v is None or (isinstance(v, float) and v != v) for v in values.tolist()):
            raise DataError(f"{path}: {what} has missing labels")
        names, y = np.unique(values.astype(str), return_inverse=True)
        return y.astype(np.int64), len(names)
    if values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.number):
        raise DataError(f"{path}: {what} must hold class indices 0..C-1 or class names, got {values.dtype}")
    if np.issubdtype(values.dtype, np.floating):
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise DataError(f"{path}: {what} holds {values[i]} at sample {i}; labels must be class indices 0..C-1 "
                            "(whole numbers) or class names")
    y = values.astype(np.int64)
    low, high = int(y.min()), int(y.max())
    limit = num_classes if num_classes is not None else MAX_CLASSES
    if low < 0 or high >= limit:
        i = int(np.argmin(y)) if low < 0 else int(np.argmax(y))
        where = f"num_classes {num_classes} in the file" if num_classes is not None else f"at most {MAX_CLASSES} classes"
        raise DataError(f"{path}: label {y[i]} at sample {i} is out of range; labels must be 0..C-1 ({where})")
    return y, num_classes if num_classes is not None else high + 1


def check_device_ids(path: Path, what: str, values: np.ndarray, n: int) -> np.ndarray:
    """Per-sample device (user) ids, any integers or names, as int64 codes 0..U-1 in sorted order of the ids."""
    values = np.asarray(values)
    if values.shape != (n,):
        raise DataError(f"{path}: device ids ({what}) have shape {values.shape}, but there are {n} samples: "
                        "one id per sample")
    if values.dtype.kind in "OUS":
        if any(v is None or (isinstance(v, float) and v != v) for v in values.tolist()):
            raise DataError(f"{path}: device ids ({what}) are missing for some samples")
        values = values.astype(str)
    elif np.issubdtype(values.dtype, np.floating):
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise DataError(f"{path}: device id {values[i]} at sample {i} ({what}): ids must be integers or names")
    elif not np.issubdtype(values.dtype, np.integer):
        raise DataError(f"{path}: device ids ({what}) must be integers or names, got {values.dtype}")
    _, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64).reshape(n)


def check_group_ids(path: Path, what: str, values: np.ndarray, n: int) -> np.ndarray:
    """Per-sample true group ids (``data.group_column``: integers or names, none missing) as int64 codes
    0..G-1 in sorted order of the ids."""
    def bad(problem: str) -> DataError:
        return DataError(f"{path}: data.group_column ({what}) {problem}; it must hold one group id per sample: "
                         "integers or names, none missing")

    values = np.asarray(values)
    if values.shape != (n,):
        raise bad(f"has shape {values.shape}, but there are {n} samples")
    if values.dtype.kind in "OUS":  # names (or a nullable column's Python ints)
        items = values.tolist()
        for i, v in enumerate(items):
            if v is None or type(v).__name__ == "NAType" or (isinstance(v, float) and v != v):  # NAType: pandas.NA
                raise bad(f"is missing (empty or NaN) at sample {i}")
        if all(isinstance(v, str) for v in items):
            values = values.astype(str)
        elif all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in items):
            values = values.astype(np.int64)
        else:
            i = next(i for i, v in enumerate(items) if not isinstance(v, str))
            raise bad(f"holds {items[i]!r} at sample {i}, among names")
    elif values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.number) \
            or np.issubdtype(values.dtype, np.complexfloating):
        raise bad(f"holds {values.dtype} values")
    elif np.issubdtype(values.dtype, np.floating):
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            problem = "is missing (empty or NaN)" if np.isnan(values[i]) else f"holds {values[i]}, not an integer,"
            raise bad(f"{problem} at sample {i} ({int((~whole).sum())} such samples)")
    _, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64).reshape(n)
