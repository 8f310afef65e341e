"""Where fleets come from: seeded synthetic fleets (:func:`synthetic_fleet`: lognormal speeds and links, diurnal or
i.i.d. availability, phases per device or per true group) and fleets from given arrays (:func:`fleet_from_arrays`:
a trace's speeds, links and intervals, every value checked).

Synthetic fleets are generated in blocks of :data:`~lcfed.devices.fleet.BLOCK` devices, each block and each
quantity from a stream of its own, ``np.random.default_rng([seed, STREAM, block])``: device d's values depend on
the seed and the arguments only, not on the number of devices, any block can be rebuilt alone, and adding a
quantity never shifts another.
"""

from __future__ import annotations

import math

import numpy as np

from lcfed.devices.fleet import AVAILABILITY, BLOCK, Fleet, readonly

# one stream per generated quantity: adding a quantity never shifts another's draws
_SPEED = 0xF1EE7_01


_LINK = 0xF1EE7_02


_PHASE = 0xF1EE7_03


_SLOTS = 0xF1EE7_04


_GROUP = 0xF1EE7_05


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
    return readonly(speed)


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
    return Fleet(flops, link, link, latency, drop, readonly(offsets), readonly(starts), readonly(ends), period)


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
    flops_, up_, down_, latency_, dropout_ = (readonly(f32[k]) for k in f32)
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
    return Fleet(flops_, up_, down_, latency_, dropout_, readonly(off), readonly(s), readonly(e), readonly(p))


def _first_bad(name: str, bad: np.ndarray, rule: str, values: np.ndarray, device: np.ndarray | None = None) -> None:
    """Raise ValueError naming ``name``, the rule, and the first device (``device[i]``, else i) where ``bad``."""
    where = np.flatnonzero(bad)
    if where.size:
        i = int(where[0])
        d = int(device[i]) if device is not None else i
        raise ValueError(f"{name} {rule}: device {d} has {values[i]}")
