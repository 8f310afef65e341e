"""Stopping a run on a signal: the handler that sets the process's stop request.

The round loop (:func:`lcfed.loop.run_rounds`) checks :data:`STOP` after every round and raises
:class:`Stopped` at the boundary, checkpointed; :func:`stop_on_signals` is what sets it. The flag and the
exception still live in :mod:`lcfed.loop`, which checks them.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from lcfed.loop import STOP, Stopped, StopRequest

__all__ = ["STOP", "Stopped", "StopRequest", "stop_on_signals"]

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
