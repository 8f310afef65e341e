"""The simulated clock's records: what the loop hands the server at a round's start (:class:`SimClock`) and a
round's schedule on that clock (:class:`RoundTiming`). Plain frozen dataclasses that import nothing of lcfed:
the round's plan (:class:`lcfed.methods.round.RoundPlan`) and the loop's contracts carry them, and the
schedulers of :mod:`lcfed.devices.schedule` and :mod:`lcfed.devices.buffered` make them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundTiming", "SimClock"]


@dataclass(frozen=True)
class SimClock:
    """What the loop hands the server at a round's start: the clock, and the bytes each device moves (the last
    round's mean per kept device, one model each way before the first)."""

    now: float
    down_bytes: float
    up_bytes: float


@dataclass(frozen=True)
class RoundTiming:
    """A round's schedule: when it started (after waiting for a device to come online) and ended, how many
    devices were online, selected (asynchronous: started), kept (their ids; asynchronous: the updates
    aggregated) and lost; asynchronous, the aggregated updates' mean staleness."""

    start: float
    end: float
    online: int
    selected: int
    kept: tuple[int, ...]
    lost: int
    staleness: float | None = None

    def metrics(self) -> dict[str, float]:
        """The round's device-model metrics (:mod:`lcfed.run.metric_catalog`)."""
        out = {"sim_clock_seconds": self.end, "sim_round_seconds": self.end - self.start,
               "devices_online": float(self.online), "devices_selected": float(self.selected),
               "devices_kept": float(len(self.kept)), "devices_dropped": float(self.lost)}
        if self.staleness is not None:
            out["staleness_mean"] = self.staleness
        return out
