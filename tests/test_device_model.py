"""The device model: the round's schedule on the simulated clock (hand-checked), ideal devices equal today's
runs, resume and bad input. Ray = in-process is one case of tests/test_engines.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lcfed.devices.clock import RoundTiming, SimClock
from lcfed.devices.generators import fleet_from_arrays
from lcfed.devices.schedule import Scheduler
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.run.loop import load_resume
from lcfed.run.setup import prepare
from tests.conftest import same_metrics, tiny_config

DEVICES = ("devices.simulate=true",)


def test_ideal_devices_give_todays_numbers():
    """Always online, no deadline, no dropout, no over-commitment: the same participants and numbers as
    without the device model, at finite and at (all but) infinite speeds; only the device model's metrics are added."""
    base = ("train.participation=0.5", "method.name=ifca", "train.rounds=2")  # 2: a round after the first, as at 4
    for extra in ([], ["network.device_gflops=1e15", "network.bandwidth_mbps=1e15"]):
        today = run_local(tiny_config(*base, *extra))
        simulated = run_local(tiny_config(*base, *DEVICES, *extra))
        same_metrics(today.history, simulated.history)
        added = set(simulated.history[-1]) - set(today.history[-1])
        assert added == {"sim_clock_seconds", "sim_round_seconds", "devices_online", "devices_selected",
                         "devices_kept", "devices_dropped"}
        assert [r["devices_kept"] for r in simulated.history] == [4.0] * 2
    clock = [r["sim_clock_seconds"] for r in simulated.history]
    assert 0 < clock[0] and clock[-1] < 1e-9  # (all but) infinitely fast devices take (all but) no time
    assert np.array_equal(today.assignment, simulated.assignment)


def _scheduler(fleet, *extra: str) -> Scheduler:
    cfg = tiny_config("train.participation=0.5", *DEVICES, *extra)
    fed = prepare(cfg).federation
    return Scheduler(cfg, fed, fleet)


def _fleet(flops, **kw):
    m = len(flops)
    flops = np.asarray(flops, dtype=np.float32)
    inf = np.full(m, np.inf, dtype=np.float32)
    return fleet_from_arrays(flops, kw.get("up", inf), kw.get("down", inf), np.zeros(m, np.float32),
                             np.asarray(kw.get("dropout", np.zeros(m)), np.float32), *kw.get("avail", ()))


def test_the_first_k_to_finish_are_kept_and_the_round_ends_with_the_last_of_them():
    """8 devices, k = 4, over-commitment 1 selects all 8; the 4 fastest are kept. Compute seconds by hand:
    local steps x 4 samples x 3 x F FLOPs at the device's FLOP/s."""
    speeds = [1e6, 2e6, 4e6, 8e6, 3e6, 5e6, 6e6, 7e6]
    s = _scheduler(_fleet(speeds), "devices.overcommit=1.0", "train.batch_size=4")
    assert s.samples[0] == s.cfg.train.local_steps * 4
    work = s.samples[0] * 3 * s.fed.flops_per_sample
    t = s.plan(0, SimClock(100.0, 0.0, 0.0))
    assert (t.selected, t.online, t.kept) == (8, 8, (3, 5, 6, 7))
    assert t.start == 100.0 and math.isclose(t.end, 100.0 + work / 5e6, rel_tol=1e-6)
    assert t.lost == 4
    # a deadline only the two fastest make: fewer than k kept, the round lasts the deadline
    s = _scheduler(_fleet(speeds), "devices.overcommit=1.0", "train.batch_size=4",
                   f"devices.deadline_seconds={work / 6.5e6}")
    t = s.plan(0, SimClock(0.0, 0.0, 0.0))
    assert t.kept == (3, 7) and math.isclose(t.end, work / 6.5e6)


def test_offline_devices_are_never_selected_and_a_round_waits_for_one_to_come_online():
    # devices 0-3 online in [0, 50) of a 100 s period, 4-7 in [60, 100): nobody in [50, 60)
    m = 8
    offsets = np.arange(m + 1, dtype=np.int64)
    starts = np.array([0.0] * 4 + [60.0] * 4)
    ends = np.array([50.0] * 4 + [100.0] * 4)
    period = np.full(m, 100.0)
    s = _scheduler(_fleet([np.inf] * m, avail=(offsets, starts, ends, period)), "devices.availability=diurnal")
    t = s.plan(0, SimClock(230.0, 0.0, 0.0))
    assert (t.online, t.kept, t.start) == (4, (0, 1, 2, 3), 230.0)
    t = s.plan(1, SimClock(270.0, 0.0, 0.0))
    assert t.kept == (4, 5, 6, 7)
    t = s.plan(2, SimClock(255.0, 0.0, 0.0))  # the round waits for the next device online
    assert (t.start, t.kept) == (260.0, (4, 5, 6, 7))
    # a device still busy when its window closes is lost: 1 s of work started 0.5 s before the close
    slow = _scheduler(_fleet([1.0] * m, avail=(offsets, starts, ends, period)), "devices.availability=diurnal",
                      "train.local_steps=1", "train.batch_size=1")
    work = 3 * slow.fed.flops_per_sample
    t = slow.plan(2, SimClock(50.0 - work / 2, 0.0, 0.0))
    assert t.kept == () and t.selected == 4 and t.lost == 4


def test_dropouts_are_seeded_per_round():
    s = _scheduler(_fleet([1e9] * 8, dropout=[0.5] * 8), "devices.dropout=0.5")
    a = [s.plan(r, SimClock(0.0, 0.0, 0.0)) for r in range(20)]
    b = [s.plan(r, SimClock(0.0, 0.0, 0.0)) for r in range(20)]
    assert a == b
    dropped = sum(t.lost for t in a)
    assert 20 <= dropped <= 60  # 80 selections at p = 0.5
    assert all(isinstance(t, RoundTiming) and len(t.kept) + t.lost == t.selected for t in a)


HETERO = ["train.participation=0.5", "train.rounds=4", *DEVICES, "devices.availability=diurnal",
          "devices.online_fraction=0.5", "devices.dropout=0.25", "devices.overcommit=0.3", "devices.speed_sigma=1.0",
          "devices.deadline_seconds=30"]


@pytest.mark.subprocess
def test_a_resumed_run_has_the_same_clock_and_numbers(tmp_path):
    full = run_local(tiny_config(*HETERO))
    run_local(tiny_config(*HETERO, "train.rounds=2", f"checkpoint.dir={tmp_path}"))
    cont = tiny_config(*HETERO, f"checkpoint.dir={tmp_path}")
    resumed = run_local(cont, resume=load_resume(cont))
    same_metrics(full.history, resumed.history)
    clock = [r["sim_clock_seconds"] for r in full.history]
    assert clock == sorted(clock) and clock[-1] > 0
    assert any(r["devices_dropped"] for r in full.history)


def test_a_method_that_chooses_its_own_devices_keeps_those_the_model_keeps():
    """FLHC's clustering round asks for every training device; only the online ones that finish train."""
    cfg = tiny_config("method.name=flhc", "method.warmup_rounds=1", *HETERO)
    result = run_local(cfg)
    row = result.history[1]
    assert row["devices_selected"] == 8 and row["devices_kept"] < 8


@pytest.mark.parametrize("setting, field", [
    (["devices.dropout=0.1"], "devices.dropout"),  # the model is off
    ([*DEVICES, "devices.dropout=1.0"], "devices.dropout"),
    ([*DEVICES, "devices.speed_sigma=-1"], "devices.speed_sigma"),
    ([*DEVICES, "devices.speed_sigma=.nan"], "devices.speed_sigma"),
    ([*DEVICES, "devices.overcommit=-0.1"], "devices.overcommit"),
    ([*DEVICES, "devices.availability=sometimes"], "devices.availability"),
    ([*DEVICES, "devices.availability=trace"], "devices.availability_trace"),
    ([*DEVICES, "devices.capacity_trace=/no/such/file.json"], "devices.capacity_trace"),
    ([*DEVICES, "devices.trace_format=xml"], "devices.trace_format"),
    ([*DEVICES, "devices.availability=iid", "devices.slot_minutes=7"], "devices.slot_minutes"),
    ([*DEVICES, "devices.online_fraction=0"], "devices.online_fraction"),
    ([*DEVICES, "devices.target_acc=2"], "devices.target_acc"),
])
def test_bad_device_settings_are_refused_naming_the_field(setting, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        tiny_config(*setting)


def test_a_deadline_no_device_can_meet_is_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"devices\.deadline_seconds.*fastest device"):
        prepare(tiny_config(*DEVICES, "devices.deadline_seconds=0.0001", "network.device_gflops=0.001"))


def test_fedscale_traces_drive_speeds_and_availability(tmp_path):
    """A capacity and an availability trace of 3 clients for 8 devices: devices 0-2 take the clients in id
    order, the rest a seeded draw; a client online only in [0, 10) of a 100 s period is never kept after 10 s."""
    import json

    cap = {"1": {"computation": 5.0, "communication": 1000.0}, "2": {"computation": 50.0, "communication": 100.0},
           "3": {"computation": 500.0, "communication": 10.0}}
    avail = {"1": {"duration": 100, "active": [0], "inactive": [100], "finish_time": 100},
             "2": {"duration": 100, "active": [0], "inactive": [100], "finish_time": 100},
             "3": {"duration": 100, "active": [0], "inactive": [10], "finish_time": 100}}
    (tmp_path / "cap.json").write_text(json.dumps(cap))
    (tmp_path / "avail.json").write_text(json.dumps(avail))
    cfg = tiny_config(*DEVICES, f"devices.capacity_trace={tmp_path / 'cap.json'}", "devices.availability=trace",
                      f"devices.availability_trace={tmp_path / 'avail.json'}", "train.participation=0.5")
    fed = prepare(cfg).federation
    fleet = fed.fleet
    assert fleet is not None
    per_sample = fed.flops_per_sample / fleet.flops[:3].astype(np.float64)
    assert np.allclose(per_sample, [0.005, 0.05, 0.5], rtol=1e-6)
    assert np.allclose(fleet.up_bps[:3], [1e6, 1e5, 1e4])
    assert fleet.online(50.0)[:3].tolist() == [True, True, False]
    result = run_local(cfg)
    assert result.history[-1]["sim_clock_seconds"] > 10


# --- asynchronous aggregation (FedBuff) ---------------------------------------------------------------------

ASYNC = [*DEVICES, "devices.aggregation=async"]


def test_buffered_step_is_fedbuffs_rule_by_hand():
    import torch

    from lcfed.methods.round import Arrival, ModelMessage, buffered_step

    current = torch.tensor([1.0, 1.0])
    a = Arrival(ModelMessage(0, 1, 0.0, torch.tensor([3.0, 1.0])), 0, torch.tensor([1.0, 1.0]), 1.0)
    b = Arrival(ModelMessage(1, 3, 0.0, torch.tensor([0.0, 2.0])), 3, torch.tensor([2.0, 0.0]), 0.5)
    # 1/4 * 1 * (2, 0) + 3/4 * 0.5 * (-2, 2) = (0.5 - 0.75, 0.75)
    assert torch.allclose(buffered_step(current, [a, b]), torch.tensor([0.75, 1.75]))


def test_the_queue_by_hand():
    """4 devices in flight (participation 0.5 of 8) at speeds 1..8 x F; B = 1: every aggregation takes the
    next arrival, whose slot a free device takes from the new version."""
    from lcfed.devices.buffered import BufferedScheduler

    speeds = np.arange(1, 9, dtype=np.float64) * 1e6
    cfg = tiny_config("train.participation=0.5", "method.name=fedavg", *ASYNC, "devices.async_buffer=1")
    fed = prepare(cfg).federation
    s = BufferedScheduler(cfg, fed, _fleet(speeds))
    work = s.samples[0] * 3 * fed.flops_per_sample
    r0 = s.plan(0, SimClock(0.0, 0.0, 0.0), None)
    assert len(r0.starts) == 4 and r0.timing.selected == 4
    first = min(r0.starts, key=lambda f: (f.finish, f.device))
    assert r0.arrivals == (first,) and math.isclose(r0.timing.end, work / speeds[first.device])
    assert r0.timing.staleness == 0.0 and len(r0.pending.inflight) == 3 and r0.pending.slots == (r0.timing.end,)
    r1 = s.plan(1, SimClock(r0.timing.end, 0.0, 0.0), r0.pending)
    assert len(r1.starts) == 1 and r1.starts[0].version == 1 and r1.starts[0].device != first.device
    assert r1.arrivals[0].version in (0, 1) and r1.timing.end >= r0.timing.end
    assert r1.timing.staleness == 1 - r1.arrivals[0].version


def test_a_full_buffer_of_equal_devices_is_never_stale():
    result = run_local(tiny_config("train.participation=0.5", "train.rounds=3", *ASYNC, "devices.async_buffer=4",
                                   "method.name=fedavg"))
    assert [r["staleness_mean"] for r in result.history] == [0.0] * 3
    assert [r["devices_kept"] for r in result.history] == [4.0] * 3


ASYNC_HETERO = ["train.participation=0.5", "train.rounds=5", *ASYNC, "devices.async_buffer=2",
                "devices.availability=diurnal", "devices.online_fraction=0.6", "devices.dropout=0.2",
                "devices.speed_sigma=1.0"]


@pytest.mark.parametrize("method", ["fedavg", "ifca", "lcfed"])
def test_async_runs_resume_to_the_same_numbers(tmp_path, method):
    extra = [] if method == "fedavg" else ["method.num_clusters=2"] + (["method.rank=2"] if method == "lcfed" else [])
    full = run_local(tiny_config(f"method.name={method}", *extra, *ASYNC_HETERO))
    assert any(r["staleness_mean"] > 0 for r in full.history)
    run_local(tiny_config(f"method.name={method}", *extra, *ASYNC_HETERO, "train.rounds=2",
                          f"checkpoint.dir={tmp_path}"))
    cont = tiny_config(f"method.name={method}", *extra, *ASYNC_HETERO, f"checkpoint.dir={tmp_path}")
    snap = load_resume(cont)
    assert snap is not None and snap.pending is not None and snap.pending.inflight
    same_metrics(full.history, run_local(cont, resume=snap).history)


@pytest.mark.parametrize("setting, match", [
    (["method.name=fesem", *ASYNC, "devices.async_buffer=2"], r"method fesem does not aggregate asynchronously; "
                                                              r"those that do: .*fedavg"),
    (["method.name=fedavg", *ASYNC], r"devices\.async_buffer.*>= 1"),
    (["method.name=fedavg", *ASYNC, "devices.async_buffer=9"], r"devices\.async_buffer.*in flight"),
    (["method.name=fedavg", *ASYNC, "devices.async_buffer=2", "devices.deadline_seconds=5"],
     r"devices\.deadline_seconds.*sync"),
    (["method.name=fedavg", *ASYNC, "devices.async_buffer=2", "devices.overcommit=0.3"], r"devices\.overcommit"),
    (["method.name=fedavg", *DEVICES, "devices.async_buffer=2"], r"devices\.async_buffer.*only with"),
    (["method.name=lcfed", "method.num_clusters=3", *ASYNC, "devices.async_buffer=2"],
     r"method\.num_clusters.*devices\.async_buffer"),
])
def test_bad_async_settings_are_refused(setting, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(*setting)


def test_time_to_target_is_the_clock_when_acc_mean_first_reaches_it():
    result = run_local(tiny_config(*HETERO, "devices.target_acc=0.3"))
    reached = [r for r in result.history if "sim_seconds_to_target" in r]
    first = next(r for r in result.history if r.get("acc_mean", 0) >= 0.3)
    assert len(reached) == 1 and reached[0] is first
    assert first["sim_seconds_to_target"] == first["sim_clock_seconds"]


def test_accuracy_against_the_simulated_clock():
    from lcfed.tracking.artifacts import CLOCK_AXIS, accuracy_figure

    cfg = tiny_config(*HETERO, "devices.target_acc=0.3")
    history = run_local(cfg).history
    ax = accuracy_figure(history, cfg, clock=True).axes[0]
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "acc_mean")
    assert np.allclose(line.get_xdata(), [r["sim_clock_seconds"] / 3600 for r in history])
    assert ax.get_xlabel() == CLOCK_AXIS


@pytest.mark.subprocess
@pytest.mark.parametrize("example", ["devices_sync", "fedbuff"])
def test_the_examples_run_as_they_are_and_report_the_clock(tmp_path, tracking_uri, example):
    """configs/devices_sync.yaml and configs/fedbuff.yaml through ``lcfed run -c`` (fewer rounds), logged to
    MLflow with the plot against the clock; ``--json`` has ``sim_clock_seconds`` and the time to target."""
    import json
    from pathlib import Path

    import mlflow

    from tune_jobs.cli import main

    out = tmp_path / "run.json"
    config = Path(__file__).resolve().parents[1] / "configs" / f"{example}.yaml"
    assert main(["run", "-c", str(config), "-q", "--json", str(out), "--set", "train.rounds=6",
                 "--set", "train.eval_every=1", "--set", f"tracking.uri={tracking_uri}"]) == 0
    summary = json.loads(out.read_text())
    assert summary["sim_clock_seconds"] > 0 and "sim_seconds_to_target" in summary
    client = mlflow.MlflowClient(tracking_uri)
    files = {a.path for a in client.list_artifacts(summary["run_id"], "plots")}
    assert "plots/accuracy_vs_clock.png" in files
    clock = client.get_metric_history(summary["run_id"], "time/sim_clock_seconds")
    assert len(clock) == 6 and clock[-1].value == summary["sim_clock_seconds"]
    if example == "devices_sync":  # what it is for: over-commitment applies, more devices selected than kept
        from lcfed.tracking import mlflow_key

        kept, selected = (client.get_metric_history(summary["run_id"], mlflow_key(m)) for m in
                          ("devices_kept", "devices_selected"))
        assert all(s.value > k.value for s, k in zip(selected, kept, strict=True)) and len(kept) == 6
