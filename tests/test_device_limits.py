"""Issue 49: the device model's impossible schedules and their bounds, in-process and cheap: the longest online
stretch by hand, runs that could never keep any work refused before the first round (quickly), and an
asynchronous buffer that does not fill stopped with the settings named. The CLI's rows: tests/test_bad_inputs.py."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from lcfed.devices.buffered import BufferedScheduler
from lcfed.devices.clock import SimClock
from lcfed.devices.feasible import MAX_STARTS_PER_UPDATE, longest_online
from lcfed.devices.generators import fleet_from_arrays
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.run.setup import prepare
from tests.conftest import tiny_config

ASYNC = ("devices.simulate=true", "method.name=fedavg", "devices.aggregation=async", "devices.async_buffer=2",
         "train.participation=0.5")


def _fleet(offsets, starts, ends, period):
    m = len(period)
    one = np.ones(m, np.float32)
    return fleet_from_arrays(one, one, one, 0 * one, 0 * one, np.asarray(offsets), np.asarray(starts, float),
                             np.asarray(ends, float), np.asarray(period, float))


def test_longest_online_by_hand():
    """Device 0: [0, 2) [2, 3) [5, 6) in 10 -> 3 (touching joined). Device 1: never. Device 2: [0, 1) [8, 10) in
    10 -> 3 (wraps into the next period). Device 3: [0, 4) [4, 10) in 10 -> always (inf). Device 4: [1, 9) -> 8."""
    fleet = _fleet([0, 3, 3, 5, 7, 8], [0, 2, 5, 0, 8, 0, 4, 1], [2, 3, 6, 1, 10, 4, 10, 9], [10] * 5)
    assert longest_online(fleet).tolist() == [3.0, 0.0, 3.0, np.inf, 8.0]


def test_a_trace_never_online_is_refused_before_any_work_and_quickly(tmp_path):
    trace = tmp_path / "av.json"
    trace.write_text(json.dumps({str(i): {"active": [], "inactive": [], "finish_time": 60} for i in range(1, 4)}))
    prepare(tiny_config())  # warm: digits, imports
    for extra in ((), ASYNC[1:]):
        cfg = tiny_config("devices.simulate=true", "devices.availability=trace",
                          f"devices.availability_trace={trace}", *extra)
        began = time.perf_counter()
        with pytest.raises(ConfigError, match="no training device is ever online"):
            run_local(cfg)
        assert time.perf_counter() - began < 2.0


def test_an_async_buffer_that_never_fills_is_stopped_naming_the_settings():
    """Dropout 0.99999: the buffer of 2 would take ~2e5 starts; the server stops at MAX_STARTS_PER_UPDATE per
    update with one line naming the dropout and the buffer (a ConfigError, so the CLI prints it as one line)."""
    cfg = tiny_config(*ASYNC, "devices.dropout=0.99999")
    fed = prepare(cfg).federation
    assert fed.fleet is not None
    s = BufferedScheduler(cfg, fed, fed.fleet)
    with pytest.raises(ConfigError) as err:
        s.plan(0, SimClock(0.0, 0.0, 0.0), None)
    msg = str(err.value)
    assert msg.startswith("devices.dropout: got 0.99999; aggregation 0 started") and "\n" not in msg
    assert f"({MAX_STARTS_PER_UPDATE:,} per update it needs)" in msg and "devices.async_buffer=2" in msg
