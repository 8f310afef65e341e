"""Logging helpers shared by the library and the ``lcfed`` command.

A module of its own, importing only the standard library, so the job commands (``lcfed job ...``,
which load neither torch nor MLflow) and the tracking package use the same helper.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_logger(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """Logger ``name`` shows only records at ``level`` and above for the block, then its level is put back:
    for a library's chatter (notices, progress per file) where its real failures still raise."""
    log = logging.getLogger(name)
    previous = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(previous)
