"""Whether a directory can really hold files: create and remove a probe file, within a time bound.

``os.access`` answers from permission bits: root is told yes inside ``/proc``, and a directory on a
read-only or full filesystem, or on a network mount that hangs, looks writable until the first
checkpoint, after the run has trained. Writing a probe file asks the filesystem itself; doing it in a
daemon thread bounds the wait, so a hanging mount is refused in seconds instead of hanging the command.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

#: how long a directory may take to create and remove one empty file
PROBE_TIMEOUT_S = 10.0


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
