"""Real Tune sweeps: trials, each a federation, logged as MLflow child runs; ASHA, a diverging trial, a signal
and resume; an untracked sweep."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import mlflow
import pytest
import yaml

from lcfed.config import to_dict
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from lcfed.tracking import mlflow_key
from lcfed.tracking.store import open_client
from lcfed.tracking.ui import read_view
from tests.conftest import start_test_ray, store_copy, tiny_config
from tune_jobs.cli import main
from tune_jobs.sweep.options import SweepOptions
from tune_jobs.sweep.run import restore_results, run_sweep
from tune_jobs.sweep.space import load_space
from tune_jobs.sweep.trial import MODELS_FILE

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


@pytest.fixture(scope="module")
def shared_ray():
    """One Ray for the module's sweeps (a start costs seconds): they run on it as a sweep in a Ray job runs on its
    cluster, the signal test's ``lcfed sweep`` process too."""
    import ray

    start_test_ray()
    try:
        yield
    finally:
        ray.shutdown()


def test_space_files_are_validated_against_the_base_config(tmp_path):
    base = tiny_config()
    assert set(load_space("mu_lambda.yaml", base)) == {"method.mu", "method.lam"}
    with pytest.raises(ConfigError, match="space.method.rank"):  # the bundled D = 10 needs >= 10 devices
        load_space("mu_lambda_rank_k.yaml", base)
    assert set(load_space("mu_lambda_rank_k.yaml", tiny_config("data.num_devices=12"))) == {
        "method.mu", "method.lam", "method.rank", "method.num_clusters"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("method.num_clusters: {choice: [2, 50]}\n")  # 50 clusters > 8 devices
    with pytest.raises(ConfigError, match="space.method.num_clusters"):
        load_space(bad, base)
    bad.write_text("method.mu: {normal: [0, 1]}\n")
    with pytest.raises(ConfigError, match="loguniform"):
        load_space(bad, base)


def test_sweep_of_two_trials_logs_children_and_parent(shared_ray, tmp_path, tracking_uri, monkeypatch):
    # two trials one after the other (the second in the first's warm process); trials at once: the plugin sweep
    # of tests/test_multinode.py
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)  # models:/ URIs (registered ones too) resolve against it
    base = tiny_config("train.rounds=3", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={tracking_uri}",
                       "tracking.experiment=sweep-test")
    space = load_space("mu_lambda.yaml", base)
    summary = run_sweep(base, space, SweepOptions(num_samples=2, scheduler="fifo", max_concurrent=1, name="t2",
                                                  storage=tmp_path / "tune", register="t2-best"))
    assert summary["trials"] == 2 and summary["errors"] == 0
    assert set(summary["best_config"]) == {"method.mu", "method.lam"}
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("sweep-test")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("sweep_parent") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == summary["parent_run_id"]]
    assert len(parent) == 1 and len(children) == 2
    for child in children:
        assert child.info.status == "FINISHED"
        assert "accuracy/acc_mean" in child.data.metrics and "loss/train_loss" in child.data.metrics
        assert child.data.params["method.mu"] == child.data.tags["space.method.mu"]
    mus = {c.data.params["method.mu"] for c in children}
    assert len(mus) == 2  # two different samples
    # on one node each trial runs its federation in its own (reused) process: the numbers of `lcfed run`
    assert summary["trial_engine"] == "local" and parent[0].data.params["trial_engine"] == "local"
    for child in children:
        assert child.data.params["engine.kind"] == "local" and child.data.tags["engine"] == "local"
        assert child.data.tags["placement.device_nodes"] == child.data.tags["placement.trial_node"]
        swept = {k: float(child.data.params[k]) for k in ("method.mu", "method.lam")}
        ref = run_local(base.replace(**swept, **{"engine.kind": "local", "tracking.enabled": False}))
        for key in ("acc_mean", "train_loss"):
            assert child.data.metrics[mlflow_key(key)] == ref.final[key], (swept, key)
    plots = {a.path for a in client.list_artifacts(parent[0].info.run_id, "plots")}
    assert plots == {"plots/top_trials.png", "plots/mu_lambda_heatmap.png", "plots/assignment_heatmap.png"}
    assert parent[0].data.tags["best.method.mu"] == str(summary["best_config"]["method.mu"])
    # the parent row: the best trial's metrics and swept values under the children's names, the space readable
    best_child = next(c for c in children if c.data.tags["tune_trial_id"] == summary["best_trial_id"])
    p = parent[0].data
    assert p.params["method.mu"] == best_child.data.params["method.mu"] == str(summary["best_config"]["method.mu"])
    assert p.params["method.lam"] == best_child.data.params["method.lam"]
    assert p.metrics["accuracy/acc_mean"] == best_child.data.metrics["accuracy/acc_mean"] == summary["best_acc_mean"]
    assert p.metrics["loss/train_loss"] == best_child.data.metrics["loss/train_loss"]
    assert p.tags["best_run_id"] == best_child.info.run_id
    # findable in the UI: the parent's description links to it, and it alone is tagged best_trial (a column)
    assert f"](#/experiments/{exp.experiment_id}/runs/{best_child.info.run_id})" in p.tags["mlflow.note.content"]
    assert [c.info.run_id for c in children if c.data.tags.get("best_trial") == "true"] == [best_child.info.run_id]
    assert p.params["space.method.mu"] == p.params["space.method.lam"] == "loguniform(0.001, 1)"
    # the UI view of the trials: the metric and the swept values as columns, best first
    view = read_view(exp.tags["mlflow.sharedViewState.sweep-t2"])  # listed in the UI's Views as "sweep t2"
    assert json.loads(exp.tags["mlflow.sharedViewState.sweep-t2"])["name"] == "sweep t2"
    assert view["selectedColumns"][:4] == ["metrics.`accuracy/acc_mean`", "metrics.`loss/train_loss`",
                                           "params.`method.mu`", "params.`method.lam`"]
    assert (view["orderByKey"], view["orderByAsc"], view["searchFilter"]) == ("metrics.`accuracy/acc_mean`", False,
                                                                              "tags.sweep = 't2'")
    assert summary["view"].endswith(f"/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
                                   "&viewStateShareKey=sweep-t2")
    assert (p.params["metric"], p.params["mode"], p.params["scheduler"]) == ("acc_mean", "max", "fifo")
    assert "grace_period" not in p.params
    text = Path(client.download_artifacts(summary["parent_run_id"], "space.yaml")).read_text()
    assert yaml.safe_load(text) == {"method.mu": {"loguniform": [0.001, 1.0]}, "method.lam": {"loguniform": [0.001, 1.0]}}
    names = [c.info.run_name for c in children]  # the swept values first, then the method, the data and the seed
    assert len(set(names)) == 2
    assert all(re.fullmatch(r"mu=[\d.e-]+ lam=[\d.e-]+ · lcfed · digits path2 · s0( #\d+)?", n) for n in names), names
    assert best_child.info.run_name.startswith(f"mu={float(best_child.data.params['method.mu']):.3g} ")
    assert {k: best_child.data.tags[k] for k in ("method", "dataset", "partition", "seed")} == {
        "method": "lcfed", "dataset": "digits", "partition": "path2", "seed": "0"}
    # Tune's own view of the sweep agrees: Tuner.restore(path, trainable).get_results()
    # (on a tie Tune keeps the first trial of its own list; the summary the lowest trial id of those tied)
    grid = restore_results(summary["storage"])
    assert len(grid) == 2 and grid.get_best_result().metrics["acc_mean"] == summary["best_acc_mean"]
    best = grid.get_best_result("acc_mean", "max")
    tied = {r.metrics["trial_id"]: {k: r.config[k] for k in ("method.mu", "method.lam")} for r in grid
            if r.metrics["acc_mean"] == best.metrics["acc_mean"]}
    assert summary["best_trial_id"] == min(tied) and tied[summary["best_trial_id"]] == summary["best_config"]
    _kept_checkpoints_and_the_registered_model(tmp_path, tracking_uri, base, summary, best_child)


def _kept_checkpoints_and_the_registered_model(tmp_path, uri, base, summary, best_child):
    """Each trial kept its latest 2 of 3 checkpoints (the default), the best trial's last one with its final
    models; they are logged on its run, and its personalized models registered, linked to the run;
    through mlflow.pyfunc, each device's raw uint8 test images give the trial's acc_mean exactly."""
    trials = [d for d in (tmp_path / "tune" / "t2").iterdir() if d.is_dir() and d.name.startswith("run_trial")]
    assert len(trials) == 2
    for trial in trials:
        kept = sorted(c.name for c in trial.glob("checkpoint_*"))
        assert kept == ["checkpoint_000001", "checkpoint_000002"]
        assert (trial / kept[-1] / "latest.pt").is_file() and not (trial / kept[0] / MODELS_FILE).exists()
    # the last checkpoint of every trial held its final models; only the best trial's stay
    assert [t.name.split("_")[3] for t in trials if (t / "checkpoint_000002" / MODELS_FILE).is_file()] == [
        summary["best_trial_id"].split("_")[1]]
    reg = summary["registered"]
    assert (reg["name"], reg["version"], reg["model"], reg["run_id"]) == ("t2-best", 1, "personal",
                                                                          best_child.info.run_id)
    assert set(summary["best_models"]) == {"personal", "clusters", "embedding"}
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = client.get_model_version("t2-best", "1")
    assert version.run_id == best_child.info.run_id and version.source == summary["best_models"]["personal"]
    assert client.get_run(best_child.info.run_id).data.tags["model.personal"] == version.source
    cfg = base.replace(**summary["best_config"])
    setup, ds = prepare(cfg), load(cfg)
    model = mlflow.pyfunc.load_model(reg["uri"])
    accs = [float((model.predict(ds.x[t], params={"device_id": d}).argmax(1) == ds.y[t]).mean())
            for d, t in enumerate(setup.partition.test)]
    assert sum(accs) / len(accs) == pytest.approx(best_child.data.metrics[mlflow_key("acc_mean")], abs=1e-12)


@pytest.fixture(scope="module")
def asha_sweep(shared_ray, tmp_path_factory, migrated_store):
    """One ``lcfed sweep`` for the two tests below: ASHA on ``--metric test_loss`` (grace period 1) over a
    learning rate that learns (0.05), one that barely does (1e-5: stopped at the rung) and one that diverges
    (1e6: fails in round 0); trials one at a time. Its exit code, stderr, summary, store and storage."""
    tmp = tmp_path_factory.mktemp("asha")
    uri = store_copy(migrated_store, tmp)  # an empty store (its creation: tests/test_lifecycle.py)
    base = tiny_config("train.rounds=3", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={uri}",
                       "tracking.experiment=sweep-asha")
    config, space = tmp / "base.yaml", tmp / "space.yaml"
    config.write_text(yaml.safe_dump(to_dict(base)))
    space.write_text("train.lr: {grid: [0.05, 0.00001, 1000000.0]}\n")
    out = tmp / "summary.json"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["sweep", "-c", str(config), "--space", str(space), "--metric", "test_loss", "--grace-period", "1",
                     "--max-concurrent", "1", "--name", "asha", "--storage", str(tmp / "tune"), "--json", str(out)])
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("sweep-asha")
    children = {r.data.params["train.lr"]: r for r in client.search_runs([exp.experiment_id])
                if "mlflow.parentRunId" in r.data.tags}
    return code, err.getvalue(), json.loads(out.read_text()), client, children


def test_a_diverging_trial_fails_alone_and_the_sweep_exits_1(asha_sweep):
    code, err, summary, _, children = asha_sweep
    assert code == 1
    assert "1 of 3 trials failed; first: lcfed.errors.DivergenceError: round 0" in err
    assert summary["trials"] == 3 and summary["errors"] == 1
    assert summary["best_config"] == {"train.lr": 0.05}
    assert children["0.05"].info.status == "FINISHED" and children["1e-05"].info.status == "FINISHED"
    assert children["1000000.0"].info.status == "FAILED"
    assert "DivergenceError" in children["1000000.0"].data.tags["failure_reason"]


def test_asha_on_a_loss_stops_the_worse_trial_early_and_finished(asha_sweep):
    """--metric test_loss (mode min by default) drives ASHA (grace period 1), the best trial, the summary and
    the parent run; the stopped trial ends FINISHED, tagged stopped_early with its round, not KILLED."""
    _, _, summary, client, children = asha_sweep
    assert (summary["metric"], summary["mode"], summary["scheduler"]) == ("test_loss", "min", "asha")
    assert (summary["grace_period"], summary["max_t"]) == (1, 3)
    assert summary["best_config"] == {"train.lr": 0.05}
    kept, stopped = children["0.05"], children["1e-05"]
    assert kept.info.status == "FINISHED" and kept.data.tags["stopped_early"] == "false"
    assert stopped.info.status == "FINISHED"
    assert stopped.data.tags["stopped_early"] == "true" and stopped.data.tags["stopped_at_round"] == "0"
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "loss/test_loss")] == [0]
    assert (kept.info.run_name, stopped.info.run_name) == ("lr=0.05 · lcfed · digits path2 · s0",
                                                           "lr=1e-05 · lcfed · digits path2 · s0")
    parent = client.get_run(summary["parent_run_id"])
    assert parent.data.params["train.lr"] == "0.05"
    assert parent.data.params["space.train.lr"] == "grid([0.05, 1e-05, 1000000.0])"
    assert (parent.data.params["metric"], parent.data.params["mode"], parent.data.params["grace_period"],
            parent.data.params["max_t"]) == ("test_loss", "min", "1", "3")
    assert parent.data.metrics["loss/test_loss"] == kept.data.metrics["loss/test_loss"] == summary["best_test_loss"]
    assert parent.data.metrics["loss/best_test_loss"] == summary["best_test_loss"]
    assert parent.data.metrics["accuracy/acc_mean"] == kept.data.metrics["accuracy/acc_mean"]
    grid = restore_results(summary["storage"])
    best = grid.get_best_result("test_loss", "min")
    assert best.config["train.lr"] == 0.05 and best.metrics["test_loss"] == summary["best_test_loss"]
    assert grid.get_best_result().config["train.lr"] == 0.05  # the sweep's metric and mode are Tune's defaults


def _proposals(storage: str) -> list[dict]:
    """The swept values of a sweep's trials in the order they were created."""
    from tune_jobs.sweep.best import trial_order

    grid = restore_results(storage)
    order = trial_order(grid)
    results = sorted(grid, key=lambda r: order[r.metrics["trial_id"]])
    return [{k: r.config[k] for k in ("method.mu", "method.lam")} for r in results]


@pytest.mark.slow  # ~45 s; ASHA: test_asha_on_a_loss...; --search choices: tests/test_bad_inputs.py
def test_an_optuna_sweep_with_asha_is_seeded_and_prints_one_table(shared_ray, tmp_path, tracking_uri, capsys):
    """--search optuna: Tune's OptunaSearch seeded by the config's seed (the same proposals again), ASHA stops
    trials at the half-way rung, the best trial is one that ran every round, and the console has a line per
    reported round (no terminal) and one final table, never the base config."""
    base = tiny_config("train.rounds=4", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={tracking_uri}",
                       "tracking.experiment=sweep-optuna")
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(to_dict(base)))
    args = ["sweep", "-c", str(config), "--space", "mu_lambda.yaml", "--search", "optuna", "--max-concurrent", "2"]
    out = tmp_path / "summary.json"
    assert main([*args, "--num-samples", "5", "--name", "opt", "--storage", str(tmp_path / "tune"),
                 "--json", str(out)]) == 0
    console = capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert (summary["search"], summary["scheduler"], summary["grace_period"], summary["trials"]) == ("optuna", "asha",
                                                                                                     2, 5)
    assert "__base__" not in console and "'data':" not in console
    assert re.search(r"trial 1 \(\w+\) mu=[\d.e-]+ lam=[\d.e-]+: round 0 \(1/4\)  acc_mean [\d.]+", console)
    table = console[console.index("sweep: 5/5 trials ended"):].splitlines()
    assert table[1].split() == ["trial", "status", "mu", "lam", "round", "acc_mean"]
    rows = [line.lstrip("* ").split() for line in table[2:7]]
    assert {r[1] for r in rows} <= {"done", "stopped"} and any(r[-2] == "4/4" for r in rows)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    parent = client.get_run(summary["parent_run_id"])
    assert parent.data.params["search"] == "optuna"
    children = [r for r in client.search_runs([parent.info.experiment_id])
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    best = next(c for c in children if c.data.tags["tune_trial_id"] == summary["best_trial_id"])
    assert best.data.tags["stopped_early"] == "false"  # compared with the trials that ran all 4 rounds only
    first = _proposals(summary["storage"])
    assert len({p["method.mu"] for p in first}) == 5
    # the same seed proposes the same values: a second, shorter sweep starts with the first one's trials
    assert main([*args, "--num-samples", "2", "--set", "train.rounds=1", "--scheduler", "fifo", "--name", "opt2",
                 "--storage", str(tmp_path / "tune")]) == 0
    again = _proposals(str(tmp_path / "tune" / "opt2"))
    assert again == first[:2]


def test_missing_dataset_fails_before_anything_is_created(tmp_path, capsys):
    store = tmp_path / "mlflow.db"
    code = main(["sweep", "--space", "mu_lambda.yaml", "--set", "data.dataset=mnist", "--set",
                 f"data.data_dir={tmp_path / 'nothing'}", "--set", f"tracking.uri=sqlite:///{store}",
                 "--storage", str(tmp_path / "tune")])
    assert code == 2
    err = capsys.readouterr().err
    assert "data error" in err and "lcfed data import" in err and "Traceback" not in err
    assert not store.exists() and not (tmp_path / "tune").exists()


def test_fedac_and_dcpfl_spaces():
    fedac = tiny_config("method.name=fedac", "data.num_devices=12", "method.max_clusters=10")
    assert set(load_space("fedac_gap.yaml", fedac)) == {"method.gap_low", "method.gap_high", "method.num_clusters"}
    dcpfl = tiny_config("method.name=dcpfl")
    assert set(load_space("dcpfl_schedule.yaml", dcpfl)) == {"method.tau", "method.alpha", "method.gamma_step"}
    with pytest.raises(ConfigError, match="space.method.tau"):  # a DC-PFL space on an LCFed base
        load_space("dcpfl_schedule.yaml", tiny_config())


@pytest.mark.slow
def test_a_fedac_sweep(shared_ray, tmp_path, tracking_uri):
    from ray import tune

    base = tiny_config("method.name=fedac", "train.rounds=2", "engine.num_cpus=2", "tracking.enabled=true",
                       f"tracking.uri={tracking_uri}", "tracking.experiment=sweep-fedac")
    summary = run_sweep(base, {"method.gap_high": tune.grid_search([0.7, 1.2])},
                        SweepOptions(scheduler="fifo", max_concurrent=1, name="fedac", storage=tmp_path / "tune"))
    assert summary["trials"] == 2 and summary["errors"] == 0
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("sweep-fedac")
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(c.data.params["method.gap_high"] for c in children) == ["0.7", "1.2"]
    assert all("server/num_clusters" in c.data.metrics for c in children)


@pytest.mark.parametrize("sig", ["SIGTERM"])
def test_a_signal_stops_the_sweep_killed_with_a_reason_and_resume_finishes_it(shared_ray, tmp_path, tracking_uri, sig):
    import signal
    import subprocess
    import sys
    import time

    rounds = 6
    base = tiny_config(f"train.rounds={rounds}", "engine.num_cpus=2", "tracking.enabled=true",
                       f"tracking.uri={tracking_uri}", "tracking.experiment=sweep-sig")
    config, space = tmp_path / "base.yaml", tmp_path / "space.yaml"
    config.write_text(yaml.safe_dump(to_dict(base)))
    space.write_text("method.mu: {grid: [0.05, 0.2]}\n")
    cmd = [sys.executable, "-m", "tune_jobs", "sweep", "-c", str(config), "--space", str(space), "--scheduler", "fifo",
           "--max-concurrent", "1", "--name", "sig", "--storage", str(tmp_path / "tune")]
    # the sweep attaches to the module's Ray, as a sweep in a Ray job does (a job is stopped by SIGTERM): a private
    # start costs seconds (it is tested in tests/test_connect.py)
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    client = open_client(tracking_uri)  # under the store's lock: the sweep may be creating the database now

    def runs() -> list:
        exp = client.get_experiment_by_name("sweep-sig")
        return client.search_runs([exp.experiment_id]) if exp else []

    while proc.poll() is None and not any("accuracy/acc_mean" in r.data.metrics for r in runs()):
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep ended before the signal"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + getattr(signal, sig), err[-3000:]
    assert "Traceback" not in err
    assert f"lcfed: {sig}: stopping the sweep" in err
    stopped = runs()
    assert stopped and all(r.info.status != "RUNNING" for r in stopped)
    parent = next(r for r in stopped if r.data.tags.get("sweep_parent") == "true")
    assert parent.info.status == "KILLED"
    assert sig in parent.data.tags["failure_reason"] and "--resume --name sig" in parent.data.tags["failure_reason"]
    assert re.search(r"sweep stopped with [12] trial\(s\) unfinished", parent.data.tags["failure_reason"])
    assert any(r.info.status == "KILLED" and sig in r.data.tags.get("failure_reason", "") for r in stopped
               if r.data.tags.get("sweep_parent") != "true")

    assert main(["sweep", "-c", str(config), "--space", str(space), "--scheduler", "fifo", "--max-concurrent", "1",
                 "--name", "sig", "--storage", str(tmp_path / "tune"), "--resume"]) == 0
    done = runs()
    children = [r for r in done if r.data.tags.get("sweep_parent") != "true"]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    assert all(r.info.status == "FINISHED" for r in done)
    for child in children:  # every round logged once, across the stop and the resume
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "accuracy/acc_mean")]
        assert sorted(set(steps)) == list(range(rounds)), steps


def test_auto_trial_engine_is_local_on_one_node_with_at_most_one_gpu_per_trial():
    from tune_jobs.sweep.options import resolve_trial_engine

    assert resolve_trial_engine("auto", 0.0, nodes=1) == "local"
    assert resolve_trial_engine("auto", 1.0, nodes=1) == "local"
    assert resolve_trial_engine("auto", 2.0, nodes=1) == "ray"  # one process drives one GPU
    assert resolve_trial_engine("auto", 0.5, nodes=4) == "ray"  # device actors go to the GPU workers
    assert resolve_trial_engine("ray", 0.0, nodes=1) == "ray"
    assert resolve_trial_engine("local", 0.5, nodes=4) == "local"
    with pytest.raises(ConfigError, match="--gpus-per-trial"):
        resolve_trial_engine("local", 2.0, nodes=1)
    with pytest.raises(ConfigError, match="--trial-engine"):
        resolve_trial_engine("threads", 0.0, nodes=1)


def test_a_local_trial_asks_for_its_threads_and_gpu_share_in_one_bundle():
    from tune_jobs.sweep.trial import trial_config, trial_resources

    cfg = tiny_config("engine.torch_threads=2", "engine.workers=2")
    assert trial_resources(cfg, 0.5, "local").bundles == [{"CPU": 4, "GPU": 0.5}]
    assert trial_resources(tiny_config(), 0.0, "local").bundles == [{"CPU": 1}]
    assert trial_resources(tiny_config(), 0.0, "ray").bundles == [{"CPU": 0.5}, {"CPU": 1.0}]
    meta = {"name": "s", "gpus_per_trial": 0.0, "parent_run_id": "p"}
    config = {"__base__": to_dict(cfg), "__sweep__": {**meta, "trial_engine": "local"}, "method.mu": 0.3}
    local = trial_config(config, "t1")
    assert local.engine.kind == "local" and to_dict(local)["method"]["mu"] == 0.3 and local.tracking.run_name == "s-t1"
    assert trial_config({**config, "__sweep__": meta}, "t1").engine.kind == "ray"  # a sweep from before


def test_sweeps_sharing_their_datasets_put_them_in_the_object_store_once(monkeypatch):
    from tune_jobs.sweep import run

    puts: list[object] = []
    monkeypatch.setattr(run.ray, "put", lambda value: puts.append(value) or f"ref{len(puts)}")
    shared: dict = {}
    digits, mnist = {("digits",): "d"}, {("mnist",): "m"}
    assert run.put_sources(digits, shared) == "ref1" and run.put_sources(dict(digits), shared) == "ref1"
    assert run.put_sources(mnist, shared) == "ref2" and puts == [digits, mnist]


@pytest.mark.slow  # ~20 s each; local: the two-trial sweep checks its trials' numbers and engine; ray: test_multinode
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_trials_equal_lcfed_run_of_the_same_config_and_name_their_engine(shared_ray, tmp_path, tracking_uri, engine):
    """Every trial's numbers are those of ``lcfed run`` (run_local) of its config, on either trial
    engine; two trials one after the other: the second reuses the first's warm process (local)."""
    from ray import tune

    base = tiny_config("train.rounds=2", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={tracking_uri}",
                       "tracking.experiment=sweep-eq")
    mus = [0.05, 0.5]
    summary = run_sweep(base, {"method.mu": tune.grid_search(mus)},
                        SweepOptions(scheduler="fifo", max_concurrent=1, name=f"eq-{engine}", storage=tmp_path / "tune",
                                     trial_engine=engine))
    assert summary["trials"] == 2 and summary["errors"] == 0 and summary["trial_engine"] == engine
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("sweep-eq")
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(float(c.data.params["method.mu"]) for c in children) == mus
    parent = client.get_run(summary["parent_run_id"])
    assert parent.data.params["trial_engine"] == engine
    for child in children:
        assert child.data.params["engine.kind"] == engine and child.data.tags["engine"] == engine
        assert child.data.tags["placement.device_nodes"] == child.data.tags["placement.trial_node"]
        mu = float(child.data.params["method.mu"])
        ref = run_local(base.replace(**{"method.mu": mu, "engine.kind": "local", "tracking.enabled": False}))
        for key in ("acc_mean", "train_loss"):
            assert child.data.metrics[mlflow_key(key)] == ref.final[key], (engine, mu, key)


# -- untracked (moved here from tests/test_plugin_errors.py: on this module's Ray) ----------------------------

#: what MLflow creates in the working directory (the default store, a file store, a server's artifacts)
MLFLOW_FILES = ("mlflow.db", "mlruns", "mlartifacts")


def mlflow_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name in MLFLOW_FILES)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory, with no tracking store named by the environment; the base config there
    asks for tracking (so it is the flag or the --set that turns it off)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    base = tiny_config("engine.num_cpus=2", "tracking.enabled=true")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(to_dict(base)))
    (tmp_path / "space.yaml").write_text("method.mu: {grid: [0.05, 0.5]}\n")
    return tmp_path


def test_an_untracked_sweep_reports_its_best_trial_and_creates_no_mlflow_file(shared_ray, workdir, capsys):
    """``--no-track``, which stands for ``tracking.enabled: false`` (tests/test_plugin_errors.py)."""
    code = main(["sweep", "-c", "base.yaml", "--space", "space.yaml", "--set", "train.rounds=2", "--scheduler", "fifo",
                 "--max-concurrent", "1", "--storage", "tune", "--name", "untracked", "--json", "summary.json",
                 "--no-track"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["trials"] == 2 and summary["errors"] == 0
    assert summary["best_config"]["method.mu"] in (0.05, 0.5) and summary["best_acc_mean"] > 0
    assert (summary["parent_run_id"], summary["tracking_uri"], summary["view"], summary["registered"]) == (
        None, None, None, None)
    assert "sweep: 2/2 trials ended; best acc_mean" in out and "MLflow" not in out
    assert f"not tracked: the trials are in Tune's storage, {workdir / 'tune' / 'untracked'}" in out
    assert mlflow_files(workdir) == []
    assert (workdir / "tune" / "untracked").is_dir()
    assert not list((workdir / "tune").rglob("final_models.pt"))  # no run to log them on: none kept
