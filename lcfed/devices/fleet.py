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

Synthetic fleets (:func:`synthetic_fleet`) are generated in blocks of :data:`BLOCK` devices, each block and
each quantity from a stream of its own, ``np.random.default_rng([seed, STREAM, block])``: device d's values
depend on the seed and the arguments only, not on the number of devices, any block can be rebuilt alone, and
adding a quantity never shifts another. Memory: 4 bytes per device for speed and 4 for the links (uplink and
downlink share one array); constant quantities (latency, dropout, the period, and speed or links when their
sigma is 0) are zero-stride views holding one value; availability adds 8 bytes per device (``offsets``) and
16 per interval. A diurnal fleet of 10^6 devices online half the day holds about 40 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.array_utils import byte_bounds

#: devices generated from one stream (as :data:`lcfed.data.generated.BLOCK`)
BLOCK = 4096
#: training FLOPs per sample per FLOP of a forward pass: forward + backward (the backward pass costs ~2 forwards)
FORWARD_BACKWARD = 3.0
#: availability kinds of :func:`synthetic_fleet`
AVAILABILITY = ("always", "diurnal", "iid")

# one stream per generated quantity: adding a quantity never shifts another's draws
_SPEED = 0xF1EE7_01
_LINK = 0xF1EE7_02
_PHASE = 0xF1EE7_03
_SLOTS = 0xF1EE7_04
_GROUP = 0xF1EE7_05


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


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _constant(value: float, m: int, dtype: type) -> np.ndarray:
    """m copies of one value as a read-only zero-stride view: one value of memory however many devices."""
    return np.broadcast_to(np.array(value, dtype=dtype), (m,))


def _blocks(m: int) -> range:
    return range(-(-m // BLOCK))


def _normal(m: int, seed: int, stream: int) -> np.ndarray:
    """m standard normals, block b of BLOCK devices from ``default_rng([seed, stream, b])`` (a full block is
    always drawn, so device d's draw does not depend on m)."""
    out = np.empty(m, dtype=np.float64)
    for b in _blocks(m):
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, m)
        out[lo:hi] = np.random.default_rng([seed, stream, b]).standard_normal(BLOCK)[: hi - lo]
    return out


def _uniform(m: int, seed: int, stream: int, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    """m uniforms in [low, high), per block as :func:`_normal`."""
    out = np.empty(m, dtype=np.float64)
    for b in _blocks(m):
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, m)
        out[lo:hi] = np.random.default_rng([seed, stream, b]).uniform(low, high, BLOCK)[: hi - lo]
    return out


def _lognormal_speed(m: int, seed: int, stream: int, median: float, sigma: float, name: str) -> np.ndarray:
    """float32 speeds median * exp(sigma * z), z ~ N(0, 1) per device; a constant view when sigma is 0 or the
    median infinite."""
    if sigma == 0.0 or math.isinf(median):
        return _constant(median, m, np.float32)
    speed = (median * np.exp(sigma * _normal(m, seed, stream))).astype(np.float32)
    if m and not (speed.min() > 0):
        raise ValueError(f"{name} underflows float32 at this sigma ({sigma}): use a smaller one")
    return _readonly(speed)


def _check_seed(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def synthetic_fleet(
    num_devices: int,
    seed: int,
    *,
    gflops: float,
    bandwidth_mbps: float,
    speed_sigma: float = 0.0,
    bandwidth_sigma: float = 0.0,
    latency_s: float = 0.0,
    dropout: float = 0.0,
    availability: str = "always",
    online_fraction: float = 1.0,
    period_s: float = 86400.0,
    slot_s: float = 3600.0,
    phases: np.ndarray | None = None,
) -> Fleet:
    """A generated fleet of ``num_devices`` devices, a pure function of its arguments and ``seed``.

    - Speed: flops = gflops * 1e9 * exp(speed_sigma * z), z ~ N(0, 1) per device: lognormal with median
      gflops * 1e9 FLOP/s and log-standard-deviation speed_sigma (0: every device exactly float32(gflops * 1e9)).
    - Links: up_bps = down_bps = bandwidth_mbps * 1e6 * exp(bandwidth_sigma * z'), z' ~ N(0, 1) from a stream of
      its own (independent of the speed); the same value both ways. ``np.inf`` (either) = infinitely fast.
    - latency_s (seconds per transfer, each direction) and dropout: the same for every device.
    - availability ``"always"``: no pattern (every device always online).
    - ``"diurnal"``: one online window of online_fraction * period_s per period, starting at phase * period_s;
      phase ~ uniform[0, 1) per device from a stream of its own, or ``phases`` when given. A window that wraps
      past the period's end is stored as two intervals, [0, a) and [b, period_s). Every device is online
      exactly online_fraction of the time.
    - ``"iid"``: the period is cut into slots of slot_s (period_s a multiple of slot_s); each slot is online
      independently with probability online_fraction, adjacent online slots merged into one interval. A
      device that draws no online slot at all gets one slot chosen uniformly, so every device is online
      sometime (the online share is then slightly above online_fraction: by (1 - f)^K / K for K slots).
    - online_fraction 1 means always online for either kind (no pattern is stored).

    Each quantity is drawn per block of :data:`BLOCK` devices from ``default_rng([seed, STREAM, block])``.
    """
    m = int(num_devices)
    if m < 0:
        raise ValueError(f"num_devices must be >= 0, got {num_devices}")
    _check_seed(seed)
    for name, value in (("gflops", gflops), ("bandwidth_mbps", bandwidth_mbps)):
        if math.isnan(value) or value <= 0:
            raise ValueError(f"{name} must be > 0 (np.inf: infinitely fast), got {value}")
    for name, value in (("speed_sigma", speed_sigma), ("bandwidth_sigma", bandwidth_sigma)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    if not (math.isfinite(latency_s) and latency_s >= 0):
        raise ValueError(f"latency_s must be finite and >= 0, got {latency_s}")
    if not (0.0 <= dropout < 1.0):
        raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
    if availability not in AVAILABILITY:
        raise ValueError(f"unknown availability {availability!r}: one of {', '.join(AVAILABILITY)}")
    if not (0.0 < online_fraction <= 1.0):
        raise ValueError(f"online_fraction must lie in (0, 1], got {online_fraction}")
    if not (math.isfinite(period_s) and period_s > 0):
        raise ValueError(f"period_s must be finite and > 0, got {period_s}")
    if not (math.isfinite(slot_s) and slot_s > 0):
        raise ValueError(f"slot_s must be finite and > 0, got {slot_s}")
    if phases is not None:
        if availability != "diurnal":
            raise ValueError(f"phases are for diurnal availability, not {availability!r}")
        phases = np.asarray(phases, dtype=np.float64)
        if phases.shape != (m,):
            raise ValueError(f"phases must have shape ({m},), one per device, got {phases.shape}")
        bad = np.flatnonzero(~((phases >= 0.0) & (phases < 1.0)))
        if bad.size:
            raise ValueError(f"phases must lie in [0, 1): device {bad[0]} has {phases[bad[0]]}")
    slots = 0
    if availability == "iid":
        slots = round(period_s / slot_s)
        if slots < 1 or not math.isclose(slots * slot_s, period_s, rel_tol=1e-12):
            raise ValueError(f"period_s ({period_s}) must be a multiple of slot_s ({slot_s}) for iid availability")

    flops = _lognormal_speed(m, seed, _SPEED, gflops * 1e9, speed_sigma, "flops")
    link = _lognormal_speed(m, seed, _LINK, bandwidth_mbps * 1e6, bandwidth_sigma, "bandwidth")
    latency = _constant(latency_s, m, np.float32)
    drop = _constant(dropout, m, np.float32)
    if availability == "always" or online_fraction == 1.0:
        return Fleet(flops, link, link, latency, drop)
    if availability == "diurnal":
        phase = phases if phases is not None else _uniform(m, seed, _PHASE)
        offsets, starts, ends = _diurnal(phase, online_fraction, period_s)
    else:
        offsets, starts, ends = _iid(m, seed, online_fraction, period_s, slot_s, slots)
    period = _constant(period_s, m, np.float64)
    return Fleet(flops, link, link, latency, drop, _readonly(offsets), _readonly(starts), _readonly(ends), period)


def _diurnal(phase: np.ndarray, fraction: float, period: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of one window [phase * period, + fraction * period) per device, split in two where it wraps."""
    m = len(phase)
    start = np.minimum(phase * period, np.nextafter(period, 0.0))  # phase < 1 must stay below the period
    end = start + fraction * period
    wraps = end > period
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(1 + wraps, out=offsets[1:])
    n = int(offsets[-1])
    starts, ends = np.empty(n), np.empty(n)
    first = offsets[:-1]
    starts[first] = np.where(wraps, 0.0, start)  # a wrapped window: [0, end - period) first ...
    ends[first] = np.where(wraps, end - period, end)
    second = first[wraps] + 1  # ... then [start, period)
    starts[second] = start[wraps]
    ends[second] = period
    return offsets, starts, ends


def _iid(m: int, seed: int, fraction: float, period: float, slot: float, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of i.i.d. online slots (probability ``fraction`` each, adjacent ones merged), per block of devices;
    a device with no online slot gets one slot drawn uniformly."""
    counts = np.zeros(m, dtype=np.int64)
    starts, ends = [], []
    for b in _blocks(m):
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, m)
        rng = np.random.default_rng([seed, _SLOTS, b])
        on = (rng.random((BLOCK, k)) < fraction)[: hi - lo]
        rescue = rng.integers(0, k, BLOCK)[: hi - lo]
        none = ~on.any(axis=1)
        on[np.flatnonzero(none), rescue[none]] = True
        padded = np.zeros((hi - lo, k + 2), dtype=bool)
        padded[:, 1:-1] = on
        rises = padded[:, 1:-1] & ~padded[:, :-2]  # an online slot after an offline one: a run starts
        falls = padded[:, 1:-1] & ~padded[:, 2:]  # an online slot before an offline one: a run ends
        rows, first = np.nonzero(rises)  # row-major: sorted by device, then by slot
        _, last = np.nonzero(falls)
        counts[lo:hi] = np.bincount(rows, minlength=hi - lo)
        starts.append(first * slot)
        ends.append(np.where(last == k - 1, period, (last + 1) * slot))
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    cat = (np.concatenate(starts), np.concatenate(ends)) if starts else (np.empty(0), np.empty(0))
    return offsets, cat[0].astype(np.float64), cat[1].astype(np.float64)


def group_phases(groups: np.ndarray, seed: int, jitter: float = 0.05) -> np.ndarray:
    """A diurnal phase in [0, 1) per device that follows its group (a testbed's true cluster, a natural user id;
    ints >= 0), so that a group's devices are online together: group g, of G distinct groups, gets base phase
    rank(g) / G (rank among the distinct groups, from 0), and each device adds uniform(-jitter/2, jitter/2)
    noise (per block of :data:`BLOCK` devices, a stream of its own), wrapped into [0, 1)."""
    g = np.asarray(groups)
    if g.ndim != 1 or not (np.issubdtype(g.dtype, np.integer) or g.size == 0):
        raise ValueError(f"groups must be a 1-d array of ints, got shape {g.shape} dtype {g.dtype}")
    if g.size and g.min() < 0:
        raise ValueError(f"groups must be >= 0: device {int(np.argmax(g < 0))} has {g.min()}")
    _check_seed(seed)
    if not (math.isfinite(jitter) and 0.0 <= jitter <= 1.0):
        raise ValueError(f"jitter must lie in [0, 1], got {jitter}")
    distinct, rank = np.unique(g, return_inverse=True)
    base = rank.astype(np.float64) / max(len(distinct), 1)
    phase = np.mod(base + _uniform(len(g), seed, _GROUP, -jitter / 2, jitter / 2), 1.0)
    return np.where(phase >= 1.0, 0.0, phase)  # mod of a tiny negative rounds to 1.0


def fleet_from_arrays(
    flops: np.ndarray,
    up_bps: np.ndarray,
    down_bps: np.ndarray,
    latency: np.ndarray,
    dropout: np.ndarray,
    offsets: np.ndarray | None = None,
    starts: np.ndarray | None = None,
    ends: np.ndarray | None = None,
    period: np.ndarray | None = None,
) -> Fleet:
    """A :class:`Fleet` from given arrays (a trace's), copied into its dtypes and validated: one value per device
    for each quantity; flops, up_bps, down_bps > 0 (``np.inf`` = infinitely fast); latency finite and >= 0;
    dropout in [0, 1); availability all four arrays or none, offsets int64[m+1] from 0 non-decreasing to
    len(starts), and per device intervals with 0 <= start < end <= period, sorted and non-overlapping (touching
    allowed), period finite and > 0. Raises ValueError naming the array and the first bad device."""
    f32 = {name: np.array(a, dtype=np.float32) for name, a in
           (("flops", flops), ("up_bps", up_bps), ("down_bps", down_bps), ("latency", latency), ("dropout", dropout))}
    if f32["flops"].ndim != 1:
        raise ValueError(f"flops must be 1-d, one value per device, got shape {f32['flops'].shape}")
    m = len(f32["flops"])
    for name, a in f32.items():
        if a.shape != (m,):
            raise ValueError(f"{name} must be 1-d with one value per device ({m}), got shape {a.shape}")
    for name in ("flops", "up_bps", "down_bps"):
        _first_bad(name, ~(f32[name] > 0), "must be > 0 (np.inf: infinitely fast)", f32[name])
    _first_bad("latency", ~(np.isfinite(f32["latency"]) & (f32["latency"] >= 0)), "must be finite and >= 0", f32["latency"])
    _first_bad("dropout", ~((f32["dropout"] >= 0) & (f32["dropout"] < 1)), "must lie in [0, 1)", f32["dropout"])
    flops_, up_, down_, latency_, dropout_ = (_readonly(f32[k]) for k in f32)
    given = [a is not None for a in (offsets, starts, ends, period)]
    if not any(given):
        return Fleet(flops_, up_, down_, latency_, dropout_)
    if not all(given):
        raise ValueError("availability needs all of offsets, starts, ends and period, or none of them")
    off = np.asarray(offsets)
    if off.shape != (m + 1,) or not (np.issubdtype(off.dtype, np.integer) or off.size == 0):
        raise ValueError(f"offsets must be ints of shape ({m + 1},), got {off.dtype} {off.shape}")
    off = np.array(off, dtype=np.int64)
    s, e, p = (np.array(a, dtype=np.float64) for a in (starts, ends, period))
    if p.shape != (m,):
        raise ValueError(f"period must have shape ({m},), got {p.shape}")
    _first_bad("period", ~(np.isfinite(p) & (p > 0)), "must be finite and > 0", p)
    if off[0] != 0:
        raise ValueError(f"offsets must start at 0, got {off[0]}")
    _first_bad("offsets", off[1:] < off[:-1], "must not decrease (offsets[d + 1] < offsets[d])", off[1:])
    n = int(off[-1])
    if s.shape != (n,) or e.shape != (n,):
        raise ValueError(f"starts and ends must have shape ({n},) (offsets[-1]), got {s.shape} and {e.shape}")
    dev = np.repeat(np.arange(m), np.diff(off))
    _first_bad("starts", ~(s >= 0), "must be >= 0", s, dev)
    _first_bad("ends", ~(e > s), "must be > the interval's start", e, dev)
    _first_bad("ends", ~(e <= p[dev]), "must be <= the device's period", e, dev)
    same = dev[1:] == dev[:-1]
    _first_bad("starts", same & ~(s[1:] >= e[:-1]), "must be sorted and not overlap the previous interval",
               s[1:], dev[1:])
    return Fleet(flops_, up_, down_, latency_, dropout_, _readonly(off), _readonly(s), _readonly(e), _readonly(p))


def _first_bad(name: str, bad: np.ndarray, rule: str, values: np.ndarray, device: np.ndarray | None = None) -> None:
    """Raise ValueError naming ``name``, the rule, and the first device (``device[i]``, else i) where ``bad``."""
    where = np.flatnonzero(bad)
    if where.size:
        i = int(where[0])
        d = int(device[i]) if device is not None else i
        raise ValueError(f"{name} {rule}: device {d} has {values[i]}")
