"""Stopping a run on a signal: the process's stop request, the handler that sets it and the exception
a stopped run ends with.

The round loop (:func:`lcfed.run.loop.run_rounds`) checks :data:`STOP` after every round and raises
:class:`Stopped` at the boundary, checkpointed; :func:`stop_on_signals` is what sets it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["STOP", "Stopped", "StopRequest", "stop_on_signals"]


class Stopped(KeyboardInterrupt):
    """The run was asked to stop (e.g. SIGTERM) and ended at a round boundary, checkpointed if
    ``checkpoint.dir`` is set. ``reason`` names the request."""

    def __init__(self, reason: str, next_round: int, checkpointed: bool) -> None:
        self.reason, self.next_round, self.checkpointed = reason, next_round, checkpointed
        saved = "; checkpoint written: continue with --resume" if checkpointed else ""
        super().__init__(f"{reason}: stopped after round {next_round - 1}{saved}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.next_round, self.checkpointed))


class StopRequest:
    """Set (e.g. from a signal handler) to end the running loop after its current round."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = reason


#: the process's stop request, checked by the round loop after every round
STOP = StopRequest()

#: what a signal asks of a run: finish the round it is in, then stop
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM / SIGHUP / SIGINT: finish the current round, checkpoint, mark the MLflow run KILLED and
    exit 128 + signal; a second signal stops at once."""

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if STOP.reason is not None:
            raise KeyboardInterrupt(f"{name} again: stopped mid-round")
        STOP.request(name)
        print(f"lcfed: {name}: finishing the current round, then stopping (send it again to stop now)",
              file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        STOP.reason = None
