"""Datasets from the user's own files: ``data.dataset: file`` with ``data.path`` naming one of

- an ``.npz`` archive: ``x`` (uint8 images (N, H, W) or (N, C, H, W), or feature vectors (N, F) of any
  number type), ``y`` (N,) labels, optionally per-sample device ids under ``data.device_column``
  (default ``device``) and a scalar ``num_classes``;
- an ImageFolder directory (torchvision's layout): one subfolder per class, images in it (read with PIL;
  grey if every image is, else RGB);
- a table, ``.csv`` or ``.parquet`` (parquet needs pyarrow): a label column (``data.label_column``,
  default ``label``), an optional device column (``data.device_column``), every other column a numeric
  feature.

``data.group_column`` (default ``""``: none) names the samples' true groups, when the user knows them: a
table's column or an ``.npz``'s (N,) array of group ids (integers, or names; numbered 0..G-1 in sorted order
of the ids), not a feature. Each device's group is then the most common group among its samples (a
``natural`` partition's users: all of a user's samples, which should share one group; the other partitions:
the device's training samples; ties go to the smallest id), and the clustering metrics score against these
groups (``ari`` and ``nmi``, as for a testbed) instead of the label-skew proxy. An ImageFolder has no groups.

A relative ``data.path`` lies under ``data.data_dir`` (where the built-in datasets' files are). Each file
is checked before anything is built, and a bad one is a :class:`DataError` naming the file and the
problem. ``data.image_size: [H, W]`` resizes images (PIL, bilinear); without it an ImageFolder's images
must share one size. As for the torchvision datasets, the decoded arrays are cached under
``DATA_DIR/.lcfed-cache/`` (:mod:`lcfed.data.cache`) and memory-mapped afterwards, keyed by the source
files' names, sizes and mtimes (and the options that read them).
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lcfed.data.cache import digest, file_stamp, write_arrays
from lcfed.data.dataset import CACHE_DIR, DataError, Dataset
from lcfed.data.file_columns import MAX_CLASSES, check_device_ids, check_group_ids, check_labels

__all__ = ["FILE_FORMATS", "IMAGE_EXTENSIONS", "MAX_CLASSES", "FileSource", "load_file"]


FILE_FORMATS = ("auto", "npz", "imagefolder", "csv", "parquet")
"""``data.format``: how ``data.path`` is read; ``auto`` = by its extension (a directory: ImageFolder)."""


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
"""The files an ImageFolder's class folders are read for (torchvision's list, plus GIF); others are skipped."""


_SUFFIXES = {".npz": "npz", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


_GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # PIL modes that are one channel (LA: gray + alpha)


@dataclass(frozen=True)
class FileSource:
    """Where a ``file`` dataset is and how to read it (the ``data.`` fields of the same names)."""

    path: str
    format: str = "auto"
    label_column: str = "label"
    device_column: str = "device"
    image_size: tuple[int, ...] = ()
    group_column: str = ""

    def resolve(self, data_dir: Path) -> Path:
        """The file or folder: ``path`` as given if absolute, else under ``data_dir``."""
        p = Path(self.path).expanduser()
        return p if p.is_absolute() else Path(data_dir).expanduser() / p

    def format_of(self, path: Path) -> str:
        """The format to read ``path`` with: ``format`` unless ``auto``, then by its extension."""
        if self.format != "auto":
            return self.format
        if path.is_dir():
            return "imagefolder"
        fmt = _SUFFIXES.get(path.suffix.lower())
        if fmt is None:
            raise DataError(f"{path}: cannot tell its format from the extension {path.suffix!r} (known: "
                            f"{', '.join(sorted(_SUFFIXES))}, or a directory for an ImageFolder); set data.format "
                            f"to one of {list(FILE_FORMATS[1:])}")
        return fmt


def load_file(source: FileSource, data_dir: Path) -> Dataset:
    """The dataset in ``source``'s file (from the cache when the file is unchanged since it was decoded)."""
    path = source.resolve(data_dir)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory (data.path {source.path!r}; a relative path lies under "
                        f"data.data_dir {data_dir})")
    fmt = source.format_of(path)
    if fmt == "imagefolder" and not path.is_dir():
        raise DataError(f"{path}: an ImageFolder is a directory with one subfolder per class, not a file")
    if fmt != "imagefolder" and path.is_dir():
        raise DataError(f"{path}: is a directory, not a .{fmt} file (a directory is read as an ImageFolder: "
                        "data.format=imagefolder or auto)")
    if fmt == "imagefolder" and source.group_column:
        raise DataError(f"{path}: an ImageFolder has no group column; data.group_column ({source.group_column!r}) "
                        "names a column of a .csv/.parquet table or an array of an .npz: leave it empty")
    options = {"format": fmt, "label_column": source.label_column, "device_column": source.device_column,
               "image_size": list(source.image_size)}
    if source.group_column:  # only when set: caches written before the field existed stay valid
        options["group_column"] = source.group_column
    where = str(path.absolute())
    key = {"path": where, "options": options, "files": file_stamp(path)}
    cache = Path(data_dir).expanduser() / CACHE_DIR / f"file-{path.name}-{digest(where)}"
    hit = _read_cache(cache, key, path.name)
    if hit is not None:
        return hit
    ds = _DECODERS[fmt](path, source)
    key = {**key, "files": file_stamp(path)}
    _write_cache(cache, key, ds)
    return _read_cache(cache, key, path.name) or ds  # the cache's file, which Ray hosts can read themselves


def _npz(path: Path, source: FileSource) -> Dataset:
    if not zipfile.is_zipfile(path):  # np.load would take it for a pickle
        raise DataError(f"{path}: not a readable .npz archive (not a zip file); write one with numpy.savez")
    try:
        with np.load(path, allow_pickle=False) as f:
            keys = list(f.keys())
            missing = [k for k in ("x", "y") if k not in keys]
            if missing:
                raise DataError(f"{path}: no {' or '.join(repr(k) for k in missing)} array (keys: {keys or 'none'}); "
                                "an .npz dataset holds x (inputs) and y (labels), e.g. numpy.savez(path, x=x, y=y)")
            if source.group_column and source.group_column not in keys:
                raise DataError(f"{path}: no {source.group_column!r} array (keys: {keys}), which data.group_column "
                                "names: the samples' group ids, one per sample")
            wanted = ("x", "y", source.device_column, "num_classes", source.group_column)
            arrays = {k: f[k] for k in wanted if k and k in keys}
    except DataError:
        raise
    except ValueError as exc:  # object arrays: lists of unequal rows saved as one array
        raise DataError(f"{path}: an array holds Python objects (rows of unequal length?): {exc}; save "
                        "rectangular number arrays") from None
    except (OSError, EOFError) as exc:  # also zipfile.BadZipFile
        raise DataError(f"{path}: not a readable .npz archive ({exc})") from None
    x = arrays["x"]
    n = len(x) if x.ndim else 0
    if n == 0:
        raise DataError(f"{path}: x holds no samples")
    x = _npz_inputs(path, x)
    if source.image_size:
        if x.ndim != 4:
            raise DataError(f"{path}: data.image_size resizes images, and x holds feature vectors {x.shape}")
        x = _resize(x, source.image_size)
    given = arrays.get("num_classes")
    if given is not None and (given.ndim != 0 or not np.issubdtype(given.dtype, np.integer) or int(given) < 1):
        raise DataError(f"{path}: num_classes must be one positive integer, got {given.dtype} {given.shape}")
    y, num_classes = check_labels(path, "y", arrays["y"], n, None if given is None else int(given))
    ids = arrays.get(source.device_column)
    device = None if ids is None else check_device_ids(path, repr(source.device_column), ids, n)
    groups = check_group_ids(path, f"array {source.group_column!r}", arrays[source.group_column], n) \
        if source.group_column else None
    return Dataset(path.name, x, y, num_classes, device, groups)


def _npz_inputs(path: Path, x: np.ndarray) -> np.ndarray:
    """``x`` as the dataset holds it: uint8 (N, C, H, W) images or float32 (N, F) features."""
    if x.ndim >= 2 and 0 in x.shape[1:]:  # a model would train on nothing and score chance
        raise DataError(f"{path}: x has shape {x.shape}: its samples hold no values")
    if x.ndim == 2:
        return _features(path, "x", x)
    if x.ndim not in (3, 4):
        raise DataError(f"{path}: x has shape {x.shape}; expected images (N, H, W) or (N, C, H, W), or feature "
                        "vectors (N, F)")
    if x.dtype != np.uint8:
        raise DataError(f"{path}: images in x must be uint8 (0-255), got {x.dtype}; convert floats in [0, 1] with "
                        "(x * 255).round().astype(numpy.uint8), or save feature vectors as (N, F)")
    if x.ndim == 3:
        return np.ascontiguousarray(x[:, None])
    if x.shape[-1] in (1, 3, 4) and x.shape[1] > 4:
        raise DataError(f"{path}: x has shape {x.shape}, which looks channels-last (N, H, W, C); save images "
                        "channels-first (N, C, H, W): x.transpose(0, 3, 1, 2)")
    return np.ascontiguousarray(x)


def _resize(x: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """uint8 images (N, C, H, W) resized to ``size`` = (H', W') as an ImageFolder's are (PIL, bilinear),
    each channel on its own."""
    from PIL import Image  # PIL only for images that need it

    h, w = size
    if x.shape[2:] == (h, w):
        return x
    out = np.empty((*x.shape[:2], h, w), dtype=np.uint8)
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            out[i, c] = np.asarray(Image.fromarray(x[i, c]).resize((w, h), Image.Resampling.BILINEAR))
    return out


def _features(path: Path, what: str, x: np.ndarray) -> np.ndarray:
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_) or np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"{path}: {what} must hold numbers, got {x.dtype}")
    out = np.ascontiguousarray(x, dtype=np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(f"{path}: {what} holds {out[row, col]} at sample {row}, feature {col} "
                        f"({int(bad.sum())} values not finite); fill or drop them first")
    return out


def _imagefolder(root: Path, source: FileSource) -> Dataset:
    from PIL import Image, UnidentifiedImageError  # PIL only for ImageFolders

    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders; an ImageFolder holds one subfolder per class with its images "
                        f"(e.g. {root / 'cat' / '001.png'})")
    files: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not found:
            raise DataError(f"{root / name}: class folder holds no images ({', '.join(IMAGE_EXTENSIONS)}); remove it "
                            "or add its images")
        files += [(p, label) for p in found]
    # pass 1: headers only (PIL reads pixels lazily), for the common mode and size
    modes, sizes = [], []
    for p, _ in files:
        try:
            with Image.open(p) as header:
                modes.append(header.mode)
                sizes.append(header.size)
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"{p}: not a readable image ({exc})") from None
    mode = "L" if all(m in _GRAY_MODES for m in modes) else "RGB"
    if source.image_size:
        h, w = source.image_size
    else:
        w, h = sizes[0]  # PIL sizes are (width, height)
        odd = next((i for i, s in enumerate(sizes) if s != (w, h)), None)
        if odd is not None:
            raise DataError(f"{files[odd][0]}: {sizes[odd][0]}x{sizes[odd][1]} pixels, but {files[0][0]} has {w}x{h}: "
                            "the images of one dataset must share a size; set data.image_size: [H, W] to resize "
                            "them all")
    channels = 1 if mode == "L" else 3
    x = np.empty((len(files), channels, h, w), dtype=np.uint8)
    for i, (p, _) in enumerate(files):
        try:
            with Image.open(p) as opened:
                img = opened.convert(mode)
                if img.size != (w, h):
                    img = img.resize((w, h), Image.Resampling.BILINEAR)
                arr = np.asarray(img, dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise DataError(f"{p}: not a readable image ({exc})") from None
        x[i] = arr[None] if channels == 1 else arr.transpose(2, 0, 1)
    y = np.fromiter((label for _, label in files), dtype=np.int64, count=len(files))
    return Dataset(root.name, x, y, len(classes))


def _csv(path: Path, source: FileSource) -> Dataset:
    import pandas as pd  # pandas (0.4 s) only for tables

    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise DataError(f"{path}: not a readable CSV table ({' '.join(str(exc).split())})") from None
    return _table(path, df, source)


def _parquet(path: Path, source: FileSource) -> Dataset:
    if importlib.util.find_spec("pyarrow") is None:
        raise DataError(f"{path}: reading parquet needs pyarrow, which is not installed: `pip install pyarrow` "
                        "(or save the table as .csv)")
    import pandas as pd  # pandas (0.4 s) only for tables

    try:
        df = pd.read_parquet(path, engine="pyarrow")
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable parquet table ({' '.join(str(exc).split())})") from None
    return _table(path, df, source)


def _table(path: Path, df: Any, source: FileSource) -> Dataset:
    """A data frame -> features (every column but the label and device ones), labels, device ids."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype  # (the same)

    columns = [str(c) for c in df.columns]
    if len(set(columns)) != len(columns):
        dup = next(c for c in columns if columns.count(c) > 1)
        raise DataError(f"{path}: column {dup!r} appears twice")
    df.columns = columns
    label, device, group = source.label_column, source.device_column, source.group_column
    if source.image_size:
        raise DataError(f"{path}: data.image_size resizes images, and a table holds feature vectors")
    if label not in columns:
        raise DataError(f"{path}: no label column {label!r} (columns: {', '.join(columns[:20])}"
                        f"{', ...' if len(columns) > 20 else ''}); name it with data.label_column")
    if group and group not in columns:
        raise DataError(f"{path}: no group column {group!r}, which data.group_column names (columns: "
                        f"{', '.join(columns[:20])}{', ...' if len(columns) > 20 else ''})")
    if len(df) == 0:
        raise DataError(f"{path}: the table holds no rows")
    features = [c for c in columns if c not in (label, device, group)]
    if not features:
        raise DataError(f"{path}: no feature columns (only {', '.join(repr(c) for c in columns)})")
    text = [c for c in features if not (is_numeric_dtype(df[c]) or is_bool_dtype(df[c]))]
    if text:
        raise DataError(f"{path}: feature column {text[0]!r} is not numeric ({df[text[0]].dtype}; "
                        f"{len(text)} such columns); every column but data.label_column ({label!r}) and "
                        f"data.device_column ({device!r}){f' and data.group_column ({group!r})' if group else ''} "
                        "must be a number")
    values = df[features].to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise DataError(f"{path}: column {features[col]!r} is empty or not finite at row {row + 2} "
                        f"({int(bad.sum())} such cells); fill or drop them first")
    x = _features(path, "the features", values)
    n = len(df)
    y, num_classes = check_labels(path, f"column {label!r}", df[label].to_numpy(), n, None)
    ids = check_device_ids(path, f"column {device!r}", df[device].to_numpy(), n) if device in columns else None
    groups = check_group_ids(path, f"column {group!r}", df[group].to_numpy(), n) if group else None
    return Dataset(path.name, x, y, num_classes, ids, groups)


_DECODERS = {"npz": _npz, "imagefolder": _imagefolder, "csv": _csv, "parquet": _parquet}


def _read_cache(cache: Path, key: dict[str, Any], name: str) -> Dataset | None:
    try:
        meta = json.loads((cache / "stamp.json").read_text())
        if meta.get("source") != key:
            return None
        x = np.load(cache / "x.npy", mmap_mode="r")
        y = np.load(cache / "y.npy")
        ids = np.load(cache / "device.npy") if meta.get("device") else None
        groups = np.load(cache / "groups.npy") if meta.get("groups") else None
        if bool(key["options"].get("group_column")) != (groups is not None):
            return None
        return Dataset(name, x, y, int(meta["num_classes"]), ids, groups, str(cache / "x.npy"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, DataError):
        return None


def _write_cache(cache: Path, key: dict[str, Any], ds: Dataset) -> None:
    arrays = {"x.npy": ds.x, "y.npy": ds.y}
    if ds.device_ids is not None:
        arrays["device.npy"] = ds.device_ids
    if ds.groups is not None:
        arrays["groups.npy"] = ds.groups
    write_arrays(cache, arrays, {"source": key, "num_classes": ds.num_classes, "device": ds.device_ids is not None,
                                 "groups": ds.groups is not None})
