"""End-to-end: ``lcfed run`` on digits writes a complete MLflow run, and LCFed beats FedAvg."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from lcfed import numerics
from lcfed.run.metric_catalog import SUMMARY
from tests.conftest import tiny_config
from tune_jobs.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "configs" / "demo.yaml")
# 2-class pathological digits with a weak pull to the cluster: where one FedAvg model clearly loses
FAST = ["train.rounds=6", "train.local_steps=5", "data.num_devices=16", "data.partition=pathological", "data.classes_per_device=2",
        "data.test_fraction=0.25"]


def _run(tmp_path: Path, uri: str, *sets: str) -> dict:
    out = tmp_path / f"result-{len(list(tmp_path.glob('result-*')))}.json"
    args = ["run", "--config", DEMO, "--quiet", "--json", str(out), "--set", f"tracking.uri={uri}"]
    for s in [*FAST, *sets]:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(out.read_text())


@pytest.mark.subprocess
def test_run_logs_to_mlflow_and_lcfed_beats_fedavg(tmp_path, tracking_uri, capfd):
    lc = _run(tmp_path, tracking_uri, "method.mu=0.1")
    printed, err = capfd.readouterr()
    assert "acc_mean" in printed and "mlflow ui --backend-store-uri" in printed and ".venv/bin/mlflow ui" in printed and lc["run_id"] in printed
    # -q: the summary alone (a blank line, the title, 2 column heads, a row per metric, which devices the last
    # evaluation scored, s/round, numerics, the MLflow run in 3 lines): no partition line, no progress, none of
    # MLflow's INFO lines (creating the store)
    rows = sum(key in lc for key in SUMMARY)
    assert len(printed.splitlines()) == 1 + 1 + 2 + rows + 3 + 3, printed
    assert "  evaluated      every trained device (16)" in printed.splitlines()
    assert lc["final_eval"] == {"devices": 16, "trained": 16, "sampled": False}
    assert printed.splitlines()[1] == "demo: lcfed on digits (pathological), 16 devices, 6 rounds, engine local"
    assert err == "", err
    fa = _run(tmp_path, tracking_uri, "method.name=fedavg", "tracking.run_name=fedavg")
    margin = lc["acc_mean"] - fa["acc_mean"]
    print(f"\nLCFed {lc['acc_mean']:.4f} vs FedAvg {fa['acc_mean']:.4f}: margin {margin:+.4f}")
    assert margin > 0.03

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(lc["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["method.name"] == "lcfed" and run.data.params["method.mu"] == "0.1"
    assert run.data.params["data.partition"] == "pathological"
    # what produced the numbers: the summary's record is the run's provenance.json; two of it are tags
    p = lc["provenance"]
    assert p["numerics"] == "portable" and p["torch"] == torch.__version__ and p["threads"] == "1"
    assert p["kernels"] == torch.backends.cpu.get_cpu_capability() and p["cpu"] == numerics.cpu_model()
    assert mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/provenance.json") == p
    assert {k: v for k, v in run.data.tags.items() if k.startswith("provenance")} == {
        "provenance.numerics": "portable", "provenance.fingerprint": p["fingerprint"]}
    # params: the fields that apply (a pathological split, the in-process engine), the store as resolved;
    # the whole config is config.yaml
    params = run.data.params
    assert "data.classes_per_device" in params and "data.alpha" not in params and "data.primary" not in params
    assert "engine.torch_threads" in params and not any(k in params for k in ("engine.num_actors", "engine.address",
                                                                            "engine.data_reads"))
    assert not any(k.startswith("devices.") and k != "devices.simulate" for k in params)
    assert params["tracking.uri"] == tracking_uri and "train.local_epochs" not in params
    config = yaml.safe_load(mlflow.artifacts.load_text(f"{run.info.artifact_uri}/config.yaml"))
    assert config["data"]["partition"] == "pathological" and config["engine"]["num_actors"] == 0
    # every metric under its run-page section: accuracy, loss, server, time, traffic (docs/mlflow.md)
    for key in ("accuracy/acc_mean", "accuracy/acc_weighted", "accuracy/acc_p10", "accuracy/acc_p90",
                "loss/train_loss", "traffic/bytes_up", "traffic/bytes_down", "server/cluster_size_0",
                "server/num_clusters", "server/label_homogeneity", "server/coverage", "time/round_seconds"):
        assert key in run.data.metrics, key
    assert {k.split("/")[0] for k in run.data.metrics} == {"accuracy", "loss", "server", "time", "traffic"}
    assert next(iter(run.data.metrics)).startswith("accuracy/")  # first logged: the run page lists it first
    history = client.get_metric_history(lc["run_id"], "accuracy/acc_mean")
    assert [m.step for m in history] == list(range(6))
    assert run.data.metrics["accuracy/acc_mean"] == lc["acc_mean"]
    sizes = sum(run.data.metrics[f"server/cluster_size_{k}"] for k in range(5))
    assert sizes == 16
    assert run.data.metrics["traffic/bytes_up"] > 16 * 61_706 * 4  # every device uploads its model (+ code)
    # named for what ran (the --set values, the data, the seed) and tagged to group the runs table by
    assert run.info.run_name == "lcfed rounds=6 local_steps=5 num_devices=16 test_fraction=0.25 mu=0.1 · digits path2 · s0"
    assert {k: run.data.tags[k] for k in ("method", "dataset", "partition", "seed")} == {
        "method": "lcfed", "dataset": "digits", "partition": "path2", "seed": "0"}
    assert client.get_run(fa["run_id"]).info.run_name == "fedavg"  # tracking.run_name wins
    local = Path(mlflow.artifacts.download_artifacts(run_id=lc["run_id"], dst_path=str(tmp_path / "art"),
                                                     tracking_uri=tracking_uri))
    assignment = (local / "clusters" / "assignment.csv").read_text().splitlines()
    assert assignment[0] == "device,cluster" and len(assignment) == 17
    assert (local / "plots" / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert len((local / "clusters" / "assignment_history.csv").read_text().splitlines()) == 6 + 1
    assert (local / "metrics" / "history.csv").exists()
    # the store and its artifacts live where the URI says, not in the working directory
    assert str(tmp_path) in run.info.artifact_uri
    assert (local / "metrics" / "devices.csv").read_text().startswith("device,cluster,trained,correct,total,accuracy")

    # the UI opens the experiment on its runs table; source, commit, user, dataset, models
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert {"mlflow.source.name", "mlflow.user", "model.personal", "model.clusters"} <= set(run.data.tags)
    assert len(run.data.tags.get("mlflow.source.git.commit", "0" * 40)) == 40
    (dataset,) = [d.dataset for d in run.inputs.dataset_inputs]
    assert dataset.name == "digits" and '"partition": "pathological"' in dataset.profile and dataset.source_type == "local"
    assert not any(k.startswith("system/") for k in run.data.metrics)  # off unless asked (docs/mlflow.md)
    # the per-layer traffic is a table and one chart, not a flat line per layer
    assert not any(k.startswith(("traffic/bytes_up/", "traffic/bytes_down/")) for k in run.data.metrics)
    layers = (local / "traffic" / "layers.csv").read_text().splitlines()
    assert layers[0] == "round,layer,bytes_up,bytes_down" and len(layers) == 1 + 6 * 6  # conv1..fc3, other
    assert (local / "plots" / "traffic_layers.png").read_bytes()[:4] == b"\x89PNG"


def test_progress_without_a_terminal_is_plain_lines_and_quiet_is_silent():
    """In a Ray job's log there is no TTY: progress comes as lines (first round, then at most every
    LINE_EVERY_S seconds, and the last round), not tqdm's carriage returns."""
    import io

    from lcfed.engines.local import run_local
    from lcfed.run.progress import ProgressBar

    out, quiet = io.StringIO(), io.StringIO()
    run_local(tiny_config("train.rounds=3"), [ProgressBar(file=out), ProgressBar(disable=True, file=quiet)])
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and quiet.getvalue() == ""
    assert lines[0].startswith("round 0 (1/3)  acc_mean ") and lines[-1].startswith("round 2 (3/3)  acc_mean ")
    assert all("train_loss" in line and "eta" in line for line in lines) and 2 <= len(lines) <= 3
    # rounds that are not evaluated show the last evaluation and its round, never nan
    bar = ProgressBar(file=io.StringIO())
    bar.lines, bar.rounds = True, 3
    shown = []
    for rnd, acc in enumerate([math.nan, 0.5, math.nan]):
        bar.last_line = -1e9  # every round prints
        bar.on_round(rnd, {"acc_mean": acc, "train_loss": 1.0}, None)  # type: ignore[arg-type]
        shown.append(bar.file.getvalue().splitlines()[-1].split("  ")[1])
    assert shown == ["acc_mean not evaluated yet", "acc_mean 0.5000", "acc_mean 0.5000 (round 1)"]
