"""Output paths proven usable before any work: an output file or directory whose nearest existing directory
can really hold files (:func:`cannot_write`), never a path the run reads from.

Why a probe file: ``os.access`` answers from permission bits: root is told yes
inside ``/proc``, and a directory on a read-only or full filesystem, or on a network mount that hangs, looks
writable until the first checkpoint, after the run has trained. Creating and removing a probe file asks the
filesystem itself; doing it in a daemon thread bounds the wait, so a hanging mount is refused in seconds
instead of hanging the command.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from lcfed.errors import require

#: how long a directory may take to create and remove one empty file
PROBE_TIMEOUT_S = 10.0


def check_output_file(path: str | Path | None, flag: str, protect: Iterable[str | Path | None] = ()) -> None:
    """Refuse, before any work, an output file that cannot be written or would overwrite an input:
    a directory, a missing or read-only parent directory, or one of the ``protect``ed files."""
    if path is None:
        return
    p = Path(path).expanduser()
    require(not p.is_dir(), flag, str(path), "is a directory: give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    require(parent.is_dir(), flag, str(path), f"its directory {parent} does not exist")
    problem = cannot_write(parent)
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
    problem = cannot_write(existing)
    require(problem is None, flag, value, f"{what}{existing} {problem}")


def cannot_write(directory: Path, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if ``directory`` holds a new file (created, then removed) within ``timeout_s``; else why not."""
    outcome: list[str | None] = []

    def attempt() -> None:
        probe = directory / f".lcfed-probe-{uuid.uuid4().hex[:12]}"
        try:
            fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.close(fd)
            os.unlink(probe)
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"cannot hold files ({exc.strerror or type(exc).__name__})")

    worker = threading.Thread(target=attempt, name="lcfed-write-probe", daemon=True)  # a hung one is left behind
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return f"did not answer within {timeout_s:g} s (a hanging filesystem?)"
    return outcome[0]
