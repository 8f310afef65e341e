"""The decoded-array cache under ``DATA_DIR/.lcfed-cache/``: each entry a folder of ``.npy`` arrays
(memory-mapped when read back) and a ``stamp.json`` that says what they were decoded from.

Writing is best effort (a read-only data dir just means no cache) and atomic file by file, the stamp
last, so a reader never pairs a stamp with other arrays; processes, even on other nodes, may fill one
entry at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lcfed.data.dataset import DataError, _stamp


def digest(text: str) -> str:
    """A short stable name for ``text`` (e.g. a source's absolute path) in a cache folder's name."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def file_stamp(path: Path) -> list[list[object]]:
    """(name, size, mtime) of the file, or of every file under the folder."""
    if path.is_dir():
        return _stamp(path) or []
    st = path.stat()
    return [[path.name, st.st_size, st.st_mtime_ns]]


def write_arrays(cache: Path, arrays: Mapping[str, np.ndarray], stamp: Any) -> None:
    """Save ``arrays`` (file name -> array) under ``cache``, then ``stamp`` (JSON) as ``stamp.json``."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "stamp.json").unlink(missing_ok=True)
        for fname, arr in arrays.items():
            tmp = cache / f"{fname}.{uuid.uuid4().hex}.tmp"
            with tmp.open("wb") as f:
                np.save(f, arr)
            os.replace(tmp, cache / fname)
        tmp = cache / f"stamp.json.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, cache / "stamp.json")
    except OSError:
        pass


def size_and_mtime(path: str) -> tuple[int, int]:
    """The file's size and modification time (ns)."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


#: blocks of the file that :func:`file_version` hashes: a copy of another version on another node (a cache
#: rewritten there, an rsync that kept the mtime) differs in them, and 1 MiB is read whatever the file's size
_HASH_BLOCKS, _HASH_BLOCK = 16, 64 * 1024


def file_version(path: str) -> tuple[int, int, str]:
    """Which version of the file a reader is about to read: its size, mtime (ns) and a hash of its header and
    :data:`_HASH_BLOCKS` blocks spread over it (the whole file when small). Raises OSError where it is unreadable."""
    size, mtime = size_and_mtime(path)
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        if size <= _HASH_BLOCKS * _HASH_BLOCK * 2:
            h.update(f.read())
        else:
            for i in range(_HASH_BLOCKS + 1):
                f.seek(i * (size - _HASH_BLOCK) // _HASH_BLOCKS)
                h.update(f.read(_HASH_BLOCK))
    return size, mtime, h.hexdigest()


def read_rows(path: str, version: tuple[int, int, str], rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (sorted) of the ``.npy`` array at ``path``, which must still be the version ``version``
    (:func:`file_version`) that its reader was given: only those rows' pages are read."""
    check_version(path, version)
    return np.ascontiguousarray(np.load(path, mmap_mode="r")[rows])


def check_version(path: str, version: tuple[int, int, str]) -> None:
    """:class:`DataError` unless ``path`` is here, as the version ``version``."""
    try:
        now = file_version(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot be read here ({exc.strerror}): a node reading its devices' samples "
                        "needs the data dir at the same path as the driver (shared storage), or set "
                        "engine.data_reads=driver (auto: decided per node)") from None
    if now != tuple(version):
        raise DataError(f"{path}: changed since the run read it (size, mtime and hash {now}, not {tuple(version)}): "
                        "another process rewrote the cache, or this node sees another copy; run again")
