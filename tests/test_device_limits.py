"""Issue 49: the device model's impossible schedules and their bounds, in-process and cheap: the longest online
stretch by hand, runs that could never keep any work refused before the first round (quickly), and an
asynchronous buffer that does not fill stopped with the settings named. The CLI's rows: tests/test_bad_inputs.py."""

from __future__ import annotations

import json
import re

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


class _Rounds:
    """Counts the rounds a run played (none: it was refused before any work)."""

    def __init__(self) -> None:
        self.rounds = 0

    def on_start(self, cfg, fed) -> None: ...

    def on_round(self, rnd, metrics, stats) -> None:
        self.rounds += 1

    def on_end(self, result) -> None: ...


def test_a_trace_never_online_is_refused_before_any_work(tmp_path):
    """Sync and async alike; how long the refusal takes is measured in the issue's note, not asserted here."""
    trace = tmp_path / "av.json"
    trace.write_text(json.dumps({str(i): {"active": [], "inactive": [], "finish_time": 60} for i in range(1, 4)}))
    for extra in ((), ASYNC[1:]):
        cfg = tiny_config("devices.simulate=true", "devices.availability=trace",
                          f"devices.availability_trace={trace}", *extra)
        played = _Rounds()
        with pytest.raises(ConfigError, match="no training device is ever online"):
            run_local(cfg, [played])
        assert played.rounds == 0


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


@pytest.mark.parametrize("kind,name,text,want", [
    ("availability", "av.csv", "id,active,inactive,finish_time\n1,0,1,9\n1,2,3,9\n2,0,1,9\n", "holds 3 rows; at most 2 online"),
    ("availability", "av.json", '{"1": {"active": [0, 2], "inactive": [1, 3], "finish_time": 9}, '
     '"2": {"active": [0], "inactive": [1], "finish_time": 9}}', "holds more than 2 online intervals (client 2"),
    ("capacity", "cap.csv", "id,computation,communication\n1,5,5\n2,5,5\n3,5,5\n", "holds 3 rows; at most 2 clients"),
    ("capacity", "cap.json", '[{"id": 1, "computation": 5, "communication": 5}, {"id": 2, "computation": 5, '
     '"communication": 5}, {"id": 3, "computation": 5, "communication": 5}]', "holds 3 records; at most 2 clients"),
])
def test_a_trace_over_its_budget_is_refused_naming_the_limit(kind, name, text, want, tmp_path, monkeypatch):
    """The budget, made small: clients and intervals are counted in every format (tests/test_bad_inputs.py has
    the real limits against a pickle whose shared lists expand, and a pickle nested 100,000 deep)."""
    from lcfed.devices import trace_budget, traces

    monkeypatch.setattr(trace_budget, "MAX_CLIENTS", 2)
    monkeypatch.setattr(trace_budget, "MAX_INTERVALS", 2)
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(traces.TraceError, match=re.escape(want)) as err:
        (traces.read_availability if kind == "availability" else traces.read_capacity)(path)
    assert str(err.value).startswith(f"devices.{kind}_trace: {path}: ")
