"""The round's schedule on the simulated clock: who is online, who is selected, who is kept, how long it took.

Everything here follows from numbers known before any device trains: a device's FLOPs for its
local work, the bytes it moves and its speeds. So the server decides the kept set first and the methods see
only the kept devices' work; a lost device's work is never computed, and its state (a personal model) stays
as it was. The draws are pure functions of (seed, round) and the clock, which the loop carries in each
round's metrics (``sim_clock_seconds``), so a resumed run and every engine give the same schedule.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lcfed.config import devices_per_round
from lcfed.devices.clock import RoundTiming, SimClock
from lcfed.devices.feasible import check_feasible
from lcfed.devices.fleet import Fleet
from lcfed.devices.generators import fleet_from_arrays, group_phases, synthetic_fleet
from lcfed.devices.trace_files import TraceError
from lcfed.errors import ConfigError

if TYPE_CHECKING:  # annotations only
    from lcfed.config import ExperimentConfig
    from lcfed.devices.traces import CapacityTrace
    from lcfed.methods.round import Federation

__all__ = ["FleetPlanner", "Scheduler", "make_fleet", "samples_per_device", "training_mask"]

#: the selection's stream: the same as :func:`lcfed.methods.base.select_devices`', so that with every device
#: online and no over-commitment the device model selects exactly today's participants
_SELECT = 0x5E1EC7
#: the mid-round dropouts' stream
_DROP = 0xD209


def samples_per_device(cfg: ExperimentConfig, fed: Federation) -> np.ndarray:
    """Training samples each device processes in a round: ``local_steps x batch_size``, or ``local_epochs`` x
    its training set."""
    t = cfg.train
    if t.local_steps is not None:
        return np.full(fed.num_devices, float(t.local_steps * t.batch_size))
    return (t.local_epochs or 0) * np.asarray(fed.train_sizes, dtype=np.float64)


def make_fleet(cfg: ExperimentConfig, fed: Federation) -> Fleet | None:
    """The devices' speeds, links and availability (None with ``devices.simulate`` off): generated from the
    ``devices`` section, or read from FedScale traces. Speeds and links from a capacity trace replace the
    lognormal ones: ``computation`` ms per sample becomes ``flops_per_sample / (computation / 1000)`` FLOP/s,
    ``communication`` kbit/s both links."""
    dev = cfg.devices
    if not dev.simulate:
        return None
    from lcfed.devices import traces  # here: pandas for csv / parquet traces loads only when one is read

    m = fed.num_devices
    synthetic = dev.availability if dev.availability != "trace" else "always"
    phases = group_phases(np.asarray(fed.groups), cfg.seed, dev.phase_jitter) if dev.phase == "groups" else None
    fleet = synthetic_fleet(
        m, cfg.seed, gflops=cfg.network.device_gflops, bandwidth_mbps=cfg.network.bandwidth_mbps,
        speed_sigma=dev.speed_sigma, bandwidth_sigma=dev.bandwidth_sigma, latency_s=dev.latency_ms / 1000,
        dropout=dev.dropout, availability=synthetic, online_fraction=dev.online_fraction,
        period_s=dev.period_hours * 3600, slot_s=dev.slot_minutes * 60,
        phases=phases if synthetic == "diurnal" else None)
    flops, up, down = fleet.flops, fleet.up_bps, fleet.down_bps
    offsets, starts, ends, period = fleet.offsets, fleet.starts, fleet.ends, fleet.period
    if dev.capacity_trace:
        cap = traces.read_capacity(dev.capacity_trace, dev.trace_format)
        rows = traces.trace_rows(m, cap.ids, cfg.seed)
        speeds = fed.flops_per_sample / (cap.computation_ms / 1000)
        if fed.flops_per_sample:
            _float32_speeds(cap, speeds, "computation", "ms per sample", "FLOP/s")
        _float32_speeds(cap, cap.communication_kbps * 1000, "communication", "kbit/s", "bit/s")
        flops = speeds[rows].astype(np.float32) if fed.flops_per_sample else np.full(m, np.inf, dtype=np.float32)
        up = down = (cap.communication_kbps[rows] * 1000).astype(np.float32)
    if dev.availability == "trace":
        av = traces.read_availability(dev.availability_trace, dev.trace_format)
        rows = traces.trace_rows(m, av.ids, cfg.seed)
        lengths = av.offsets[rows + 1] - av.offsets[rows]
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        take = np.repeat(av.offsets[rows] - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
        starts, ends, period = av.starts[take], av.ends[take], av.period[rows]
    fleet = fleet_from_arrays(flops, up, down, fleet.latency, fleet.dropout, offsets, starts, ends, period)
    training = training_mask(fed)
    size = 4.0 * fed.spec.size  # the first round moves one model each way
    down_s, compute_s, up_s = fleet.round_seconds(np.arange(m), samples_per_device(cfg, fed), fed.flops_per_sample,
                                                  size, size)
    seconds = down_s + compute_s + up_s
    _check_deadline(cfg, float(np.min(seconds[training])))
    check_feasible(cfg, fleet, training, seconds)
    return fleet


def _float32_speeds(cap: CapacityTrace, speeds: np.ndarray, key: str, unit: str, speed_unit: str) -> None:
    """A trace client whose speed is no normal float32 (it would become 0, a subnormal or inf once stored) is
    refused, naming the file and the client."""
    info = np.finfo(np.float32)
    bad = np.flatnonzero(~((speeds >= info.smallest_normal) & (speeds <= info.max)))
    if len(bad):
        i = int(bad[0])
        value = (cap.computation_ms if key == "computation" else cap.communication_kbps)[i]
        raise TraceError("devices.capacity_trace", cap.path, f"client {cap.ids[i]}: {key} {value:.6g} {unit} is a "
                         f"speed of {speeds[i]:.6g} {speed_unit}, outside float32's normal range "
                         f"[{info.smallest_normal:.3g}, {info.max:.3g}]")


def _check_deadline(cfg: ExperimentConfig, fastest: float) -> None:
    """``devices.deadline_seconds`` below every device's time for one round (``fastest``, one model each way)
    would drop every round's work: refused before any work."""
    deadline = cfg.devices.deadline_seconds
    if deadline <= 0:
        return
    if deadline < fastest:
        raise ConfigError("devices.deadline_seconds", deadline, f"must be at least the fastest device's time for "
                          f"one round ({fastest:.4g} s); below it no round could keep any work")


def training_mask(fed: Federation) -> np.ndarray:
    """The devices rounds may select: all but the held-out ones (``data.holdout_fraction``)."""
    mask = np.ones(fed.num_devices, dtype=bool)
    mask[list(fed.held_out)] = False
    return mask


class FleetPlanner:
    """What a round's planner knows of the devices, synchronous or asynchronous: the fleet, each device's
    training samples, which devices train, and ``quota``, the devices per round (asynchronously: in flight)."""

    def __init__(self, cfg: ExperimentConfig, fed: Federation, fleet: Fleet) -> None:
        self.cfg = cfg
        self.fed = fed
        self.fleet = fleet
        self.samples = samples_per_device(cfg, fed)
        self.training = training_mask(fed)
        self.quota = devices_per_round(cfg)


class Scheduler(FleetPlanner):
    """Decides each round's devices on the simulated clock (held by the server; arrays only)."""

    def __init__(self, cfg: ExperimentConfig, fed: Federation, fleet: Fleet) -> None:
        super().__init__(cfg, fed, fleet)
        self.count = max(1, math.ceil((1 + cfg.devices.overcommit) * self.quota - 1e-9))

    def _online(self, t: float) -> tuple[float, np.ndarray]:
        """(the round's start, the training devices online then): ``t``, or the next time any comes online."""
        online = self.fleet.online(t) & self.training
        if not online.any():
            t = float(np.min(self.fleet.next_online(t)[self.training]))
            if not math.isfinite(t):
                raise RuntimeError("no training device is ever online (devices.availability)")
            online = self.fleet.online(t) & self.training
        return t, np.flatnonzero(online)

    def plan(self, rnd: int, clock: SimClock) -> RoundTiming:
        """Round ``rnd``: select ``ceil((1 + overcommit) k)`` of the online training devices (all if fewer are
        online), then keep the first ``k`` to finish among those not lost."""
        start, pool = self._online(clock.now)
        if self.count >= len(pool):
            selected = pool
        else:
            rng = np.random.default_rng([self.cfg.seed, rnd, _SELECT])
            selected = np.sort(rng.choice(pool, size=self.count, replace=False))
        return self._finish(rnd, start, clock, selected, self.quota, len(pool))

    def keep_among(self, rnd: int, clock: SimClock, devices: tuple[int, ...]) -> RoundTiming:
        """A round whose method chose its own devices (FLHC's clustering round, FedGroup's pretraining sample):
        those of them online at the start that finish without being lost; no quota."""
        start, pool = self._online(clock.now)
        chosen = np.asarray(devices, dtype=np.int64)
        online = chosen[np.isin(chosen, pool)]
        timing = self._finish(rnd, start, clock, online, len(chosen), len(pool))
        return RoundTiming(timing.start, timing.end, timing.online, len(chosen), timing.kept,
                           len(chosen) - len(timing.kept))

    def _finish(self, rnd: int, start: float, clock: SimClock, selected: np.ndarray, quota: int,
                online: int) -> RoundTiming:
        """Which of ``selected`` the methods hear from, and when the round ends. A device is lost when it drops
        out (``devices.dropout``, drawn per round), goes offline before it finishes, or misses the deadline; of
        the rest the first ``quota`` to finish are kept (ties by id). The round ends when the last kept device
        is back, or at the deadline when fewer than ``quota`` made it."""
        cfg, fleet = self.cfg, self.fleet
        down, compute, up = fleet.round_seconds(selected, self.samples[selected], self.fed.flops_per_sample,
                                                clock.down_bytes, clock.up_bytes)
        took = down + compute + up
        rng = np.random.default_rng([cfg.seed, rnd, _DROP])
        lost = rng.random(len(selected)) < fleet.dropout[selected]
        if not fleet.always_online:
            lost |= fleet.online_until(start, selected) < start + took
        deadline = cfg.devices.deadline_seconds
        if deadline > 0:
            lost |= took > deadline
        alive = np.flatnonzero(~lost)
        first = alive[np.lexsort((selected[alive], took[alive]))][:quota]
        if deadline > 0 and len(first) < quota:
            end = start + deadline
        else:
            end = start + float(took[first].max() if len(first) else (took.max() if len(took) else 0.0))
        kept = tuple(sorted(int(d) for d in selected[first]))
        return RoundTiming(start, end, online, len(selected), kept, len(selected) - len(kept))
