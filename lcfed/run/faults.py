"""A run's cluster lost under it: what the engine raises, and the one line that says what happened and
how to go on.

Separate from the round loop because the CLI (exit code, message), the MLflow observer (the failure
reason) and the Ray engine (which notices the loss) all speak of it; no Ray here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ClusterLost(RuntimeError):
    """The cluster under a run is gone (e.g. the raylet or GCS of the private Ray it started died, or the head
    of a cluster it attached to stopped answering: ``actors/liveness.py``): there is nothing left to restart
    lost actors on, so the run stops at once. ``what`` names what was lost;
    the round loop adds the round in progress and the last checkpoint (:meth:`during`), and
    :meth:`describe` says all of it in one line, with the command that continues the run."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.round: int | None = None  # the round in progress (from 0): set by the loop (:meth:`during`)
        self.checkpoint: Path | None = None  # checkpoint.dir's file; None: the run writes no checkpoints
        self.checkpointed = 0  # rounds the last checkpoint holds (0: none written yet)
        super().__init__(self.describe())

    def during(self, rnd: int, checkpointed: int, checkpoint: Path | None) -> ClusterLost:
        """This error with the round it interrupted and the run's last checkpoint; returns itself."""
        self.round, self.checkpointed, self.checkpoint = rnd, checkpointed, checkpoint
        self.args = (self.describe(),)
        return self

    def describe(self, resume_command: str = "") -> str:
        """E.g. ``the Ray cluster under this run was lost in round 5 (the raylet of the private Ray this run
        started, pid 4242, died); the last checkpoint holds rounds 1-4 (runs/x/latest.pt): continue with
        `lcfed run ... --resume``` (rounds counted from 1, as the progress shows them)."""
        if self.round is None:  # lost outside the rounds (starting, ending): the loop did not say more
            return (f"the Ray cluster under this run was lost ({self.what}); run the command again (with --resume "
                    "if checkpoint.dir holds a checkpoint)")
        line = f"the Ray cluster under this run was lost in round {self.round + 1} ({self.what})"
        resume = f"`{resume_command}`" if resume_command else "the same command with --resume"
        if self.checkpoint is None:
            return f"{line}; no checkpoint.dir is set, so the run starts again from round 1 (set one to make it resumable)"
        if not self.checkpointed:
            return f"{line}; no checkpoint was written yet ({self.checkpoint.parent}): {resume} starts it again"
        held = "round 1" if self.checkpointed == 1 else f"rounds 1-{self.checkpointed}"
        return f"{line}; the last checkpoint holds {held} ({self.checkpoint}): continue with {resume}"

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt with what the loop added, so it crosses processes (a Tune trial's driver) whole
        return (type(self), (self.what,), {"round": self.round, "checkpoint": self.checkpoint,
                                           "checkpointed": self.checkpointed, "args": self.args})
