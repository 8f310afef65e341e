"""The final models logged to MLflow load back with ``mlflow.pytorch.load_model`` and reproduce the
run's per-device accuracies; system metrics stop with the run, also when it fails or the store is gone."""

from __future__ import annotations

import csv
import io
import threading

import mlflow
import pytest
import torch

from lcfed.engines.local import run_local
from lcfed.federation import device_data, load, prepare
from lcfed.loop import DivergenceError
from lcfed.tracking import MLflowObserver
from tests.conftest import tiny_config


def _monitors() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]


def test_logged_models_reproduce_each_devices_accuracy(tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)  # models:/ URIs resolve against it
    cfg = tiny_config("tracking.enabled=true", f"tracking.uri={tracking_uri}")
    obs = MLflowObserver(tracking_uri)
    result = run_local(cfg, [obs])
    assert obs.monitor is None and not _monitors()
    client = mlflow.MlflowClient(tracking_uri)
    run = client.get_run(obs.run_id)
    assert run.info.status == "FINISHED"
    assert {"model.personal", "model.clusters", "model.embedding"} <= set(run.data.tags)
    assert any(k.startswith("system/") for k in run.data.metrics)  # one point even for a short run

    rows = list(csv.DictReader(io.StringIO(mlflow.artifacts.load_text(f"runs:/{obs.run_id}/metrics/devices.csv"))))
    assert [int(r["device"]) for r in rows] == list(range(8))
    counted = [float(r["accuracy"]) for r in rows if r["trained"] == "1"]
    assert sum(counted) / len(counted) == pytest.approx(run.data.metrics["accuracy/acc_mean"], abs=1e-12)

    setup = prepare(cfg)
    data = device_data(load(cfg), setup.partition, range(8), torch.device("cpu"), setup.scaling)
    personal = mlflow.pytorch.load_model(run.data.tags["model.personal"])
    assert len(personal) == 8 and personal.names[3] == "device_3"
    with torch.no_grad():
        for row in rows:
            d = int(row["device"])
            correct = int((personal(data[d].x_test, d).argmax(1) == data[d].y_test).sum())
            assert (correct, data[d].num_test) == (int(row["correct"]), int(row["total"]))
            assert float(row["accuracy"]) == correct / data[d].num_test  # exactly the run's number
            standalone = personal.module(d)  # a plain LeNet5 with device d's weights
            assert torch.equal(standalone(data[d].x_test), personal(data[d].x_test, d))

    clusters = mlflow.pytorch.load_model(run.data.tags["model.clusters"])
    assert len(clusters) == cfg.method.params.num_clusters
    assert clusters(data[0].x_test, 0).shape == (data[0].num_test, 10)
    embedding = mlflow.pytorch.load_model(run.data.tags["model.embedding"])
    assert embedding(data[0].x_test).shape == (data[0].num_test, 84)  # φ's features, no decision layer
    assert result.tracking["model_personal"] == run.data.tags["model.personal"]


def test_fedavg_logs_its_global_model(tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    obs = MLflowObserver(tracking_uri, system_metrics=False)
    run_local(tiny_config("method.name=fedavg", "train.rounds=2", "tracking.enabled=true", f"tracking.uri={tracking_uri}"),
              [obs])
    tags = mlflow.MlflowClient(tracking_uri).get_run(obs.run_id).data.tags
    model = mlflow.pytorch.load_model(tags["model.global"])
    assert type(model).__name__ == "LeNet5" and "model.clusters" not in tags


def test_system_metrics_stop_when_the_run_fails(tracking_uri):
    obs = MLflowObserver(tracking_uri)
    with pytest.raises(DivergenceError):
        run_local(tiny_config("train.lr=1e6", "tracking.enabled=true", f"tracking.uri={tracking_uri}"), [obs])
    assert obs.monitor is None and not _monitors()
    run = mlflow.MlflowClient(tracking_uri).get_run(obs.run_id)
    assert run.info.status == "FAILED" and "model.personal" not in run.data.tags


def test_store_gone_at_the_end_skips_the_models_with_a_warning(tracking_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    obs = MLflowObserver(tracking_uri)
    real_flush = obs._flush
    obs._flush = lambda final: False if final else real_flush(final)  # type: ignore[method-assign]
    with pytest.warns(UserWarning, match="final models were not logged"):
        result = run_local(tiny_config("tracking.enabled=true", f"tracking.uri={tracking_uri}"), [obs])
    assert result.models is not None and obs.monitor is None and not _monitors()
    tags = mlflow.MlflowClient(tracking_uri).get_run(obs.run_id).data.tags
    assert not any(k.startswith("model.") for k in tags)
