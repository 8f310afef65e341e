"""Per-device facts as arrays (lcfed.devices.fleet): the simulated clock's queries by hand, round times,
the generators' distributions, per-block streams, the validation, and the size of a 10^6-device fleet."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lcfed.devices.fleet import BLOCK, Fleet
from lcfed.devices.generators import fleet_from_arrays, group_phases, synthetic_fleet

INF = np.inf


def hand_fleet() -> Fleet:
    """Six devices, periods 24 (devices 0-4) and 10 (device 5):

    0: [0, 2) [20, 24)           a window wrapping past the period's end
    1: [5, 10)
    2: [0, 24)                   the whole period
    3: (none)                    never online
    4: [0, 5) [5, 10) [20, 22) [22, 24)   touching intervals, and a wrap into them
    5: [3, 4)                    period 10
    """
    intervals = [[(0, 2), (20, 24)], [(5, 10)], [(0, 24)], [], [(0, 5), (5, 10), (20, 22), (22, 24)], [(3, 4)]]
    counts = [len(iv) for iv in intervals]
    flat = [x for iv in intervals for x in iv]
    m = len(intervals)
    return fleet_from_arrays(
        np.full(m, 1e9), np.full(m, 1e6), np.full(m, 1e6), np.zeros(m), np.zeros(m),
        offsets=np.concatenate([[0], np.cumsum(counts)]), starts=np.array([s for s, _ in flat], dtype=float),
        ends=np.array([e for _, e in flat], dtype=float), period=np.array([24, 24, 24, 24, 24, 10], dtype=float),
    )


# (t, online, online_until, next_online) for devices 0..5
HAND = [
    (21.0, [1, 0, 1, 0, 1, 0], [26, 21, INF, 21, 34, 21], [21, 29, 21, INF, 21, 23]),
    (10.0, [0, 0, 1, 0, 0, 0], [10, 10, INF, 10, 10, 10], [20, 29, 10, INF, 20, 13]),
    (5.0, [0, 1, 1, 0, 1, 0], [5, 10, INF, 5, 10, 5], [20, 5, 5, INF, 5, 13]),
    (2.0, [0, 0, 1, 0, 1, 0], [2, 2, INF, 2, 10, 2], [20, 5, 2, INF, 2, 3]),
    (0.0, [1, 0, 1, 0, 1, 0], [2, 0, INF, 0, 10, 0], [0, 5, 0, INF, 0, 3]),
    (23.5, [1, 0, 1, 0, 1, 1], [26, 23.5, INF, 23.5, 34, 24], [23.5, 29, 23.5, INF, 23.5, 23.5]),
    (3.0, [0, 0, 1, 0, 1, 1], [3, 3, INF, 3, 10, 4], [20, 5, 3, INF, 3, 3]),
]


@pytest.mark.parametrize("shift", [0.0, 240.0, 240_000.0, 24e6])  # periods 24 and 10 both repeat every 240 s
@pytest.mark.parametrize("case", HAND, ids=[f"t={c[0]}" for c in HAND])
def test_time_queries_by_hand_wrap_and_repetition(case, shift):
    t, online, until, nxt = case
    fleet = hand_fleet()
    assert fleet.num_devices == 6 and not fleet.always_online
    everyone = np.arange(6)
    np.testing.assert_array_equal(fleet.online(t + shift), np.array(online, dtype=bool))
    np.testing.assert_array_equal(fleet.online(t + shift, everyone), np.array(online, dtype=bool))
    np.testing.assert_array_equal(fleet.online_until(t + shift, everyone), np.array(until) + shift)
    np.testing.assert_array_equal(fleet.next_online(t + shift), np.array(nxt) + shift)
    # a subset, in any order, with repeats
    some = np.array([5, 0, 4, 4, 3])
    np.testing.assert_array_equal(fleet.online(t + shift, some), np.array(online, dtype=bool)[some])
    np.testing.assert_array_equal(fleet.online_until(t + shift, some), (np.array(until) + shift)[some])
    np.testing.assert_array_equal(fleet.next_online(t + shift, some), (np.array(nxt) + shift)[some])


def test_queries_on_an_always_online_fleet_and_empty_selections():
    fleet = synthetic_fleet(7, 0, gflops=1.0, bandwidth_mbps=10.0)
    assert fleet.always_online and fleet.offsets is None and fleet.period is None
    assert fleet.online(123.0).all() and len(fleet.online(1.0)) == 7
    np.testing.assert_array_equal(fleet.online_until(5.0, np.array([1, 2])), [INF, INF])
    np.testing.assert_array_equal(fleet.next_online(5.0), np.full(7, 5.0))
    hand = hand_fleet()
    none = np.array([], dtype=np.int64)
    assert hand.online(3.0, none).shape == (0,) and hand.online_until(3.0, none).shape == (0,)
    assert hand.next_online(3.0, none).shape == (0,)
    # a fleet whose devices have no interval at all
    empty = fleet_from_arrays(np.ones(2), np.ones(2), np.ones(2), np.zeros(2), np.zeros(2), offsets=np.zeros(3, int),
                              starts=np.zeros(0), ends=np.zeros(0), period=np.ones(2))
    assert not empty.online(0.5).any()
    np.testing.assert_array_equal(empty.online_until(0.5, np.array([0, 1])), [0.5, 0.5])
    np.testing.assert_array_equal(empty.next_online(0.5), [INF, INF])


def test_bad_queries_are_refused():
    fleet = hand_fleet()
    for bad in (np.array([6]), np.array([-1]), np.array([0.5]), np.zeros((1, 1), int)):
        with pytest.raises(ValueError, match="device"):
            fleet.online(1.0, bad)
    with pytest.raises(ValueError, match="finite"):
        fleet.next_online(np.inf)
    with pytest.raises(ValueError, match="finite"):
        fleet.online_until(np.nan, np.array([0]))


def test_round_seconds_by_hand():
    fleet = fleet_from_arrays(
        flops=np.array([1e9, INF, 2e9]), up_bps=np.array([1e6, INF, 8e6]), down_bps=np.array([2e6, 1e6, INF]),
        latency=np.array([0.5, 0.0, 0.25]), dropout=np.zeros(3))
    down, comp, up = fleet.round_seconds(np.array([0, 1, 2]), np.array([10, 10, 4]), flops_per_sample=1e6,
                                         down_bytes=1e6, up_bytes=5e5)
    assert down.dtype == comp.dtype == up.dtype == np.float64
    # download = latency + 8e6 bits / down_bps; compute = samples * 3 * 1e6 / flops; upload = latency + 4e6 / up_bps
    np.testing.assert_array_equal(down, [0.5 + 4.0, 0.0 + 8.0, 0.25 + 0.0])
    np.testing.assert_allclose(comp, [10 * 3e6 / 1e9, 0.0, 4 * 3e6 / 2e9], rtol=1e-15)
    np.testing.assert_array_equal(up, [0.5 + 4.0, 0.0, 0.25 + 0.5])
    assert comp[1] == 0.0 and up[1] == 0.0 and down[2] == 0.25  # infinitely fast: exactly 0, not nan
    down, comp, up = fleet.round_seconds(np.array([2, 0]), np.array([0, 0]), 0.0, 0.0, 0.0)
    np.testing.assert_array_equal(down, [0.25, 0.5])
    np.testing.assert_array_equal(comp, [0.0, 0.0])
    with pytest.raises(ValueError, match="one count per device"):
        fleet.round_seconds(np.array([0, 1]), np.array([1]), 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="samples"):
        fleet.round_seconds(np.array([0]), np.array([-1]), 1.0, 1.0, 1.0)
    for kwargs in ({"flops_per_sample": -1.0}, {"down_bytes": INF}, {"up_bytes": np.nan}):
        args = {"flops_per_sample": 1.0, "down_bytes": 1.0, "up_bytes": 1.0, **kwargs}
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            fleet.round_seconds(np.array([0]), np.array([1]), **args)


def test_lognormal_speeds_and_links():
    fleet = synthetic_fleet(20_000, 3, gflops=2.0, bandwidth_mbps=10.0, speed_sigma=0.5, bandwidth_sigma=0.8,
                            latency_s=0.05, dropout=0.1)
    assert all(a.dtype == np.float32 and a.shape == (20_000,) for a in
               (fleet.flops, fleet.up_bps, fleet.down_bps, fleet.latency, fleet.dropout))
    log_f, log_b = np.log(fleet.flops.astype(float)), np.log(fleet.up_bps.astype(float))
    assert np.median(fleet.flops) == pytest.approx(2e9, rel=0.03)
    assert log_f.std() == pytest.approx(0.5, rel=0.03)
    assert np.median(fleet.up_bps) == pytest.approx(1e7, rel=0.04)
    assert log_b.std() == pytest.approx(0.8, rel=0.03)
    assert abs(np.corrcoef(log_f, log_b)[0, 1]) < 0.05  # independent streams
    np.testing.assert_array_equal(fleet.up_bps, fleet.down_bps)
    assert (fleet.latency == np.float32(0.05)).all() and (fleet.dropout == np.float32(0.1)).all()
    assert not fleet.flops.flags.writeable and not fleet.latency.flags.writeable
    flat = synthetic_fleet(100, 3, gflops=2.5, bandwidth_mbps=INF)
    assert (flat.flops == 2.5e9).all() and np.isinf(flat.up_bps).all() and np.isinf(flat.down_bps).all()
    fast = synthetic_fleet(10, 3, gflops=INF, bandwidth_mbps=1.0, speed_sigma=1.0)
    assert np.isinf(fast.flops).all()
    # adding a quantity's spread leaves another quantity's draws alone
    sigma_link = synthetic_fleet(300, 3, gflops=2.0, bandwidth_mbps=10.0, speed_sigma=0.5, bandwidth_sigma=0.8)
    sigma_speed = synthetic_fleet(300, 3, gflops=2.0, bandwidth_mbps=10.0, speed_sigma=0.5)
    np.testing.assert_array_equal(sigma_link.flops, sigma_speed.flops)


def interval_lengths(fleet: Fleet) -> np.ndarray:
    """Online seconds per period, per device."""
    assert fleet.offsets is not None and fleet.starts is not None and fleet.ends is not None
    dev = np.repeat(np.arange(fleet.num_devices), np.diff(fleet.offsets))
    return np.bincount(dev, weights=fleet.ends - fleet.starts, minlength=fleet.num_devices)


def check_csr(fleet: Fleet) -> None:
    """The fleet's availability passes fleet_from_arrays' validation."""
    fleet_from_arrays(fleet.flops, fleet.up_bps, fleet.down_bps, fleet.latency, fleet.dropout,
                      fleet.offsets, fleet.starts, fleet.ends, fleet.period)


def test_diurnal_windows():
    fleet = synthetic_fleet(20_000, 5, gflops=1.0, bandwidth_mbps=1.0, availability="diurnal", online_fraction=0.3)
    check_csr(fleet)
    assert fleet.offsets is not None and fleet.starts is not None and fleet.ends is not None
    np.testing.assert_allclose(interval_lengths(fleet), 0.3 * 86400.0, rtol=1e-12)  # every device, exactly
    counts = np.diff(fleet.offsets)
    assert set(counts.tolist()) == {1, 2} and (counts == 2).mean() == pytest.approx(0.3, abs=0.02)  # wraps
    two = np.flatnonzero(counts == 2)
    assert (fleet.starts[fleet.offsets[two]] == 0.0).all() and (fleet.ends[fleet.offsets[two] + 1] == 86400.0).all()
    # a wrapped window is one stretch: online_until runs into the next period
    d = two[:50]
    s2 = fleet.starts[fleet.offsets[d] + 1]
    t = 3 * 86400.0 + (float(s2.max()) + 86400.0) / 2  # within every [s2, P)
    np.testing.assert_allclose(fleet.online_until(t, d), 4 * 86400.0 + fleet.ends[fleet.offsets[d]], rtol=1e-15)
    shares = np.mean([fleet.online(t).mean() for t in np.linspace(0, 86400, 24, endpoint=False)])
    assert shares == pytest.approx(0.3, abs=0.01)
    # given phases; phase 0.9 with 30% online wraps: [0, 0.2 P) and [0.9 P, P)
    given = synthetic_fleet(3, 0, gflops=1.0, bandwidth_mbps=1.0, availability="diurnal", online_fraction=0.3,
                            period_s=100.0, phases=np.array([0.0, 0.5, 0.9]))
    assert given.offsets is not None and given.starts is not None and given.ends is not None
    np.testing.assert_array_equal(given.offsets, [0, 1, 2, 4])
    np.testing.assert_allclose(given.starts, [0.0, 50.0, 0.0, 90.0])
    np.testing.assert_allclose(given.ends, [30.0, 80.0, 20.0, 100.0])
    assert synthetic_fleet(5, 0, gflops=1.0, bandwidth_mbps=1.0, availability="diurnal", online_fraction=1.0).always_online


def test_iid_slots():
    fleet = synthetic_fleet(20_000, 2, gflops=1.0, bandwidth_mbps=1.0, availability="iid", online_fraction=0.3)
    check_csr(fleet)
    assert fleet.offsets is not None and fleet.starts is not None and fleet.ends is not None
    share = interval_lengths(fleet) / 86400.0
    assert share.mean() == pytest.approx(0.3, abs=0.01) and share.std() > 0.05  # a share per device, around 0.3
    assert np.allclose(fleet.starts % 3600.0, 0.0) and np.allclose(np.mod(fleet.ends, 3600.0), 0.0)
    same = np.repeat(np.arange(20_000), np.diff(fleet.offsets))
    inner = same[1:] == same[:-1]
    assert (fleet.starts[1:][inner] > fleet.ends[:-1][inner]).all()  # adjacent online slots merged
    # hardly any slot online: every device still gets one (an hour a day)
    rare = synthetic_fleet(5_000, 2, gflops=1.0, bandwidth_mbps=1.0, availability="iid", online_fraction=0.001)
    assert rare.offsets is not None
    assert (np.diff(rare.offsets) >= 1).all() and np.isfinite(rare.next_online(0.0)).all()
    assert (interval_lengths(rare) >= 3600.0).all()
    with pytest.raises(ValueError, match="multiple of slot_s"):
        synthetic_fleet(5, 0, gflops=1.0, bandwidth_mbps=1.0, availability="iid", online_fraction=0.5,
                        period_s=100.0, slot_s=30.0)


def test_group_phases_follow_groups():
    groups = np.array([7, 3, 7, 12, 3, 12, 7] * 300)
    phases = group_phases(groups, seed=1, jitter=0.05)
    assert phases.shape == groups.shape and ((phases >= 0) & (phases < 1)).all()
    base = {3: 0.0, 7: 1 / 3, 12: 2 / 3}  # ranks 0, 1, 2 of three groups
    for g, b in base.items():
        p = phases[groups == g]
        gap = np.abs((p - b + 0.5) % 1.0 - 0.5)  # circular distance to the group's base phase
        assert gap.max() <= 0.025 + 1e-12 and p.std() > 0.005
    np.testing.assert_allclose(group_phases(groups, seed=1, jitter=0.0), [base[g] for g in groups])
    np.testing.assert_array_equal(group_phases(groups, seed=1), phases)
    assert not np.array_equal(group_phases(groups, seed=2), phases)
    # a group's devices are online together
    fleet = synthetic_fleet(len(groups), 0, gflops=1.0, bandwidth_mbps=1.0, availability="diurnal",
                            online_fraction=0.25, phases=phases)
    on = fleet.online(86400.0 * (1 / 3 + 0.1))
    assert on[groups == 7].all() and not on[groups != 7].any()
    with pytest.raises(ValueError, match="groups"):
        group_phases(np.array([0, -1]), 0)
    with pytest.raises(ValueError, match="groups"):
        group_phases(np.array([0.5]), 0)
    with pytest.raises(ValueError, match="jitter"):
        group_phases(np.array([0, 1]), 0, jitter=-0.1)


def prefix(fleet: Fleet, m: int) -> tuple:
    """Device 0..m-1's values, availability included."""
    out: tuple = (fleet.flops[:m], fleet.up_bps[:m], fleet.down_bps[:m])
    if fleet.offsets is not None and fleet.starts is not None and fleet.ends is not None:
        n = fleet.offsets[m]
        out += (fleet.offsets[: m + 1], fleet.starts[:n], fleet.ends[:n])
    return out


@pytest.mark.parametrize("availability", ["always", "diurnal", "iid"])
def test_blocks_do_not_depend_on_the_number_of_devices(availability):
    kwargs = {"gflops": 1.0, "bandwidth_mbps": 5.0, "speed_sigma": 0.7, "bandwidth_sigma": 0.4,
              "availability": availability, "online_fraction": 0.4}
    small, big = synthetic_fleet(5000, 9, **kwargs), synthetic_fleet(13_000, 9, **kwargs)
    for a, b in zip(prefix(small, 5000), prefix(big, 5000), strict=True):
        np.testing.assert_array_equal(a, b)
    again = synthetic_fleet(5000, 9, **kwargs)
    for a, b in zip(prefix(small, 5000), prefix(again, 5000), strict=True):
        np.testing.assert_array_equal(a, b)
    other = synthetic_fleet(5000, 10, **kwargs)
    assert not np.array_equal(small.flops, other.flops)
    # blocks have streams of their own: the second block does not repeat the first
    assert not np.array_equal(big.flops[:BLOCK], big.flops[BLOCK : 2 * BLOCK])
    groups = np.arange(13_000) % 5
    np.testing.assert_array_equal(group_phases(groups[:5000], 4), group_phases(groups, 4)[:5000])


BASE = {"gflops": 1.0, "bandwidth_mbps": 1.0}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"speed_sigma": -0.1}, "speed_sigma"),
    ({"bandwidth_sigma": -1.0}, "bandwidth_sigma"),
    ({"gflops": 0.0}, "gflops"),
    ({"bandwidth_mbps": -1.0}, "bandwidth_mbps"),
    ({"gflops": np.nan}, "gflops"),
    ({"latency_s": -0.1}, "latency_s"),
    ({"dropout": 1.0}, "dropout"),
    ({"dropout": -0.1}, "dropout"),
    ({"availability": "weekly"}, "unknown availability"),
    ({"availability": "diurnal", "online_fraction": 0.0}, "online_fraction"),
    ({"availability": "iid", "online_fraction": 1.5}, "online_fraction"),
    ({"availability": "diurnal", "online_fraction": 0.5, "period_s": 0.0}, "period_s"),
    ({"availability": "iid", "online_fraction": 0.5, "slot_s": -1.0}, "slot_s"),
    ({"availability": "diurnal", "online_fraction": 0.5, "phases": np.zeros(3)}, "phases must have shape"),
    ({"availability": "diurnal", "online_fraction": 0.5, "phases": np.array([0.1, 1.0, 0.2, 0.3])}, "device 1"),
    ({"availability": "iid", "online_fraction": 0.5, "phases": np.zeros(4)}, "phases are for diurnal"),
])
def test_synthetic_fleet_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_fleet(4, 0, **{**BASE, **kwargs})


def test_synthetic_fleet_refuses_bad_counts_and_seeds():
    with pytest.raises(ValueError, match="num_devices"):
        synthetic_fleet(-1, 0, **BASE)
    with pytest.raises(ValueError, match="seed"):
        synthetic_fleet(3, -1, **BASE)


def arrays(**changes):
    """Two devices' valid arrays (device 0: [1, 2) [3, 4); device 1: [0, 5) of period 10), with changes."""
    a = {"flops": np.array([1e9, INF]), "up_bps": np.array([1e6, 1e6]), "down_bps": np.array([1e6, INF]),
         "latency": np.array([0.0, 0.1]), "dropout": np.array([0.0, 0.5]), "offsets": np.array([0, 2, 3]),
         "starts": np.array([1.0, 3.0, 0.0]), "ends": np.array([2.0, 4.0, 5.0]), "period": np.array([10.0, 10.0])}
    return {**a, **changes}


def test_fleet_from_arrays_accepts_and_copies():
    given = arrays()
    fleet = fleet_from_arrays(**given)
    assert fleet.flops.dtype == np.float32 and fleet.offsets is not None and fleet.offsets.dtype == np.int64
    assert fleet.starts is not None and fleet.starts.dtype == np.float64 and not fleet.starts.flags.writeable
    given["starts"][0] = 1.5
    assert fleet.starts[0] == 1.0  # a copy: the caller's array stays its own
    touching = fleet_from_arrays(**arrays(starts=np.array([1.0, 2.0, 0.0])))
    np.testing.assert_array_equal(touching.online_until(1.5, np.array([0, 1])), [4.0, 5.0])
    # touching intervals that cover the whole period: online for good
    whole = fleet_from_arrays(**arrays(starts=np.array([0.0, 4.0, 0.0]), ends=np.array([4.0, 10.0, 5.0])))
    np.testing.assert_array_equal(whole.online_until(1e6 + 3.0, np.array([0, 1])), [INF, 1e6 + 5.0])
    plain = fleet_from_arrays(**{k: v for k, v in arrays().items() if k in ("flops", "up_bps", "down_bps", "latency", "dropout")})
    assert plain.always_online
    assert fleet.nbytes() == 5 * 2 * 4 + 3 * 8 + 2 * 3 * 8 + 2 * 8


@pytest.mark.parametrize(("changes", "match"), [
    ({"flops": np.array([1e9, 0.0])}, r"flops must be > 0.*device 1"),
    ({"up_bps": np.array([-1.0, 1.0])}, r"up_bps must be > 0.*device 0"),
    ({"down_bps": np.array([1.0, np.nan])}, r"down_bps must be > 0.*device 1"),
    ({"latency": np.array([0.0, INF])}, r"latency must be finite.*device 1"),
    ({"dropout": np.array([1.0, 0.0])}, r"dropout must lie in \[0, 1\).*device 0"),
    ({"dropout": np.array([0.0, 0.5, 0.1])}, r"dropout must be 1-d"),
    ({"flops": np.ones((2, 1))}, r"flops must be 1-d"),
    ({"period": None}, "all of offsets"),
    ({"offsets": np.array([0, 3])}, r"offsets must be ints of shape \(3,\)"),
    ({"offsets": np.array([0.0, 2.0, 3.0])}, "offsets must be ints"),
    ({"offsets": np.array([1, 2, 3])}, "offsets must start at 0"),
    ({"offsets": np.array([0, 2, 1]), "starts": np.array([1.0]), "ends": np.array([2.0])}, r"offsets must not decrease.*device 1"),
    ({"starts": np.array([1.0, 3.0])}, r"starts and ends must have shape \(3,\)"),
    ({"period": np.array([10.0, 0.0])}, r"period must be finite and > 0.*device 1"),
    ({"starts": np.array([1.0, 3.0, -1.0])}, r"starts must be >= 0.*device 1"),
    ({"ends": np.array([2.0, 3.0, 5.0])}, r"ends must be > the interval's start.*device 0"),
    ({"ends": np.array([2.0, 4.0, 11.0])}, r"ends must be <= the device's period.*device 1"),
    ({"starts": np.array([3.0, 1.0, 0.0]), "ends": np.array([4.0, 2.0, 5.0])}, r"starts must be sorted.*device 0"),
    ({"starts": np.array([1.0, 1.5, 0.0])}, r"starts must be sorted.*device 0"),
])
def test_fleet_from_arrays_names_the_array_and_device(changes, match):
    with pytest.raises(ValueError, match=match):
        fleet_from_arrays(**arrays(**changes))


def test_a_million_devices_fit_in_memory():
    m = 1_000_000
    t0 = time.perf_counter()
    fleet = synthetic_fleet(m, 0, gflops=2.0, bandwidth_mbps=20.0, speed_sigma=0.5, bandwidth_sigma=0.5,
                            latency_s=0.05, dropout=0.05, availability="diurnal", online_fraction=0.5)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    on = fleet.online(40_000.0)
    until = fleet.online_until(40_000.0, np.flatnonzero(on))
    nxt = fleet.next_online(40_000.0)
    queried = time.perf_counter() - t0
    mb = fleet.nbytes() / 1e6
    print(f"\n10^6 diurnal devices: built in {built:.2f} s, {mb:.1f} MB; online + online_until + next_online "
          f"over all devices in {queried:.2f} s")
    assert fleet.num_devices == m and on.mean() == pytest.approx(0.5, abs=0.01)
    assert (until > 40_000.0).all() and (nxt >= 40_000.0).all()
    assert mb < 64
