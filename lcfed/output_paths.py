"""Output paths proven usable before any work: an output file or directory whose nearest existing directory
can really hold files (:mod:`lcfed.probe`), never a path the run reads from."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from lcfed import probe
from lcfed.errors import require


def check_output_file(path: str | Path | None, flag: str, protect: Iterable[str | Path | None] = ()) -> None:
    """Refuse, before any work, an output file that cannot be written or would overwrite an input:
    a directory, a missing or read-only parent directory, or one of the ``protect``ed files."""
    if path is None:
        return
    p = Path(path).expanduser()
    require(not p.is_dir(), flag, str(path), "is a directory: give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    require(parent.is_dir(), flag, str(path), f"its directory {parent} does not exist")
    problem = probe.cannot_write(parent)
    require(problem is None, flag, str(path), f"its directory {parent} {problem}")
    require(not p.exists() or os.access(p, os.W_OK), flag, str(path), "exists and is not writable")
    for other in protect:
        if other is not None and p.exists() and Path(other).expanduser().exists():
            require(not p.samefile(Path(other).expanduser()), flag, str(path),
                    f"is the input file {other}: writing there would overwrite it")


def check_output_dir(path: str | Path | None, flag: str) -> None:
    """Refuse, before any work, a directory path that is a file or lies under an unwritable directory
    (the directory itself may not exist yet: it is made when first written)."""
    if path is None or "://" in str(path):
        return
    p = Path(path).expanduser().absolute()
    require(not p.exists() or p.is_dir(), flag, str(path), "exists and is not a directory")
    check_holds_files(p, flag, str(path))


def check_holds_files(path: Path, flag: str, value: str, what: str = "") -> None:
    """Refuse ``value`` unless the nearest existing directory at or above ``path`` (absolute) is a directory
    that holds files (``what`` names it in the error, e.g. ``"the store's directory "``)."""
    existing = next(d for d in (path, *path.parents) if d.exists())
    require(existing.is_dir(), flag, value, f"{existing} is a file, not a directory")
    problem = probe.cannot_write(existing)
    require(problem is None, flag, value, f"{what}{existing} {problem}")
