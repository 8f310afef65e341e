"""The final models logged to MLflow load back with ``mlflow.pytorch.load_model`` and
``mlflow.pyfunc.load_model``, take raw stored images (the run's scaling inside) and reproduce the run's
per-device accuracies; system metrics stop with the run, also when it fails or the store is gone."""

from __future__ import annotations

import csv
import io
import threading
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from lcfed.data import Scaling
from lcfed.engines.local import run_local
from lcfed.run.loop import DivergenceError
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from lcfed.tracking import MLflowObserver, RawInputModel, mlflow_key
from tests.conftest import tiny_config


def _monitors() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]


def test_logged_models_on_raw_images_reproduce_each_devices_accuracy(tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)  # models:/ URIs resolve against it
    cfg = tiny_config("tracking.enabled=true", f"tracking.uri={tracking_uri}")
    obs = MLflowObserver(tracking_uri)
    result = run_local(cfg, [obs])
    assert obs.monitor is None and not _monitors()
    client = mlflow.MlflowClient(tracking_uri)
    run = client.get_run(obs.run_id)
    assert run.info.status == "FINISHED"
    assert {"model.personal", "model.clusters", "model.embedding"} <= set(run.data.tags)
    assert not any(k.startswith("system/") for k in run.data.metrics)  # off unless the environment asks

    rows = list(csv.DictReader(io.StringIO(mlflow.artifacts.load_text(f"runs:/{obs.run_id}/metrics/devices.csv"))))
    assert [int(r["device"]) for r in rows] == list(range(8))
    counted = [float(r["accuracy"]) for r in rows if r["trained"] == "1"]
    assert sum(counted) / len(counted) == pytest.approx(run.data.metrics["accuracy/acc_mean"], abs=1e-12)

    setup = prepare(cfg)
    ds = load(cfg)
    data = setup.device_data(ds, range(8), torch.device("cpu"))
    raw = {d: torch.from_numpy(ds.x[setup.partition.test[d]]) for d in range(8)}  # uint8, as stored
    personal = mlflow.pytorch.load_model(run.data.tags["model.personal"])
    assert len(personal.net) == 8 and personal.net.names[3] == "device_3"
    with torch.no_grad():
        for row in rows:
            d = int(row["device"])
            correct = int((personal(raw[d], device_id=d).argmax(1) == data[d].y_test).sum())
            assert (correct, data[d].num_test) == (int(row["correct"]), int(row["total"]))
            assert float(row["accuracy"]) == correct / data[d].num_test  # exactly the run's number
            assert torch.equal(personal.preprocess(raw[d]), data[d].x_test)  # the run's own scaling, bit for bit
            standalone = personal.net.module(d)  # a plain LeNet5 with device d's weights, on scaled inputs
            assert torch.equal(standalone(data[d].x_test), personal(raw[d], device_id=d))
    with pytest.raises(TypeError, match="uint8 images"):  # scaled inputs are refused, never scaled twice
        personal(data[0].x_test, device_id=0)
    with pytest.raises(ValueError, match="device_id"):
        personal(raw[0])

    clusters = mlflow.pytorch.load_model(run.data.tags["model.clusters"])
    assert len(clusters.net) == cfg.method.params.num_clusters
    assert clusters(raw[0], cluster=0).shape == (data[0].num_test, 10)
    embedding = mlflow.pytorch.load_model(run.data.tags["model.embedding"])
    assert embedding(raw[0]).shape == (data[0].num_test, 84)  # φ's features, no decision layer
    assert result.tracking["model_personal"] == run.data.tags["model.personal"]
    _pyfunc_on_raw_test_images_reproduces_the_runs_accuracy(cfg, run)  # the same run: no second one


def _pyfunc_on_raw_test_images_reproduces_the_runs_accuracy(cfg, run):
    """Each device's raw uint8 test images through ``mlflow.pyfunc`` (its personal model picked by the
    ``device_id`` param) give exactly the run's per-device counts and its acc_mean; the signature says
    what goes in and out."""
    uri = run.data.tags["model.personal"]
    sig = mlflow.models.get_model_info(uri).signature
    assert sig.inputs.to_dict() == [{"type": "tensor", "tensor-spec": {"dtype": "uint8", "shape": (-1, 1, 28, 28)}}]
    assert sig.outputs.to_dict() == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": (-1, 10)}}]
    assert [p.name for p in sig.params] == ["device_id"]
    example = mlflow.models.Model.load(uri).load_input_example()
    assert example.dtype == np.uint8 and example.shape == (1, 1, 28, 28)

    setup, ds = prepare(cfg), load(cfg)
    model = mlflow.pyfunc.load_model(uri)
    rows = list(csv.DictReader(io.StringIO(mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/metrics/devices.csv"))))
    accuracies = []
    for row in rows:
        d = int(row["device"])
        test = setup.partition.test[d]
        logits = model.predict(ds.x[test], params={"device_id": d})
        correct = int((logits.argmax(1) == ds.y[test]).sum())
        assert (correct, len(test)) == (int(row["correct"]), int(row["total"]))
        if row["trained"] == "1":
            accuracies.append(correct / len(test))
    assert sum(accuracies) / len(accuracies) == pytest.approx(run.data.metrics[mlflow_key("acc_mean")], abs=1e-12)
    with pytest.raises(Exception, match="uint8"):  # scaled floats do not pass the signature
        model.predict(ds.x[:2].astype(np.float32), params={"device_id": 0})


def test_fedavg_logs_its_global_model_in_its_runs_experiment_and_store(tracking_uri, tmp_path, monkeypatch):
    """Its global model loads back (pytorch and pyfunc alike, pinned requirements); the run's own experiment
    lists its models (the run page and the Models tab read that), their files lie in the configured store,
    and nothing appears under ./mlruns. One run for both (model logging is the cost)."""
    from mlflow.utils import requirements_utils

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)  # as in a fresh process
    obs = MLflowObserver(tracking_uri, system_metrics=False)
    cfg = tiny_config("method.name=fedavg", "train.rounds=1", "tracking.enabled=true", f"tracking.uri={tracking_uri}",
                      "tracking.experiment=models-here")
    run_local(cfg, [obs])
    unbuilt = requirements_utils._MODULES_TO_PACKAGES is None
    client = mlflow.MlflowClient(tracking_uri)
    tags = client.get_run(obs.run_id).data.tags
    model = mlflow.pytorch.load_model(tags["model.global"])
    assert type(model.net).__name__ == "LeNet5" and "model.clusters" not in tags
    ds = load(cfg)
    logits = mlflow.pyfunc.load_model(tags["model.global"]).predict(ds.x[:5])
    with torch.no_grad():
        assert np.array_equal(logits, model(torch.from_numpy(ds.x[:5])).numpy())
    assert mlflow.models.get_model_info(tags["model.global"]).signature.params is None
    # the requirements are the pins of the running versions (checked against them without MLflow's map of every
    # installed package, which the run left unbuilt for any other caller to build whole)
    assert unbuilt
    requirements = Path(mlflow.pyfunc.get_model_dependencies(tags["model.global"])).read_text().split()
    assert {f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"} <= set(requirements)

    exp = client.get_experiment_by_name("models-here")
    models = client.search_logged_models(experiment_ids=[exp.experiment_id])
    assert {m.name for m in models} == {"global", "personal"} and {m.source_run_id for m in models} == {obs.run_id}
    assert not client.search_logged_models(experiment_ids=["0"])
    assert not (tmp_path / "mlruns").exists()
    assert all(m.artifact_location.startswith(exp.artifact_location) for m in models)


def test_system_metrics_when_asked_get_a_point_and_stop_when_the_run_fails(tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")  # MLflow's own switch turns them on
    obs = MLflowObserver(tracking_uri)
    assert obs.system_metrics
    with pytest.raises(DivergenceError):
        run_local(tiny_config("train.lr=1e6", "tracking.enabled=true", f"tracking.uri={tracking_uri}"), [obs])
    assert obs.monitor is None and not _monitors()
    run = mlflow.MlflowClient(tracking_uri).get_run(obs.run_id)
    assert run.info.status == "FAILED" and "model.personal" not in run.data.tags
    assert any(k.startswith("system/") for k in run.data.metrics)  # one point even for a short run


def test_store_gone_at_the_end_skips_the_models_with_a_warning(tracking_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    obs = MLflowObserver(tracking_uri)
    real_flush = obs._flush
    obs._flush = lambda final: False if final else real_flush(final)  # type: ignore[method-assign]
    with pytest.warns(UserWarning, match="final models were not logged"):
        result = run_local(tiny_config("train.rounds=1", "tracking.enabled=true", f"tracking.uri={tracking_uri}"), [obs])
    assert result.models is not None and obs.monitor is None and not _monitors()
    tags = mlflow.MlflowClient(tracking_uri).get_run(obs.run_id).data.tags
    assert not any(k.startswith("model.") for k in tags)


@pytest.mark.parametrize("kind", ["images", "features", "unit"])
def test_a_logged_model_scales_stored_samples_exactly_as_the_run_did(kind):
    """RawInputModel's preprocessing is Scaling.apply bit for bit: uint8 images (N, C, H, W), float32
    feature vectors (N, F), and plain [0, 1] images (data.normalize: unit); other dtypes are refused."""
    rng = np.random.default_rng(0)
    if kind == "features":
        x = rng.normal(3.0, 2.0, (50, 7)).astype(np.float32)
    else:
        x = rng.integers(0, 256, (50, 3, 4, 4), dtype=np.uint8)
    scaling = Scaling.unit(3) if kind == "unit" else Scaling.fit(x, np.arange(40))
    model = RawInputModel(torch.nn.Identity(), scaling, x.shape[1:])
    assert torch.equal(model(torch.from_numpy(x)), scaling.apply(x))
    with pytest.raises(TypeError, match="as the dataset stores them"):
        model(torch.from_numpy(x).double())
    example, params = model.example()
    assert (example.shape, example.dtype, params) == ((1, *x.shape[1:]), x.dtype, {})
