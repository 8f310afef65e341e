"""Placing local MNIST / Fashion-MNIST IDX files where torchvision looks for them.

Machines without internet cannot use torchvision's downloads; this copies IDX files from known
local places (a Debian package, a mirror's tree, any directory) into ``DATA_DIR/MNIST/raw/`` or
``DATA_DIR/FashionMNIST/raw/`` under the uncompressed names torchvision's ``_check_exists`` wants.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lcfed.data.dataset import DataError

__all__ = ["DEFAULT_IDX_DIRS", "IDX_DIRS_ENV", "IDX_FILES", "RAW_DIRS", "import_idx"]

IDX_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
"""The names torchvision's MNIST/FashionMNIST expect in their ``raw`` folder (uncompressed)."""

RAW_DIRS: dict[str, str] = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}
"""Dataset name -> torchvision's folder under the data dir (the class name)."""

DEFAULT_IDX_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets/fashion-mnist"),)
"""Searched after the given sources: Debian's ``dataset-fashion-mnist`` (gzipped files)."""

IDX_DIRS_ENV = "LCFED_IDX_DIRS"
"""Environment variable with more directories to search (``os.pathsep``-separated)."""

_MAGIC = {"images": 2051, "labels": 2049}  # IDX: unsigned byte data, 3 resp. 1 dimensions
_CHUNK = 1 << 20
_NUM_CLASSES = 10  # MNIST and Fashion-MNIST

_HINTS = (
    "Fashion-MNIST: `apt-get install dataset-fashion-mnist` (installs /usr/share/datasets/fashion-mnist). "
    "MNIST: `../shared/data/get-mnist.sh DIR` then `lcfed data import --from DIR`. "
    f"More directories can be listed in ${IDX_DIRS_ENV}."
)


@dataclass(frozen=True)
class _Found:
    """A directory holding a complete set of one dataset's four IDX files."""

    kind: str
    directory: Path
    files: dict[str, Path]  # torchvision name -> source file


def _variants(name: str) -> list[str]:
    """Accepted spellings of ``name``: dash or dot before ``idxN``, optionally gzipped."""
    prefix, _, suffix = name.rpartition("-idx")
    names = [name, f"{prefix}.idx{suffix}"]
    return names + [n + ".gz" for n in names]


def _find(directory: Path) -> tuple[dict[str, Path], list[str]]:
    """The IDX files present in ``directory`` and the names of those missing."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in IDX_FILES:
        hit = next((directory / v for v in _variants(name) if (directory / v).is_file()), None)
        if hit is None:
            missing.append(name)
        else:
            found[name] = hit
    return found, missing


def _kind_of(directory: Path) -> str:
    return "fashion_mnist" if "fashion" in str(directory).lower() else "mnist"


def _copy_idx(src: Path, out: BinaryIO, what: str) -> int:
    """Copy ``src`` (maybe gzipped) uncompressed into ``out``, checking it; returns its item count."""
    header_len = 16 if what == "images" else 8
    opener = gzip.open if src.name.endswith(".gz") else open
    try:
        with opener(src, "rb") as f:
            header = f.read(header_len)
            if len(header) < header_len:
                raise DataError(f"{src}: too short for an IDX {what} file")
            magic, count = struct.unpack(">II", header[:8])
            if magic != _MAGIC[what]:
                raise DataError(
                    f"{src}: bad IDX magic number {magic} (expected {_MAGIC[what]} for {what}); "
                    "corrupt or not an MNIST-style file"
                )
            item = 1
            if what == "images":
                rows, cols = struct.unpack(">II", header[8:])
                item = rows * cols
            out.write(header)
            body = 0
            while chunk := f.read(_CHUNK):
                if what == "labels" and chunk and max(chunk) >= _NUM_CLASSES:
                    at = body + next(i for i, b in enumerate(chunk) if b >= _NUM_CLASSES)
                    raise DataError(f"{src}: label {chunk[at - body]} at item {at}; MNIST-style labels are "
                                    f"0-{_NUM_CLASSES - 1} (corrupt or not an MNIST-style file)")
                out.write(chunk)
                body += len(chunk)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{src}: cannot copy ({exc})") from exc
    if body != count * item:
        raise DataError(f"{src}: header says {count} {what} ({count * item} bytes) but has {body} bytes")
    return count


def _place(found: _Found, data_dir: Path) -> Path:
    """Validate and copy one dataset's files into its raw folder, replacing old ones atomically."""
    dest = data_dir / RAW_DIRS[found.kind] / "raw"
    created = [d for d in (dest, *dest.parents) if not d.exists()]
    dest.mkdir(parents=True, exist_ok=True)
    tmps: dict[str, Path] = {}
    try:
        counts: dict[str, int] = {}
        for name, src in found.files.items():
            fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=f".{name}.", suffix=".tmp")
            tmps[name] = Path(tmp_name)
            with os.fdopen(fd, "wb") as out:
                counts[name] = _copy_idx(src, out, "images" if "-images-" in name else "labels")
        for split in ("train", "t10k"):
            n_img, n_lab = counts[f"{split}-images-idx3-ubyte"], counts[f"{split}-labels-idx1-ubyte"]
            if n_img == 0:
                raise DataError(f"{found.files[f'{split}-images-idx3-ubyte']}: holds no images (an empty IDX set)")
            if n_img != n_lab:
                raise DataError(
                    f"{found.files[f'{split}-images-idx3-ubyte']}: {n_img} images but "
                    f"{found.files[f'{split}-labels-idx1-ubyte']} has {n_lab} labels"
                )
        # Only once all four are valid: a failed import never leaves a mixed set behind.
        for name, tmp_path in tmps.items():
            os.replace(tmp_path, dest / name)
        tmps.clear()
    finally:
        for leftover in tmps.values():
            leftover.unlink(missing_ok=True)
        if tmps:  # a refused import leaves no directories it made behind
            for d in created:
                with contextlib.suppress(OSError):
                    d.rmdir()
    return dest


def _candidates(sources: Sequence[str | Path | tuple[str, str | Path]]) -> list[tuple[str, Path, bool]]:
    """(kind, directory, given explicitly) in search order: sources, defaults, then the env var."""
    if isinstance(sources, (str, Path)):  # one directory, not a sequence of characters
        sources = [sources]
    out: list[tuple[str, Path, bool]] = []
    for src in sources:
        if isinstance(src, tuple):
            kind, path = src
            if kind not in RAW_DIRS:
                raise DataError(f"unknown IDX dataset kind {kind!r} for {path}; known: {', '.join(RAW_DIRS)}")
            out.append((kind, Path(path).expanduser(), True))
        else:
            path = Path(src).expanduser()
            out.append((_kind_of(path), path, True))
    extra = [Path(p) for p in os.environ.get(IDX_DIRS_ENV, "").split(os.pathsep) if p]
    out += [(_kind_of(p), p, False) for p in (*DEFAULT_IDX_DIRS, *extra)]
    return out


def import_idx(
    data_dir: str | Path, sources: Sequence[str | Path | tuple[str, str | Path]] = ()
) -> list[tuple[str, Path]]:
    """Find MNIST / Fashion-MNIST IDX files and place them under ``data_dir`` for torchvision.

    Searches ``sources`` (directories; a directory counts as Fashion-MNIST if its path contains
    "fashion", else MNIST, or give ``(kind, dir)`` with kind ``"mnist"``/``"fashion_mnist"``), then
    :data:`DEFAULT_IDX_DIRS`, then the directories in ``$LCFED_IDX_DIRS``. The first directory with
    all four files wins per dataset. Files may be gzipped and named with a dash or a dot before
    ``idxN``. Each file is checked (magic number, size; image and label counts agree) before
    anything is replaced. Re-running overwrites. Returns (dataset name, destination dir) per
    imported dataset.

    Raises :class:`DataError` on a bad file, when a given source holds no complete set, or when
    nothing is found anywhere.
    """
    data_dir = Path(data_dir).expanduser()
    plan: list[_Found] = []
    looked: list[str] = []
    for kind, directory, explicit in _candidates(sources):
        found: dict[str, Path] = {}
        if not directory.is_dir():
            problem = "no such directory"
            missing = list(IDX_FILES)
        else:
            found, missing = _find(directory)
            problem = f"missing {', '.join(missing)}"
        if not missing:
            if all(f.kind != kind for f in plan):  # earlier directories take precedence
                plan.append(_Found(kind, directory, found))
            continue
        if explicit:
            raise DataError(f"{directory}: no complete {kind} IDX set ({problem}). {_HINTS}")
        looked.append(f"{directory} ({problem})")
    if not plan:
        raise DataError(
            f"no MNIST / Fashion-MNIST IDX files found; looked in: {'; '.join(looked) or 'nowhere'}. {_HINTS}"
        )
    return [(f.kind, _place(f, data_dir)) for f in plan]
