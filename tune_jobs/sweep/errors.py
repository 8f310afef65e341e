"""How a sweep ends other than with a best trial, and how a trial's error reads in one line.

Light on purpose (no Ray, no MLflow): ``lcfed``'s error handling imports it before any command runs.
"""

from __future__ import annotations

import re
from typing import Any

from lcfed.stop import Stopped


class SweepFailed(RuntimeError):
    """No trial of the sweep produced the metric; the message says how many failed and why."""


class SweepInterrupted(Stopped):
    """A signal (SIGTERM, SIGHUP, SIGINT) stopped the sweep; Tune saved its state for ``--resume``."""

    def __init__(self, reason: str, message: str) -> None:
        KeyboardInterrupt.__init__(self, message)
        self.reason, self.next_round, self.checkpointed = reason, 0, True

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, str(self)))


def error_line(text: str) -> str:
    """A trial's exception as ``module.Error: message``: the last line of ``text`` (a traceback) that names
    one, else its last line."""
    lines = [ln.strip() for ln in text.splitlines()]
    named = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)(\(\w+\))?: ", ln)]
    return named[-1] if named else (text.strip().splitlines() or ["trial failed"])[-1]
