"""The ``network`` and ``devices`` sections: the simulated deployment that prices a round in seconds, and the
device model (docs/devices.md): per-device speeds, links, availability and dropouts on a simulated clock, and
the round's policies, with the rules of their fields (:func:`check_devices`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from lcfed.errors import require

__all__ = ["AGGREGATION", "AVAILABILITY", "DevicesConfig", "LIMITS", "MAX_SLOTS", "NetworkConfig", "PHASES", "STALENESS",
           "TRACE_FORMATS", "check_devices", "check_fleet_size"]

#: bounds of the device model's numbers (docs/devices.md): inside them every per-device speed, link and time is
#: a normal float32 and the clock stays exact enough (a period's phase to 1e-6 s over 10^9 s); outside they
#: overflow or underflow once drawn, so they are refused before any work
LIMITS: dict[str, tuple[float, float, str]] = {
    "network.bandwidth_mbps": (1e-6, 1e15, "Mbit/s per device link"),
    "network.device_gflops": (1e-6, 1e15, "GFLOP/s per device"),
    "devices.speed_sigma": (0.0, 5.0, "the log-sd of the speeds' lognormal"),
    "devices.bandwidth_sigma": (0.0, 5.0, "the log-sd of the links' lognormal"),
    "devices.latency_ms": (0.0, 3.6e6, "ms per transfer; at most an hour"),
    "devices.period_hours": (1 / 3600, 8760.0, "hours; from a second to a year"),
    "devices.slot_minutes": (1 / 60, 525600.0, "minutes; from a second to a year"),
    "devices.deadline_seconds": (0.0, 3.2e7, "seconds; at most about a year"),
    "devices.overcommit": (0.0, 100.0, "select up to 101x the devices a round keeps"),
}

#: ``devices.availability: iid``: at most this many slots per period (the generator draws BLOCK x slots at once)
MAX_SLOTS = 1440


@dataclass(frozen=True)
class NetworkConfig:
    """The simulated deployment that prices a round in seconds: each device's link and compute speed.

    Devices transfer in parallel on their own links; compute counts 3 forward passes (forward +
    backward) per training sample at ``device_gflops``.
    """

    bandwidth_mbps: float = 2.0
    device_gflops: float = 10.0

    def validate(self, prefix: str = "network") -> None:
        require(self.bandwidth_mbps > 0, f"{prefix}.bandwidth_mbps", self.bandwidth_mbps, "must be > 0 (Mbit/s per device link)")
        require(self.device_gflops > 0, f"{prefix}.device_gflops", self.device_gflops, "must be > 0 (GFLOP/s per device)")
        for name in ("bandwidth_mbps", "device_gflops"):
            _bounded(getattr(self, name), f"{prefix}.{name}", f"network.{name}")


@dataclass(frozen=True)
class DevicesConfig:
    """Devices that come and go (docs/devices.md): per-device speed, links, availability and dropouts on a
    simulated clock, and the round's policies (deadline, over-commitment). Off (``simulate: false``) every
    sampled device is online, finishes and answers at once, as before."""

    simulate: bool = False
    speed_sigma: float = 0.0  # lognormal log-sd of compute speeds around network.device_gflops
    bandwidth_sigma: float = 0.0  # the same for links around network.bandwidth_mbps
    latency_ms: float = 0.0  # added to each transfer, each way
    availability: str = "always"  # always | diurnal | iid | trace
    online_fraction: float = 1.0  # diurnal: the share of the day online; iid: each slot's chance to be online
    period_hours: float = 24.0  # diurnal / iid: the pattern's period
    slot_minutes: float = 60.0  # iid: the on/off slot
    phase: str = "random"  # diurnal: random per device, or "groups" (follows data's true groups / users)
    phase_jitter: float = 0.05  # phase: groups: each device's offset from its group's phase (share of a period)
    dropout: float = 0.0  # chance that a selected device drops out during the round
    capacity_trace: str = ""  # FedScale capacity trace: speeds and links per device
    availability_trace: str = ""  # FedScale availability trace (with availability: trace)
    trace_format: str = "auto"  # auto | json | csv | parquet | pickle
    deadline_seconds: float = 0.0  # devices not back by then are dropped (0: the server waits)
    overcommit: float = 0.0  # select ceil((1 + overcommit) * k), keep the first k to finish
    target_acc: float = 0.0  # acc_mean for time_to_target (simulated seconds); 0: not reported
    aggregation: str = "sync"  # sync: rounds; async: FedBuff, the server aggregates every async_buffer arrivals
    async_buffer: int = 0  # async: B, the arrivals per aggregation (1 <= B <= devices in flight)
    staleness: str = "sqrt"  # async: an update s versions old counts 1/sqrt(1 + s) (sqrt) or 1 (constant)

    def validate(self, prefix: str = "devices") -> None:
        check_devices(self, prefix)


#: ``devices.availability``: every device always online, a daily window, i.i.d. on/off slots, or a trace file
AVAILABILITY = ("always", "diurnal", "iid", "trace")


#: ``devices.phase``: a diurnal window's start per device
PHASES = ("random", "groups")


#: ``devices.aggregation``: rounds that wait (deadline, over-commitment) or FedBuff's buffered asynchrony
AGGREGATION = ("sync", "async")


#: ``devices.staleness``: how much an update ``s`` server versions old counts
STALENESS = ("sqrt", "constant")


#: ``devices.trace_format``
TRACE_FORMATS = ("auto", "json", "csv", "parquet", "pickle")


def check_devices(dev: DevicesConfig, prefix: str = "devices") -> None:
    """``devices.*``: the device model's distributions and the round's policies; each finite, in range, and
    set only with ``devices.simulate: true``."""
    require(isinstance(dev.simulate, bool), f"{prefix}.simulate", dev.simulate, "true or false")
    if not dev.simulate:
        for f in dataclasses.fields(dev):
            value = getattr(dev, f.name)
            require(f.name == "simulate" or value == f.default, f"{prefix}.{f.name}", value,
                    f"only with {prefix}.simulate: true (the device model is off)")
        return
    for name in ("speed_sigma", "bandwidth_sigma", "latency_ms", "deadline_seconds", "overcommit"):
        value = getattr(dev, name)
        require(math.isfinite(value) and value >= 0, f"{prefix}.{name}", value, "must be a finite number >= 0")
        _bounded(value, f"{prefix}.{name}", f"devices.{name}")
    require(dev.availability in AVAILABILITY, f"{prefix}.availability", dev.availability, f"one of {list(AVAILABILITY)}")
    require(math.isfinite(dev.online_fraction) and 0 < dev.online_fraction <= 1, f"{prefix}.online_fraction",
            dev.online_fraction, "must be in (0, 1]")
    require(math.isfinite(dev.period_hours) and dev.period_hours > 0, f"{prefix}.period_hours", dev.period_hours,
            "must be > 0")
    require(math.isfinite(dev.slot_minutes) and dev.slot_minutes > 0, f"{prefix}.slot_minutes", dev.slot_minutes,
            "must be > 0")
    for name in ("period_hours", "slot_minutes"):
        _bounded(getattr(dev, name), f"{prefix}.{name}", f"devices.{name}")
    if dev.availability == "iid":
        slots = dev.period_hours * 60 / dev.slot_minutes
        require(abs(slots - round(slots)) < 1e-9, f"{prefix}.slot_minutes", dev.slot_minutes,
                f"must divide {prefix}.period_hours ({dev.period_hours} h) into whole slots")
        require(round(slots) <= MAX_SLOTS, f"{prefix}.slot_minutes", dev.slot_minutes,
                f"cuts {prefix}.period_hours ({dev.period_hours} h) into {round(slots):,} slots; at most {MAX_SLOTS:,} "
                "(the generator holds 4,096 devices x slots at once): use longer slots")
    require(dev.phase in PHASES, f"{prefix}.phase", dev.phase, f"one of {list(PHASES)}")
    require(math.isfinite(dev.phase_jitter) and 0 <= dev.phase_jitter < 1, f"{prefix}.phase_jitter",
            dev.phase_jitter, "must be in [0, 1) (a share of the period)")
    require(math.isfinite(dev.dropout) and 0 <= dev.dropout < 1, f"{prefix}.dropout", dev.dropout, "must be in [0, 1)")
    require(dev.trace_format in TRACE_FORMATS, f"{prefix}.trace_format", dev.trace_format,
            f"one of {list(TRACE_FORMATS)}")
    require((dev.availability == "trace") == bool(dev.availability_trace), f"{prefix}.availability_trace",
            dev.availability_trace, f"a file exactly when {prefix}.availability is trace")
    for name in ("capacity_trace", "availability_trace"):
        path = getattr(dev, name)
        require(not path or Path(path).expanduser().is_file(), f"{prefix}.{name}", path, "an existing file")
    require(math.isfinite(dev.target_acc) and 0 <= dev.target_acc <= 1, f"{prefix}.target_acc", dev.target_acc,
            "an accuracy in [0, 1] (0: no time to target)")
    require(dev.aggregation in AGGREGATION, f"{prefix}.aggregation", dev.aggregation, f"one of {list(AGGREGATION)}")
    require(dev.staleness in STALENESS, f"{prefix}.staleness", dev.staleness, f"one of {list(STALENESS)}")
    if dev.aggregation == "async":
        require(dev.async_buffer >= 1, f"{prefix}.async_buffer", dev.async_buffer,
                "must be >= 1 with aggregation: async (the arrivals each aggregation takes)")
        require(dev.deadline_seconds == 0, f"{prefix}.deadline_seconds", dev.deadline_seconds,
                "only with aggregation: sync (an asynchronous server has no rounds to close)")
        require(dev.overcommit == 0, f"{prefix}.overcommit", dev.overcommit,
                "only with aggregation: sync (an asynchronous server keeps every arrival)")
    else:
        require(dev.async_buffer == 0, f"{prefix}.async_buffer", dev.async_buffer, "only with aggregation: async")


def _bounded(value: float, field: str, key: str) -> None:
    low, high, unit = LIMITS[key]
    require(math.isfinite(value) and low <= value <= high, field, value,
            f"must be in [{low:.6g}, {high:.6g}] ({unit})")


def check_fleet_size(dev: DevicesConfig, num_devices: int, memory_mb: float, prefix: str = "devices") -> None:
    """An iid fleet's intervals (up to half the slots per device, 16 bytes each) must fit ``memory_mb``: refused
    before numpy's allocator fails in the generator."""
    if not (dev.simulate and dev.availability == "iid" and dev.online_fraction < 1):
        return
    slots = round(dev.period_hours * 60 / dev.slot_minutes)
    need_mb = num_devices * (slots // 2 + 1) * 16 / 2**20
    require(need_mb <= memory_mb, f"{prefix}.slot_minutes", dev.slot_minutes,
            f"must fit this machine's memory: {num_devices:,} devices x up to {slots // 2 + 1:,} online intervals "
            f"of 16 bytes are {need_mb / 1024:,.1f} GB, and it has {memory_mb / 1024:,.1f} GB; use longer slots")
