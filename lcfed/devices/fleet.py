"""Per-device facts as arrays: compute speed, links, latency, dropout and availability, indexed by device id.

A simulation holds 10^5-10^6 devices on one machine, so there is no Python object per device: a
:class:`Fleet` is a handful of numpy arrays (float32 storage, float64 arithmetic) and its time queries are
vectorised over the devices asked about.

Availability is a repeating pattern per device: online intervals ``[start, end)`` within ``[0, period)``,
stored CSR-style (``offsets``, ``starts``, ``ends``) and repeated every ``period`` seconds. A device is online
at time t when ``start <= t mod period < end`` for one of its intervals. An interval ending at ``period``
followed by one starting at 0 (a window that wraps past the period's end, stored as two), and intervals that
touch (``end == next start``), form one continuous online stretch. Times are float64 seconds: ``t mod period``
is exact, and an absolute time returned (``t - t mod period`` plus an interval's bound) is rounded to float64
(a 2e-9 s step at 10^7 s). The queries find a device's interval by a binary search over its CSR range,
vectorised across the devices asked about (no Python loop over devices) and comparing the stored floats
themselves, so they are exact where a combined key ``device * P + start`` would round.

The fleets themselves are made in :mod:`lcfed.devices.generators` (seeded synthetic fleets, fleets from a
trace's arrays). Memory: 4 bytes per device for speed and 4 for the links (uplink and downlink share one array);
constant quantities (latency, dropout, the period, and speed or links when their
sigma is 0) are zero-stride views holding one value; availability adds 8 bytes per device (``offsets``) and
16 per interval. A diurnal fleet of 10^6 devices online half the day holds about 40 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from lcfed import _moved

#: devices generated from one stream (as :data:`lcfed.data.generated.BLOCK`)
BLOCK = 4096


#: training FLOPs per sample per FLOP of a forward pass: forward + backward (the backward pass costs ~2 forwards)
FORWARD_BACKWARD = 3.0


#: availability kinds of :func:`synthetic_fleet`
AVAILABILITY = ("always", "diurnal", "iid")


@dataclass(frozen=True)
class Fleet:
    """What each device can do, as arrays indexed by device id (float32 storage; computations in float64).

    ``flops``: training compute speed, FLOP/s; ``up_bps``/``down_bps``: link speeds, bit/s (``np.inf`` =
    infinitely fast: that part of a round takes 0 s); ``latency``: seconds added to each transfer, each
    direction; ``dropout``: probability that the device drops out during a round it was selected for.
    Availability: None = every device always online; else CSR online intervals per device, ``starts[offsets[d]:
    offsets[d+1]]`` / ``ends[...]`` within ``[0, period[d])``, sorted and non-overlapping, repeating every
    ``period[d]`` seconds. Build one with :func:`fleet_from_arrays` (validated) or :func:`synthetic_fleet`;
    the constructor trusts its arguments. The arrays are read-only, so no run changes a device's facts.
    """

    flops: np.ndarray  # float32[m]
    up_bps: np.ndarray  # float32[m]
    down_bps: np.ndarray  # float32[m]
    latency: np.ndarray  # float32[m]
    dropout: np.ndarray  # float32[m]
    offsets: np.ndarray | None = None  # int64[m+1]
    starts: np.ndarray | None = None  # float64[n]
    ends: np.ndarray | None = None  # float64[n]
    period: np.ndarray | None = None  # float64[m], > 0

    @property
    def num_devices(self) -> int:
        """The number of devices, m."""
        return len(self.flops)

    @property
    def always_online(self) -> bool:
        """Whether there is no availability pattern (every device online at every time)."""
        return self.offsets is None

    def online(self, t: float, devices: np.ndarray | None = None) -> np.ndarray:
        """bool per device (all devices when None): online at simulated time ``t``, i.e. ``start <= t mod period
        < end`` for one of its intervals."""
        d = self._devices(devices)
        t = _time(t)
        if self.always_online:
            return np.ones(len(d), dtype=bool)
        x = np.mod(t, self._period[d])
        return self._containing(d, x) >= 0

    def online_until(self, t: float, devices: np.ndarray) -> np.ndarray:
        """float64 per device: the absolute end of the online stretch containing ``t``; ``t`` itself for a device
        offline at ``t``; ``np.inf`` for a device online at every time (always online, or its intervals cover
        the whole period).

        The stretch follows touching intervals and wraps: when it reaches the period's end and the device's
        first interval starts at 0, it goes on into the next period to the end of that stretch. One wrap is
        all there is: a stretch from 0 that again reaches the period's end covers the whole period (np.inf).
        """
        d = self._devices(devices)
        t = _time(t)
        if self.always_online:
            return np.full(len(d), np.inf)
        starts, ends, offsets = self._csr
        p = self._period[d]
        x = np.mod(t, p)
        base = t - x  # the start of the current period
        out = np.full(len(d), t, dtype=np.float64)
        i = self._containing(d, x)
        on = i >= 0
        d, i, p, base = d[on], i[on], p[on], base[on]
        end = ends[self._stretch_last(d, i)]
        until = base + end
        wraps = (end >= p) & (starts[offsets[d]] == 0.0)  # online devices have an interval: offsets[d] is one
        if wraps.any():
            dw = d[wraps]
            first_end = ends[self._stretch_last(dw, offsets[dw])]
            until[wraps] = np.where(first_end >= p[wraps], np.inf, base[wraps] + p[wraps] + first_end)
        out[on] = until
        return out

    def next_online(self, t: float, devices: np.ndarray | None = None) -> np.ndarray:
        """float64 per device (all devices when None): the earliest absolute time >= ``t`` the device is online;
        ``t`` when online now, the next interval's start later in this period or else the first interval's
        start in the next period, ``np.inf`` for a device with no interval at all."""
        d = self._devices(devices)
        t = _time(t)
        if self.always_online:
            return np.full(len(d), t, dtype=np.float64)
        starts, _, offsets = self._csr
        p = self._period[d]
        x = np.mod(t, p)
        out = np.full(len(d), np.inf)
        lo, hi = offsets[d], offsets[d + 1]
        some = hi > lo
        d, x, p, lo, hi = d[some], x[some], p[some], lo[some], hi[some]
        upper = self._upper(d, x)
        later = upper < hi  # an interval starts later in this period
        start = starts[np.where(later, upper, lo)]  # else the first one, in the next period
        nxt = np.where(later, t - x + start, t - x + p + start)
        out[some] = np.where(self._containing(d, x, upper) >= 0, t, nxt)
        return out

    def round_seconds(
        self, devices: np.ndarray, samples: np.ndarray, flops_per_sample: float, down_bytes: float, up_bytes: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(download, compute, upload) seconds per device, float64, for a round that sends ``down_bytes`` to each
        device, trains on ``samples`` samples (``flops_per_sample`` = FLOPs of one forward pass) and sends
        ``up_bytes`` back:

        - download = latency + down_bytes * 8 / down_bps
        - compute = samples * 3 * flops_per_sample / flops (3: forward + backward, :data:`FORWARD_BACKWARD`)
        - upload = latency + up_bytes * 8 / up_bps

        An infinite speed makes its part exactly 0.0 (the latency is still added to a transfer).
        """
        d = self._devices(devices)
        n = np.asarray(samples, dtype=np.float64)
        if n.shape != d.shape:
            raise ValueError(f"samples has shape {n.shape}, devices {d.shape}: one count per device")
        if not np.all(np.isfinite(n) & (n >= 0)):
            raise ValueError("samples must be finite and >= 0")
        for name, value in (("flops_per_sample", flops_per_sample), ("down_bytes", down_bytes), ("up_bytes", up_bytes)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        latency = self.latency[d].astype(np.float64)
        download = latency + _per_speed(np.full(len(d), float(down_bytes) * 8.0), self.down_bps[d])
        compute = _per_speed(n * (FORWARD_BACKWARD * float(flops_per_sample)), self.flops[d])
        upload = latency + _per_speed(np.full(len(d), float(up_bytes) * 8.0), self.up_bps[d])
        return download, compute, upload

    def nbytes(self) -> int:
        """Bytes of memory the arrays hold: each buffer counted once (arrays sharing memory, as the uplink and
        downlink of a synthetic fleet, count once; a zero-stride constant counts one value)."""
        arrays = [a for a in (self.flops, self.up_bps, self.down_bps, self.latency, self.dropout, self.offsets,
                              self.starts, self.ends, self.period) if a is not None]
        spans = sorted(byte_bounds(a) for a in arrays if a.size)
        total, reach = 0, -1
        for lo, hi in spans:  # union of the byte ranges
            lo = max(lo, reach)
            if hi > lo:
                total += hi - lo
            reach = max(reach, hi)
        return total

    # ---------------------------------------------------------------- internals

    @property
    def _csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        assert self.starts is not None and self.ends is not None and self.offsets is not None
        return self.starts, self.ends, self.offsets

    @property
    def _period(self) -> np.ndarray:
        assert self.period is not None
        return self.period

    def _devices(self, devices: np.ndarray | None) -> np.ndarray:
        """Device ids as int64, checked to lie in [0, m) (negative ids would silently index from the end)."""
        if devices is None:
            return np.arange(self.num_devices, dtype=np.int64)
        d = np.asarray(devices)
        if d.ndim != 1 or not (np.issubdtype(d.dtype, np.integer) or d.size == 0):
            raise ValueError(f"devices must be a 1-d array of device ids, got shape {d.shape} dtype {d.dtype}")
        d = d.astype(np.int64, copy=False)
        if d.size and (d.min() < 0 or d.max() >= self.num_devices):
            raise ValueError(f"device ids must lie in [0, {self.num_devices}), got {d.min()}..{d.max()}")
        return d

    def _upper(self, d: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Per device, the first interval index in its CSR range whose start is > x (its range's end if none).

        A binary search vectorised over the devices: ceil(log2(k + 1)) numpy steps for the busiest device's k
        intervals. It compares the stored floats themselves, so it is exact (a key ``d * P + x`` would round
        once d * P is large).
        """
        starts, _, offsets = self._csr
        lo: np.ndarray  # (numpy types the fancy index below as Any)
        lo, hi = offsets[d].copy(), offsets[d + 1].copy()
        last = max(len(starts) - 1, 0)
        while True:
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) >> 1
            right = active & (starts[np.minimum(mid, last)] <= x)
            lo = np.where(right, mid + 1, lo)
            hi = np.where(active & ~right, mid, hi)

    def _containing(self, d: np.ndarray, x: np.ndarray, upper: np.ndarray | None = None) -> np.ndarray:
        """Per device, the index of the interval containing x (``start <= x < end``), -1 when offline (``upper``:
        :meth:`_upper`'s answer, when already known)."""
        _, ends, offsets = self._csr
        if not len(ends):
            return np.full(len(d), -1, dtype=np.int64)
        i = (self._upper(d, x) if upper is None else upper) - 1
        has = i >= offsets[d]
        has &= x < ends[np.where(has, i, 0)]
        return np.where(has, i, -1)

    def _stretch_last(self, d: np.ndarray, i: np.ndarray) -> np.ndarray:
        """From interval i of each device, the last interval of the run of touching intervals (``end == next
        start``) that it begins, within the device's range; one numpy step per touching link."""
        starts, ends, offsets = self._csr
        j = i.copy()
        stop = offsets[d + 1]
        while True:
            more = j + 1 < stop
            more[more] = starts[j[more] + 1] <= ends[j[more]]
            if not more.any():
                return j
            j[more] += 1


def _time(t: float) -> float:
    t = float(t)
    if not math.isfinite(t):
        raise ValueError(f"the time must be finite, got {t}")
    return t


def _per_speed(work: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """work / speed in float64, exactly 0.0 where the speed is infinite (even for infinite work)."""
    s = speed.astype(np.float64)
    out = np.zeros(len(work), dtype=np.float64)
    finite = np.isfinite(s)
    out[finite] = work[finite] / s[finite]
    return out


def readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def __getattr__(name: str) -> Any:
    """A name split off to :mod:`lcfed.devices.generators`, read here: found there, with a DeprecationWarning."""
    return _moved.split_off(__name__, name)
