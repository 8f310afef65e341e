"""What runs and metrics are called in MLflow (``lcfed.tracking.naming``): run names from the method, the values
set, the data and the seed; tags to group by; metric keys whose sections a run page shows accuracy first and
traffic last. Hand-written expectations; the MLflow UI itself is driven in ``tests/test_ui.py``."""

from __future__ import annotations

import os

from lcfed import logs
from lcfed.run.metric_catalog import SECTIONS
from lcfed.tracking import metric_name, mlflow_key, run_name, run_tags
from tests.conftest import tiny_config


def test_a_run_is_named_for_its_method_values_data_and_seed():
    cfg = tiny_config("data.partition=dirichlet", "data.alpha=0.15", "seed=3")
    values = {"method.mu": 1, "method.lam": 0.1, "seed": 3, "data.alpha": 0.15, "tracking.uri": "sqlite:///x.db",
              "engine.kind": "ray", "checkpoint.dir": "ck", "train.lr": 0.031245}
    assert run_name(cfg, values) == "lcfed mu=1 lam=0.1 lr=0.0312 · digits dir0.15 · s3"
    assert run_name(cfg) == "lcfed · digits dir0.15 · s3"
    fedavg = tiny_config("method.name=fedavg")
    assert run_name(fedavg, {"method.name": "fedavg"}) == "fedavg · digits path2 · s0"
    assert run_name(tiny_config("data.partition=iid", "data.testbed=rotated")) == "lcfed · digits iid rotated4 · s0"
    assert run_name(tiny_config("data.partition=primary_secondary")) == "lcfed · digits primsec · s0"
    # two keys sharing their last part keep their full names; a long name is cut to MLflow's 250
    assert run_name(cfg, {"train.lr": 0.1, "method.lr": 0.2}).startswith("lcfed train.lr=0.1 method.lr=0.2 · ")
    assert len(run_name(cfg, {f"method.x{i}": "v" * 20 for i in range(20)})) == 250


def test_a_device_model_run_says_how_its_rounds_wait_or_that_it_is_fedbuff():
    sync = tiny_config("method.name=fedavg", "devices.simulate=true", "devices.deadline_seconds=60",
                       "devices.overcommit=0.3", "devices.availability=diurnal")
    values = {"devices.simulate": True, "devices.deadline_seconds": 60, "devices.overcommit": 0.3,
              "devices.availability": "diurnal", "devices.dropout": 0.1}
    assert run_name(sync, values) == "fedavg dropout=0.1 · digits path2 · sync deadline 60s over 0.3 diurnal · s0"
    fedbuff = tiny_config("method.name=fedavg", "devices.simulate=true", "devices.aggregation=async",
                          "devices.async_buffer=4")
    assert run_name(fedbuff) == "fedavg · digits path2 · FedBuff B=4 · s0"
    assert run_tags(fedbuff)["devices"] == "FedBuff B=4" and "devices" not in run_tags(tiny_config())
    assert run_name(tiny_config("devices.simulate=true")) == "lcfed · digits path2 · sync · s0"


def test_tags_group_the_runs_table_by_method_dataset_partition_and_seed():
    cfg = tiny_config("data.partition=dirichlet", "data.alpha=0.3", "seed=7")
    assert run_tags(cfg) == {"method": "lcfed", "dataset": "digits", "partition": "dir0.3", "seed": "7"}
    assert "seed" not in run_tags(cfg, seed=False)


def test_metric_keys_put_accuracy_first_and_traffic_last():
    keys = {name: mlflow_key(name) for name in (
        "acc_mean", "val_acc_mean", "acc_new_mean", "train_loss", "val_loss", "num_clusters", "ari", "coverage",
        "cluster_size_3", "round_seconds", "sim_seconds_total", "bytes_up", "bytes_down_total", "bytes_up/conv1")}
    assert keys == {
        "acc_mean": "accuracy/acc_mean", "val_acc_mean": "accuracy/val_acc_mean",
        "acc_new_mean": "accuracy/acc_new_mean", "train_loss": "loss/train_loss", "val_loss": "loss/val_loss",
        "num_clusters": "server/num_clusters", "ari": "server/ari", "coverage": "server/coverage",
        "cluster_size_3": "server/cluster_size_3", "round_seconds": "time/round_seconds",
        "sim_seconds_total": "time/sim_seconds_total", "bytes_up": "traffic/bytes_up",
        "bytes_down_total": "traffic/bytes_down_total", "bytes_up/conv1": "traffic/bytes_up/conv1"}
    assert all(metric_name(k) == name for name, k in keys.items())
    # the MLflow UI orders a run page's sections by sorting their names (the unprefixed "Model metrics" last)
    sections = sorted({k.rpartition("/")[0] for k in keys.values()})
    assert sections == ["accuracy", "loss", "server", "time", "traffic", "traffic/bytes_up"]
    assert list(SECTIONS) == sorted(SECTIONS)
    assert mlflow_key("best_acc_mean") == "accuracy/best_acc_mean" and mlflow_key("round") == "round"


def test_verbosity_sets_the_libraries_switches_and_a_scope_puts_them_back(monkeypatch):
    for key in logs.VERBOSITY_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "DEBUG")  # a user's own setting
    with logs.verbosity_scope(logs.DEFAULT):
        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "DEBUG"  # stands by default
        assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0" and logs.tune_verbosity() == 0
        assert logs.ray_init_options() == {"logging_level": 40, "log_to_driver": False} and logs.progress_shown()
    with logs.verbosity_scope(logs.QUIET):
        assert os.environ["MLFLOW_LOGGING_LEVEL"] == "ERROR" and not logs.progress_shown()
        assert logs.server_environment()["MLFLOW_UVICORN_OPTS"] == "--log-level error"
    with logs.verbosity_scope(logs.VERBOSE):
        assert "RAY_AIR_NEW_OUTPUT" not in os.environ and logs.tune_verbosity() == 1
        assert logs.ray_init_options() == {"logging_level": 20, "log_to_driver": True}
        assert logs.server_environment() == {}
    assert logs.verbosity() == logs.DEFAULT and os.environ["MLFLOW_LOGGING_LEVEL"] == "DEBUG"
    assert "RAY_AIR_NEW_OUTPUT" not in os.environ and "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT" not in os.environ
