"""`lcfed compare`: a tiny real comparison (2 methods x 1 trial x 2 seeds on digits, read from IDX files),
its report, the MLflow hierarchy, resume, and that phase 1 decides on validation accuracy only (the same
comparison on files whose test samples are noise chooses the same); an untracked comparison; the report of
more methods (the best other one of each, the pairs with Standalone) on fixed numbers."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml

from lcfed.config import to_dict
from lcfed.data.sources import load_dataset
from lcfed.errors import ConfigError
from lcfed.run.setup import prepare
from tests.conftest import start_test_ray, store_copy, tiny_config
from tests.test_data import write_idx
from tune_jobs.cli import main
from tune_jobs.compare import parse_seeds

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


SPACES = {
    "lcfed": "train.lr: {loguniform: [0.02, 0.1]}\nmethod.mu: {loguniform: [0.01, 1.0]}\n",
    "standalone": "train.lr: {loguniform: [0.02, 0.1]}\n",
}


def test_seeds_are_a_count_or_a_list():
    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("0,5,9") == [0, 5, 9]
    for bad in ("0", "a", "1,1", "-1"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def as_mnist_files(data_dir: Path, x, y) -> None:
    """digits' samples as MNIST IDX files under ``data_dir``, so that every Tune trial loads them itself
    through the real loader (1500 as the train pool, the rest as the test pool: the union is the data)."""
    raw = data_dir / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for pool, rows in (("train", slice(0, 1500)), ("t10k", slice(1500, None))):
        write_idx(raw / f"{pool}-images-idx3-ubyte", x[rows, 0])
        write_idx(raw / f"{pool}-labels-idx1-ubyte", y[rows].astype(np.uint8))


def base_config(uri: str, data_dir: Path, experiment: str = "compare"):
    return tiny_config("train.rounds=3", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={uri}",
                       f"tracking.experiment={experiment}", "data.dataset=mnist", f"data.data_dir={data_dir}")


@pytest.fixture(scope="module")
def shared_ray():
    """One small Ray for the module's comparisons (a start costs seconds): they attach to it, as a comparison in
    a Ray job does (a command's private Ray: tests/test_connect.py)."""
    import ray

    from tune_jobs.compare_drivers import prestart

    prestart()  # the drivers' fork server imports while this Ray starts, as a comparison starting its own Ray has it
    start_test_ray()
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def compared(shared_ray, tmp_path_factory, migrated_store):
    tmp = tmp_path_factory.mktemp("compare")
    uri = store_copy(migrated_store, tmp)  # an empty store (its creation: tests/test_lifecycle.py)
    digits = load_dataset("digits", tmp)
    as_mnist_files(tmp / "data", digits.x, digits.y)
    base = base_config(uri, tmp / "data")
    (tmp / "base.yaml").write_text(yaml.safe_dump(to_dict(base)))
    spaces = tmp / "spaces"
    spaces.mkdir()
    for m, text in SPACES.items():
        (spaces / f"{m}.yaml").write_text(text)
    args = ["compare", "-c", str(tmp / "base.yaml"), "--methods", "lcfed,standalone", "--budget", "1",
            "--seeds", "2", "--space-dir", str(spaces), "--out", str(tmp / "out"), "--register", "cmp-best",
            "--scheduler", "fifo", "--max-concurrent", "1"]  # one trial process per sweep, reused: its imports once
    assert main(args) == 0
    return tmp, uri, args


def test_the_report_has_every_method_with_intervals_and_paired_tests(compared):
    tmp, _, _ = compared
    out = tmp / "out"
    md = (out / "compare.md").read_text()
    for m in ("lcfed", "standalone"):
        assert f"| {m} |" in md
    rows = {r["method"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert set(rows) == {"lcfed", "standalone"}
    for m, r in rows.items():
        seeds = [float(r["seed_0"]), float(r["seed_1"])]
        assert float(r["test_acc_mean"]) == pytest.approx(sum(seeds) / 2)
        assert float(r["ci95"]) >= 0 and 0 <= float(r["val_acc_mean"]) <= 1
        assert r["best_other"] != m and r["best_other"] in rows
    assert rows["standalone"]["diff_vs_standalone"] == ""
    assert float(rows["lcfed"]["diff_vs_standalone"]) == pytest.approx(
        float(rows["lcfed"]["test_acc_mean"]) - float(rows["standalone"]["test_acc_mean"]))
    assert (out / "compare.png").stat().st_size > 10_000
    within = md[md.index("Paired over devices"):]
    assert "| lcfed vs standalone | " in within
    assert "n = 8" in within  # the 8 devices of each seed, paired
    phase1 = json.loads((out / "phase1" / "lcfed.json").read_text())
    assert set(phase1["best_config"]) == {"train.lr", "method.mu"} and phase1["trials"] == 1
    # every phase-2 run says what produced its numbers, all alike: no note
    phase2 = json.loads((out / "phase2" / "lcfed.json").read_text())
    assert {phase2[s]["provenance"]["numerics"] for s in ("0", "1")} == {"portable"}
    assert "different numerics" not in md


def test_mlflow_holds_one_parent_with_a_sweep_per_method_and_phase(compared):
    tmp, uri, _ = compared
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("compare")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = [r for r in runs if r.data.tags.get("compare_parent") == "true"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    pid = parent[0].info.run_id
    assert parent[0].data.params["metric"] == "val_acc_mean"
    sweeps = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == pid}
    assert set(sweeps) == {f"out-{m}-{p}" for m in ("lcfed", "standalone") for p in ("tune", "seeds")}
    for name, sweep in sweeps.items():
        assert sweep.data.params["metric"] == "val_acc_mean"  # phase 1 decides on validation, never test
        trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]
        assert len(trials) == (2 if name.endswith("-seeds") else 1)  # a seed each; the budget
        assert all(t.info.status == "FINISHED" for t in trials)
        assert {t.data.tags.get("provenance.numerics") for t in trials} == {"portable"}  # the trials' own record
        if name.endswith("-seeds"):
            assert sorted(t.data.params["seed"] for t in trials) == ["0", "1"]
            # each trial named for its method, the values phase 1 chose, the data and its seed
            method = name.removeprefix("out-").removesuffix("-seeds")
            chosen = json.loads((tmp / "out" / "phase1" / f"{method}.json").read_text())["best_config"]
            for t in trials:
                head, _, seed = t.info.run_name.rpartition(" · ")
                assert head.startswith(method) and seed == f"s{t.data.params['seed']}", t.info.run_name
                assert all(f"{k.split('.')[-1]}=" in head for k in chosen), (t.info.run_name, chosen)
    assert {a.path for a in client.list_artifacts(pid)} >= {"compare.md", "compare.csv", "plots"}
    # the methods ran side by side, a driver process each (--parallel's default): their sweeps overlap in time
    tuning = [sweeps[f"out-{m}-tune"].info for m in ("lcfed", "standalone")]
    assert max(t.start_time for t in tuning) < min(t.end_time for t in tuning)
    # --register: the best method's (the report's first row) best phase-2 trial, linked to its run; only the
    # phase-2 sweeps log their best trial's models
    top = max(csv.DictReader((tmp / "out" / "compare.csv").open()), key=lambda r: float(r["test_acc_mean"]))
    seeds = sweeps[f"out-{top['method']}-seeds"]
    (version,) = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri).search_model_versions("name = 'cmp-best'")
    assert version.run_id == seeds.data.tags["best_run_id"] and version.tags["lcfed.model"] == "personal"
    assert version.source == client.get_run(version.run_id).data.tags["model.personal"]
    assert all(("best_models" in r.data.tags) == r.info.run_name.endswith("-seeds") for r in sweeps.values())


def test_a_rerun_continues_without_redoing_a_phase(compared, capsys, monkeypatch):
    tmp, uri, args = compared
    before = (tmp / "out" / "compare.csv").read_text()
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("compare")
    count = len(client.search_runs([exp.experiment_id], max_results=1000))

    def no_ray(engine):
        raise AssertionError("a finished comparison (or one refused) started Ray")

    monkeypatch.setattr("tune_jobs.parent_run.ensure_ray", no_ray)  # nothing left to run: the report only
    assert main(args) == 0
    assert (tmp / "out" / "compare.csv").read_text() == before
    assert len(client.search_runs([exp.experiment_id], max_results=1000)) == count  # no new run
    registry = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert len(registry.search_model_versions("name = 'cmp-best'")) == 1  # the same model, not registered again
    capsys.readouterr()
    assert main([*args[:-4], "--scheduler", "asha", *args[-2:]]) == 2  # other settings need another --out
    assert "--out" in capsys.readouterr().err
    assert json.loads((tmp / "out" / "state.json").read_text())["params"]["scheduler"] == "fifo"


@pytest.mark.slow  # ~45 s: two more sweeps per method
def test_phase_one_decides_the_same_when_the_test_split_is_poisoned(compared):
    """The same comparison on data whose test samples (seed 0's partition) are noise: phase 1 chooses the
    same configs with the same validation accuracy, and only phase 2's test accuracy moves."""
    tmp, uri, _ = compared
    digits = load_dataset("digits", tmp)
    cfg = base_config(uri, tmp / "data").replace(**{"data.val_fraction": 0.2})
    test_rows = np.concatenate(prepare(cfg).partition.test)
    x = digits.x.copy()
    x[test_rows] = np.random.default_rng(0).integers(0, 256, x[test_rows].shape, dtype=np.uint8)
    as_mnist_files(tmp / "poisoned", x, digits.y)
    base = base_config(uri, tmp / "poisoned", "compare-poisoned")
    (tmp / "poisoned.yaml").write_text(yaml.safe_dump(to_dict(base)))
    assert main(["compare", "-c", str(tmp / "poisoned.yaml"), "--methods", "lcfed,standalone", "--budget", "1",
                 "--seeds", "1", "--space-dir", str(tmp / "spaces"), "--out", str(tmp / "poisoned-out"),
                 "--scheduler", "fifo"]) == 0
    for m in ("lcfed", "standalone"):
        clean, poisoned = (json.loads((tmp / out / "phase1" / f"{m}.json").read_text()) for out in ("out", "poisoned-out"))
        assert poisoned["best_config"] == clean["best_config"] and poisoned["val_acc_mean"] == clean["val_acc_mean"]
        clean, poisoned = (json.loads((tmp / out / "phase2" / f"{m}.json").read_text())["0"]
                           for out in ("out", "poisoned-out"))
        assert poisoned["val_acc_mean"] == clean["val_acc_mean"]
        assert poisoned["acc_mean"] < clean["acc_mean"] - 0.05  # the test samples are noise now


def test_an_untracked_compare_of_finished_phases_writes_its_report_and_creates_no_mlflow_file(
        compared, tmp_path, monkeypatch, capsys):
    """``--no-track`` on phases already on disk (the tracked comparison's; an untracked sweep's trials are
    tests/test_sweep.py's, and the whole untracked comparison is the slow test below): the report, the state
    with tracking off, no sweep, no MLflow file in the working directory, and a tracked rerun into its --out
    refused."""
    from tests.test_sweep import mlflow_files

    tmp, _, args = compared
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for phase in ("phase1", "phase2"):
        shutil.copytree(tmp / "out" / phase, tmp_path / "cmp" / phase)

    untracked = [*args[:args.index("--out")], "--out", "cmp", "--scheduler", "fifo", "--max-concurrent", "1", "-q",
                 "--no-track"]
    assert main(untracked) == 0
    out = capsys.readouterr().out
    assert "lcfed" in out and "standalone" in out and "MLflow" not in out
    assert (tmp_path / "cmp" / "compare.csv").read_text() == (tmp / "out" / "compare.csv").read_text()
    assert not (tmp_path / "cmp" / "tune").exists()  # no sweep ran
    state = json.loads((tmp_path / "cmp" / "state.json").read_text())
    assert state["parent_run_id"] is None and state["params"]["tracking"] == "off"
    assert mlflow_files(tmp_path) == []
    assert main(untracked[:-1]) == 2  # tracked, into the untracked comparison's --out: no parent run to continue
    assert "holds a comparison with other settings" in capsys.readouterr().err
    assert mlflow_files(tmp_path) == []


@pytest.mark.slow  # ~10 s: one sweep
def test_a_method_left_alone_runs_in_this_process_with_the_numbers_its_driver_gave(compared, tmp_path, monkeypatch):
    """The tracked comparison's phases but standalone's phase 2, untracked: that one sweep runs again in this
    process (one method left: no driver process), and the report is the one the driver processes gave."""
    tmp, _, args = compared
    monkeypatch.chdir(tmp_path)
    for phase in ("phase1", "phase2"):
        shutil.copytree(tmp / "out" / phase, tmp_path / "cmp" / phase)
    (tmp_path / "cmp" / "phase2" / "standalone.json").unlink()
    assert main([*args[:args.index("--out")], "--out", "cmp", "--scheduler", "fifo", "--max-concurrent", "1", "-q",
                 "--no-track"]) == 0
    assert [p.name for p in (tmp_path / "cmp" / "tune").iterdir()] == ["cmp-standalone-seeds"]  # that sweep alone
    assert (tmp_path / "cmp" / "compare.csv").read_text() == (tmp / "out" / "compare.csv").read_text()


@pytest.mark.slow  # ~40 s: four sweeps
def test_an_untracked_compare_writes_its_report_and_creates_no_mlflow_file(shared_ray, tmp_path, monkeypatch, capsys):
    """``--no-track`` from the start (moved here from tests/test_plugin_errors.py: on this module's Ray): the
    report, no MLflow file in the working directory, and a tracked rerun into its --out refused."""
    from tests.test_sweep import mlflow_files

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    base = tiny_config("engine.num_cpus=2", "tracking.enabled=true")  # the flag turns it off
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(to_dict(base)))
    args = ["compare", "-c", "base.yaml", "--methods", "fedavg,standalone", "--budget", "1", "--seeds", "1",
            "--scheduler", "fifo", "--max-concurrent", "1", "--set", "train.rounds=2", "--out", "cmp", "-q",
            "--no-track"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "standalone" in out and "MLflow" not in out
    for name in ("compare.md", "compare.csv", "phase1/fedavg.json", "phase2/standalone.json"):
        assert (tmp_path / "cmp" / name).is_file(), name
    state = json.loads((tmp_path / "cmp" / "state.json").read_text())
    assert state["parent_run_id"] is None and state["params"]["tracking"] == "off"
    assert mlflow_files(tmp_path) == []
    # a tracked rerun into the untracked comparison's --out is refused (it has no parent run to continue)
    assert main(args[:-1]) == 2
    assert "holds a comparison with other settings" in capsys.readouterr().err
    assert mlflow_files(tmp_path) == []


def test_the_drivers_report_each_failed_method_and_raise_the_first(shared_ray, capfd):
    """Three methods' work side by side, one ending well, one raising, one dying without a word: the parent waits
    for all, names each failure in a line and raises the first method's own exception."""
    import time
    from functools import partial

    from lcfed.errors import require
    from tune_jobs.compare_drivers import run_drivers

    works = {"ok": partial(time.sleep, 0), "bad": partial(require, False, "--x", 1, "not allowed"),
             "dies": partial(os._exit, 3)}
    with pytest.raises(ConfigError, match="--x: got 1; not allowed"):
        run_drivers(works, 4)
    err = capfd.readouterr().err
    assert "3 methods, 3 at once" in err and "ok: both phases done" in err
    assert "bad failed after" in err and "ConfigError: --x: got 1; not allowed" in err
    assert re.search(r"dies failed after \d+ s: SweepFailed: the driver process of dies ended with exit code 3", err)


@pytest.mark.slow  # ~90 s: a comparison stopped mid-sweep in a child process, then resumed to its end
def test_a_signal_stops_every_driver_saved_and_the_rerun_finishes_the_comparison(shared_ray, tmp_path, migrated_store):
    """SIGTERM to a comparison whose methods run side by side: passed on to each driver process, whose Tune saves
    its sweep; the command exits 143 in one line, its parent run KILLED, no process of it left behind; the same
    command then finishes it, every round of every trial logged."""
    import signal
    import subprocess
    import sys
    import time

    import psutil
    import ray

    rounds = 30  # a phase 1 long enough that both methods are inside it when the signal comes
    uri = store_copy(migrated_store, tmp_path)
    base = tiny_config(f"train.rounds={rounds}", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={uri}",
                       "tracking.experiment=compare-sig")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(to_dict(base)))
    args = ["compare", "-c", str(tmp_path / "base.yaml"), "--methods", "fedavg,standalone", "--budget", "1",
            "--seeds", "1", "--scheduler", "fifo", "--out", str(tmp_path / "out")]
    # attached to the module's Ray, as a comparison in a Ray job is (a job is stopped by SIGTERM)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    proc = subprocess.Popen([sys.executable, "-m", "tune_jobs", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    client = mlflow.MlflowClient(tracking_uri=uri)

    def trials() -> list:
        exp = client.get_experiment_by_name("compare-sig")
        runs = client.search_runs([exp.experiment_id]) if exp else []
        return [r for r in runs if "tune_trial_id" in r.data.tags]

    while proc.poll() is None and sum("accuracy/acc_mean" in r.data.metrics for r in trials()) < 2:
        time.sleep(0.2)  # both methods' phase-1 trials have reported a round
    assert proc.poll() is None, "the comparison ended before the signal"
    family = psutil.Process(proc.pid).children(recursive=True)  # the fork server and the drivers
    assert len(family) >= 3, family
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "lcfed: SIGTERM: stopping the comparison's sweeps" in err
    assert "comparison stopped" in err and "rerun the same command" in err
    psutil.wait_procs(family, timeout=30)
    assert not [p for p in family if p.is_running()], "a driver outlived its comparison"
    exp = client.get_experiment_by_name("compare-sig")
    stopped = client.search_runs([exp.experiment_id])
    assert all(r.info.status != "RUNNING" for r in stopped)
    assert [r.info.status for r in stopped if r.data.tags.get("compare_parent") == "true"] == ["KILLED"]
    assert not (tmp_path / "out" / "phase1" / "fedavg.json").exists()  # stopped within phase 1

    assert main(args) == 0
    done = trials()
    assert len(done) == 4 and all(r.info.status == "FINISHED" for r in done)  # 1 trial + 1 seed per method
    for t in done:  # every round logged, across the stop and the rerun
        steps = [m.step for m in client.get_metric_history(t.info.run_id, "accuracy/acc_mean")]
        assert sorted(set(steps)) == list(range(rounds)), steps


def test_the_report_by_hand_with_newcomers(tmp_path):
    """write_report on fixed numbers: mean ± t-interval per method, paired differences, the target, and a
    newcomers' column when devices were held out of training."""
    from tune_jobs.compare_report import write_report

    def seed(acc, new, devices=None):
        curve = [[0, acc / 2, 1e6, 1.0], [1, acc, 2e6, 2.0]]
        return {"acc_mean": acc, "bytes_up_total": 1e6, "bytes_down_total": 1e6, "curve": curve, "acc_new_mean": new,
                "devices": devices or {}, "evaluations": 2.0}

    # seed 0: devices "0", "1", "2" in both (lcfed - standalone = 0.1, 0.2, 0.3); seed 1: one device in common
    phase2 = {"lcfed": {0: seed(0.90, 0.5, {"0": 0.9, "1": 0.8, "2": 0.7}), 1: seed(0.92, 0.6, {"0": 1.0})},
              "standalone": {0: seed(0.88, 0.2, {"0": 0.8, "1": 0.6, "2": 0.4, "3": 1.0}), 1: seed(0.89, 0.3, {"0": 1.0})}}
    phase1 = {m: {"best_config": {"train.lr": 0.05}, "val_acc_mean": 0.8, "trials": 2} for m in phase2}
    report = write_report(tmp_path, ["lcfed", "standalone"], [0, 1], phase1, phase2, None, tiny_config())
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["lcfed"]["test_acc_mean"] == pytest.approx(0.91)
    assert rows["lcfed"]["vs_standalone"].diff.mean == pytest.approx(0.025)  # differences 0.02 and 0.03
    assert rows["lcfed"]["best_other"] == "standalone" and rows["standalone"]["vs_standalone"] is None
    assert f"Target for bytes / simulated time: {100 * 0.9 * 0.885:.1f} %" in report["md"]  # 0.9 x standalone
    assert "newcomers' acc (%)" in report["md"] and "| 55.00 ± 63.53 |" in report["md"]  # t_{0.975,1} = 12.706
    assert rows["lcfed"]["reached"] == 2 and rows["lcfed"]["bytes_to_target"] == 2e6
    # differences 0.1, 0.2, 0.3: mean 0.2, s = 0.1, t = 0.2 / (0.1 / sqrt 3) = 3.464, df 2 -> p = 0.0742
    assert "| lcfed vs standalone | +20.00 (p = 0.074, n = 3) | – |" in report["md"]
    assert "different numerics" not in report["md"]  # none recorded: nothing to tell apart
    assert "averaged over the last 2 evaluations;" in report["md"]  # as many as the runs made


def test_the_report_gives_epsilon_beside_accuracy_under_privacy(tmp_path):
    """With privacy.mode: central the report has an ε (δ) column: the largest ε over the seeds; ∞ for a method
    that ran without privacy."""
    from tune_jobs.compare_report import write_report

    def seed(acc, eps):
        return {"acc_mean": acc, "bytes_up_total": 1e6, "bytes_down_total": 1e6, "curve": [[0, acc, 2e6, 1.0]],
                "dp_epsilon": eps, "dp_delta": 1e-3 if eps == eps else eps}

    phase2 = {"fedavg": {0: seed(0.70, 1.9), 1: seed(0.72, 2.1)}, "standalone": {0: seed(0.80, math.nan),
                                                                              1: seed(0.81, math.nan)}}
    phase1 = {m: {"best_config": {}, "val_acc_mean": 0.8, "trials": 2} for m in phase2}
    report = write_report(tmp_path, list(phase2), [0, 1], phase1, phase2, None, tiny_config())
    assert " ε (δ) |" in report["md"]
    assert "| 2.10 (0.001) |" in report["md"] and "| ∞ |" in report["md"]
    eps = {row["method"]: row["epsilon_max"] for row in csv.DictReader(report["csv"].splitlines())}
    assert eps == {"fedavg": "2.1", "standalone": ""}
    without = {m: {s: {k: v for k, v in row.items() if not k.startswith("dp_")} for s, row in rows.items()}
               for m, rows in phase2.items()}
    assert "ε (δ)" not in write_report(tmp_path, list(phase2), [0, 1], phase1, without, None, tiny_config())["md"]


def test_the_report_by_hand_picks_each_methods_best_other(tmp_path):
    """Three methods on fixed numbers: each row's "vs best other" is against the best mean of the other two,
    and every method but Standalone is paired with Standalone device by device."""
    from tune_jobs.compare_report import write_report

    def seed(acc):
        return {"acc_mean": acc, "bytes_up_total": 1e6, "bytes_down_total": 1e6, "curve": [[0, acc, 2e6, 1.0]],
                "devices": {"0": acc, "1": acc / 2, "2": acc * acc}}

    phase2 = {"lcfed": {0: seed(0.90), 1: seed(0.92)}, "fedavg": {0: seed(0.70), 1: seed(0.74)},
              "standalone": {0: seed(0.80), 1: seed(0.83)}}
    phase1 = {m: {"best_config": {}, "val_acc_mean": 0.8, "trials": 2} for m in phase2}
    report = write_report(tmp_path, list(phase2), [0, 1], phase1, phase2, None, tiny_config())
    rows = {r["method"]: r for r in report["rows"]}
    assert {m: r["best_other"] for m, r in rows.items()} == {"lcfed": "standalone", "fedavg": "lcfed",
                                                            "standalone": "lcfed"}
    assert rows["lcfed"]["vs_best_other"].diff.mean == pytest.approx(0.095)  # 0.90 - 0.80 and 0.92 - 0.83
    assert rows["fedavg"]["vs_best_other"].diff.mean == pytest.approx(-0.19)  # against lcfed, not standalone
    within = report["md"][report["md"].index("Paired over devices"):]
    assert "| lcfed vs standalone | " in within and "| fedavg vs standalone | " in within
    assert "| standalone vs" not in within


def test_the_report_says_when_its_runs_ran_under_different_numerics(tmp_path):
    from tune_jobs.compare_report import write_report

    def seed(acc, profile, kernels):
        return {"acc_mean": acc, "bytes_up_total": 1e6, "bytes_down_total": 1e6, "curve": [[0, acc, 2e6, 1.0]],
                "devices": {}, "provenance": {"numerics": profile, "kernels": kernels, "torch": "2.14.1"}}

    phase1 = {m: {"best_config": {}, "val_acc_mean": 0.8, "trials": 1} for m in ("lcfed", "fedavg")}
    same = {"lcfed": {0: seed(0.9, "portable", "AVX2")}, "fedavg": {0: seed(0.8, "portable", "AVX2")}}
    assert "different numerics" not in write_report(tmp_path, ["lcfed", "fedavg"], [0], phase1, same, None,
                                                    tiny_config())["md"]
    mixed = {"lcfed": {0: seed(0.9, "native", "AVX512")}, "fedavg": {0: seed(0.8, "portable", "AVX2")}}
    md = write_report(tmp_path, ["lcfed", "fedavg"], [0], phase1, mixed, None, tiny_config())["md"]
    assert "different numerics" in md and "numerics: native, portable" in md and "kernels: AVX2, AVX512" in md


def test_the_report_scores_cluster_recovery_on_a_testbed(tmp_path):
    """On a testbed (known groups) a second table gives each clustered method's final ARI and NMI over seeds
    and the clusters it ended with against the true number; a method that never clustered gets dashes;
    compare.png gets an ARI-vs-round panel; compare.csv the three columns."""
    from tune_jobs.compare_report import write_report

    def seed(acc, recovery):
        return {"acc_mean": acc, "bytes_up_total": 1e6, "bytes_down_total": 1e6, "curve": [[0, acc, 2e6, 1.0]],
                "devices": {}, "recovery": recovery}

    phase2 = {"fedac": {0: seed(0.9, [[0, 0.5, 0.6, 3.0], [1, 1.0, 1.0, 4.0]]), 1: seed(0.9, [[1, 0.8, 0.9, 5.0]])},
              "fedavg": {0: seed(0.8, []), 1: seed(0.8, [])}}
    phase1 = {m: {"best_config": {}, "val_acc_mean": 0.8, "trials": 1} for m in phase2}
    base = tiny_config().replace(**{"data.testbed": "rotated", "data.testbed_groups": 4, "data.partition": "iid"})
    report = write_report(tmp_path, ["fedac", "fedavg"], [0, 1], phase1, phase2, None, base)
    # ARI 1.0 and 0.8: mean 0.9, s = 0.1414, half = 12.706 * 0.1414 / sqrt 2 = 1.271
    assert "| method | ARI | NMI | clusters found (true: 4) |" in report["md"]
    assert "| fedac | 0.900 ± 1.271 | 0.950 ± 0.635 | 4, 5 |" in report["md"]
    assert "| fedavg | – | – | – (no clusters) |" in report["md"]
    head, fedac = report["csv"].splitlines()[:2]
    assert head.endswith("ari_final,nmi_final,clusters_found") and fedac.endswith(",0.9,0.95,4;5")
    import matplotlib.image

    assert matplotlib.image.imread(report["plots"][0]).shape[1] > 1.4 * 11 * 110  # three panels, not two
    without = write_report(tmp_path, ["fedac", "fedavg"], [0, 1], phase1, phase2, None, tiny_config())
    assert "Cluster recovery" not in without["md"] and "ari_final" not in without["csv"]
    generated = tiny_config("data.dataset=leaf_synthetic", "data.partition=natural", "data.synthetic_clusters=3")
    clusters = write_report(tmp_path, ["fedac", "fedavg"], [0, 1], phase1, phase2, None, generated)
    assert "against the 3 true groups of the `leaf_synthetic` generator" in clusters["md"]
