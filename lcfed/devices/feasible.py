"""Schedules that can never run, found before the first round: no training device is ever online, or none can
finish a round inside its online window. Without this check a synchronous run meets the first in round 0 and
keeps no device's work in every round after the second; an asynchronous server waits forever for its buffer.
What depends on chance (dropouts near 1) is bounded while the run goes (:data:`MAX_STARTS_PER_UPDATE`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lcfed.devices.fleet import Fleet
from lcfed.errors import ConfigError

if TYPE_CHECKING:  # annotations only
    from lcfed.config import ExperimentConfig

__all__ = ["MAX_STARTS_PER_UPDATE", "check_feasible", "longest_online"]

#: asynchronous aggregation: devices started per update an aggregation needs before the run is stopped as one
#: whose buffer never fills (dropouts near 1, windows shorter than most devices' rounds)
MAX_STARTS_PER_UPDATE = 1_000


def longest_online(fleet: Fleet) -> np.ndarray:
    """float64 per device: its longest continuous online stretch in seconds (touching intervals and a window
    that wraps past the period's end joined); 0 for a device never online, ``np.inf`` for one always online."""
    m = fleet.num_devices
    if fleet.always_online:
        return np.full(m, np.inf)
    starts, ends, offsets, period = fleet.starts, fleet.ends, fleet.offsets, fleet.period
    assert starts is not None and ends is not None and offsets is not None and period is not None
    out = np.zeros(m)
    n = len(starts)
    if n == 0:
        return out
    dev = np.repeat(np.arange(m), np.diff(offsets))
    new = np.ones(n, dtype=bool)  # an interval that begins a stretch: its device's first, or after a gap
    new[1:] = (dev[1:] != dev[:-1]) | (starts[1:] > ends[:-1])
    heads = np.flatnonzero(new)
    length = np.add.reduceat(ends - starts, heads)
    owner = dev[heads]
    has = np.diff(offsets) > 0
    first = np.full(m, -1)
    last = np.full(m, -1)
    uniq, at = np.unique(owner, return_index=True)  # owner is sorted: each device's first stretch, and its last
    first[uniq] = at
    last[uniq] = np.append(at[1:] - 1, len(heads) - 1)
    np.maximum.at(out, owner, length)
    d = np.flatnonzero(has)
    wraps = (starts[offsets[d]] == 0.0) & (ends[offsets[d + 1] - 1] >= period[d])
    dw = d[wraps]
    if len(dw):  # the last stretch runs on into the next period's first
        joined = np.where(first[dw] == last[dw], np.inf, length[first[dw]] + length[last[dw]])
        out[dw] = np.maximum(out[dw], joined)
    return out


def check_feasible(cfg: ExperimentConfig, fleet: Fleet, training: np.ndarray, seconds: np.ndarray) -> None:
    """Refuse a fleet on which no round can ever keep any work: no training device (``training``, a mask) is
    ever online, or none has an online stretch as long as its time for one round (``seconds``, per device)."""
    dev = cfg.devices
    field, value = ("devices.availability_trace", dev.availability_trace) if dev.availability == "trace" else (
        "devices.online_fraction", dev.online_fraction)
    window = longest_online(fleet)[training]
    if not (window > 0).any():
        raise ConfigError(field, value, f"no training device is ever online ({int(training.sum())} devices, "
                          f"devices.availability={dev.availability}): at least one needs an online interval")
    took = seconds[training]
    if not (took <= window).any():
        best = int(np.argmin(took - window))
        raise ConfigError(field, value, "no training device can finish a round inside an online window (the "
                          f"closest needs {took[best]:.4g} s and is online at most {window[best]:.4g} s at a time): "
                          "lengthen the windows (devices.online_fraction, devices.period_hours) or speed up the "
                          "devices (network.*)")
