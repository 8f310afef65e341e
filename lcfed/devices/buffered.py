"""Asynchronous aggregation (FedBuff, Nguyen et al., AISTATS 2022) on the simulated clock.

``train.participation`` of the training devices are in flight at once. A device starts from the server's
current version as soon as a slot is free and it is online; the server aggregates each time
``devices.async_buffer`` (B) updates have arrived, each weighted by its staleness. One round of the loop is
one aggregation (version ``r`` -> ``r + 1``).

The queue is ordered by (simulated finish time, device id), so the order and the numbers never depend on the
wall clock or the engine. A device's time follows from numbers known when it starts, so the
server plans the round before any device trains: which devices start (from version ``r``), which updates
arrive, when the B-th arrives. The devices that start are trained in the round they start; their messages
wait in the queue (in the checkpoint, with the payload they trained from) until they arrive.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lcfed.devices.clock import RoundTiming, SimClock
from lcfed.devices.feasible import MAX_STARTS_PER_UPDATE
from lcfed.devices.fleet import Fleet
from lcfed.devices.schedule import FleetPlanner
from lcfed.errors import ConfigError

if TYPE_CHECKING:  # annotations only
    from lcfed.config import ExperimentConfig
    from lcfed.methods.round import Federation

__all__ = ["BufferedRound", "BufferedScheduler", "InFlight", "Pending", "fill_messages", "staleness_weight"]

#: the stream of the asynchronous server's draws (which free devices start, who drops out)
_ASYNC = 0xA5F1


def staleness_weight(kind: str, staleness: int) -> float:
    """How much an update ``staleness`` versions old counts: 1/sqrt(1 + s) (FedBuff's), or 1 (constant)."""
    return 1.0 / math.sqrt(1.0 + staleness) if kind == "sqrt" else 1.0


@dataclass(frozen=True)
class InFlight:
    """A device at work: when it arrives (or is lost), the version it started from, and once trained its
    message and the payload it trained from."""

    finish: float
    device: int
    version: int
    lost: bool
    message: Any = None
    start: Any = None


@dataclass(frozen=True)
class Pending:
    """The asynchronous server's queue between aggregations (checkpointed): the devices in flight, sorted by
    (finish, device), and the free slots with the time each opens."""

    inflight: tuple[InFlight, ...]
    slots: tuple[float, ...]


@dataclass(frozen=True)
class BufferedRound:
    """One aggregation planned: its timing, the devices that start (from this version), the updates that
    arrive (in arrival order) and the queue after it (the starters' messages not yet filled in)."""

    timing: RoundTiming
    starts: tuple[InFlight, ...]
    arrivals: tuple[InFlight, ...]
    pending: Pending


class BufferedScheduler(FleetPlanner):
    """Plans each aggregation of an asynchronous server (held by the server; arrays and a heap only); its
    ``quota`` devices are in flight at once."""

    def __init__(self, cfg: ExperimentConfig, fed: Federation, fleet: Fleet) -> None:
        super().__init__(cfg, fed, fleet)
        self.buffer = cfg.devices.async_buffer

    def plan(self, rnd: int, clock: SimClock, pending: Pending | None) -> BufferedRound:
        """Aggregation ``rnd``: play the queue forward from ``clock.now`` until B updates have arrived. Free
        slots take online devices not in flight (a seeded draw among them); a slot with none online waits for
        the next to come online. The B-th arrival's slot opens in the next aggregation, from its version."""
        if pending is None:
            pending = Pending((), (clock.now,) * self.quota)
        busy = np.zeros(self.fed.num_devices, dtype=bool)
        heap: list[tuple[float, int, int, InFlight | None]] = []
        for queued in pending.inflight:
            busy[queued.device] = True
            heapq.heappush(heap, (queued.finish, 0, queued.device, queued))
        for i, t in enumerate(pending.slots):
            heapq.heappush(heap, (t, 1, i, None))
        rng = np.random.default_rng([self.cfg.seed, rnd, _ASYNC])
        starts: list[InFlight] = []
        arrivals: list[InFlight] = []
        lost = 0
        online_at_start = int((self.fleet.online(clock.now) & self.training).sum())
        slot_id = len(pending.slots)
        end = clock.now
        while len(arrivals) < self.buffer:
            if not heap or not math.isfinite(heap[0][0]):
                raise RuntimeError("no device in flight and none ever online again (devices.availability)")
            t, _, _, f = heapq.heappop(heap)
            if f is not None:
                busy[f.device] = False
                if f.lost:
                    lost += 1
                    heapq.heappush(heap, (t, 1, slot_id, None))
                    slot_id += 1
                    continue
                arrivals.append(f)
                end = t
                if len(arrivals) < self.buffer:
                    heapq.heappush(heap, (t, 1, slot_id, None))
                    slot_id += 1
                continue
            opening = 1  # every slot opening at t is filled by one draw
            while heap and heap[0][0] == t and heap[0][1] == 1:
                heapq.heappop(heap)
                opening += 1
            new, waiting = self._fill(rnd, t, opening, busy, rng, clock)
            for g in new:
                busy[g.device] = True
                heapq.heappush(heap, (g.finish, 0, g.device, g))
            starts.extend(new)
            if len(starts) > MAX_STARTS_PER_UPDATE * self.buffer:
                self._stalled(rnd, len(starts), len(arrivals))
            for _ in range(opening - len(new)):
                heapq.heappush(heap, (waiting, 1, slot_id, None))
                slot_id += 1
        rest = sorted(heap, key=lambda e: (e[0], e[1], e[2]))
        inflight = tuple(e[3] for e in rest if e[3] is not None)
        slots = tuple(e[0] for e in rest if e[3] is None) + (end,)
        timing = RoundTiming(clock.now, end, online_at_start, len(starts), tuple(f.device for f in arrivals), lost,
                             staleness=float(np.mean([rnd - f.version for f in arrivals])))
        return BufferedRound(timing, tuple(starts), tuple(arrivals), Pending(inflight, slots))

    def _stalled(self, rnd: int, started: int, arrived: int) -> None:
        """Stop a buffer that does not fill (a chance that dropouts near 1 or short windows make ~0) with the
        settings that made it so, instead of playing the queue forward for ever."""
        dev = self.cfg.devices
        raise ConfigError("devices.dropout", dev.dropout, f"aggregation {rnd} started {started:,} devices "
                          f"({MAX_STARTS_PER_UPDATE:,} per update it needs) and only {arrived} of its "
                          f"devices.async_buffer={self.buffer} updates arrived; the rest dropped out or went offline "
                          f"first (devices.availability={dev.availability}, online_fraction={dev.online_fraction}): "
                          "lower devices.dropout or devices.async_buffer, or lengthen the online windows")

    def _fill(self, rnd: int, t: float, count: int, busy: np.ndarray, rng: np.random.Generator,
              clock: SimClock) -> tuple[list[InFlight], float]:
        """Up to ``count`` devices that start at ``t`` (online, not in flight), and when the slots left unfilled
        open again (the next time a free device comes online)."""
        free = self.training & ~busy
        pool = np.flatnonzero(self.fleet.online(t) & free)
        if len(pool) == 0:
            nxt = self.fleet.next_online(t)[free]
            return [], float(nxt.min()) if len(nxt) else math.inf
        chosen = np.sort(rng.choice(pool, size=min(count, len(pool)), replace=False))
        down, compute, up = self.fleet.round_seconds(chosen, self.samples[chosen], self.fed.flops_per_sample,
                                                     clock.down_bytes, clock.up_bytes)
        took = down + compute + up
        finish = t + took
        drop = rng.random(len(chosen)) < self.fleet.dropout[chosen]
        gone = np.zeros(len(chosen), dtype=bool)
        if not self.fleet.always_online:
            until = self.fleet.online_until(t, chosen)
            gone = until < finish
            finish = np.where(gone, until, finish)
        out = [InFlight(float(finish[i]), int(d), rnd, bool(drop[i] or gone[i])) for i, d in enumerate(chosen)]
        free[chosen] = False
        later = self.fleet.next_online(t, np.flatnonzero(free))
        return out, float(later[later > t].min()) if (later > t).any() else math.inf


def fill_messages(pending: Pending, rnd: int, messages: dict[int, Any], payload: Any) -> Pending:
    """The queue with the messages of the devices that started in aggregation ``rnd`` (trained from
    ``payload``)."""
    return replace(pending, inflight=tuple(
        replace(f, message=messages[f.device], start=payload) if f.version == rnd and not f.lost else f
        for f in pending.inflight))
