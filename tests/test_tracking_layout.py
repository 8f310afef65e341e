"""The ``lcfed.tracking`` package after its split by concern: importing it stays free of MLflow and
matplotlib (Tune trials import it on worker nodes, where MLflow is not installed), the names other code
imports from it are still there, logged models keep the class path they were pickled under, and the
unlogged-metrics file is read as it is written."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import lcfed.tracking
from lcfed.learning.models import build_network
from lcfed.logs import quiet_logger
from lcfed.tracking import StackedModels, read_unlogged
from lcfed.tracking.unlogged import write_unlogged

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.subprocess
def test_importing_lcfed_tracking_loads_neither_mlflow_nor_matplotlib():
    code = ("import sys, lcfed, lcfed.tracking; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'matplotlib'}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_the_names_other_code_imports_are_re_exported():
    used = ["MLflowObserver", "ui_hint", "replay", "TrackingError", "RunGuard", "get_or_create_experiment",
            "open_client", "resolve_tracking_uri", "federation_facts", "share_view", "view_url", "ROUND_AXIS",
            "read_assignment_history", "partition_digest", "log_dataset", "accuracy_figure",
            "assignment_history_csv", "history_csv"]
    assert set(used) <= set(lcfed.tracking.__all__)
    assert all(hasattr(lcfed.tracking, n) for n in lcfed.tracking.__all__)
    assert callable(lcfed.tracking.replay)  # the function, not the module of the same idea (``unlogged``)


def test_stacked_models_pickle_under_the_path_earlier_logged_models_use():
    net, _ = build_network("lenet5", (1, 28, 28), 10, 0)
    stacked = StackedModels(net.module, net.spec, torch.zeros(2, net.spec.size), ["device_0", "device_1"])
    blob = pickle.dumps(stacked)
    assert b"lcfed.tracking" in blob and b"lcfed.tracking.models" not in blob
    back = pickle.loads(blob)
    assert type(back) is StackedModels and back.names == ("device_0", "device_1")


def test_unlogged_metrics_file_reads_back_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    points = [SimpleNamespace(key="acc_mean", value=0.5, timestamp=1700000000000, step=3)]
    path = write_unlogged("sqlite:////tmp/x.db", "abc123", points)
    assert path == tmp_path / "unlogged-metrics-abc123.json"
    assert json.loads(path.read_text())["metrics"] == [["acc_mean", 0.5, 1700000000000, 3]]
    assert read_unlogged(path) == {"tracking_uri": "sqlite:////tmp/x.db", "run_id": "abc123",
                                   "metrics": [["acc_mean", 0.5, 1700000000000, 3]]}


def test_quiet_logger_puts_the_level_back():
    log = logging.getLogger("lcfed-test-quiet")
    log.setLevel(logging.INFO)
    with quiet_logger("lcfed-test-quiet"):
        assert log.level == logging.ERROR
    assert log.level == logging.INFO
