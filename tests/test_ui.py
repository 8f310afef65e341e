"""The MLflow UI lists a sweep's runs: checked in headless Chromium against a real tracking server.

Slow (a sweep plus a browser): ``make test-slow``. Needs Debian's ``chromium``. The screenshot is
written to ``docs/mlflow-sweep-runs.png`` (the README's).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import mlflow
import pytest

from tests.conftest import tiny_config
from tests.test_jobs import free_port
from tune_jobs.mlflow_server import start_mlflow_server, stop
from tune_jobs.sweep.run import run_sweep
from tune_jobs.sweep.space import load_space

ROOT = Path(__file__).resolve().parents[1]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed: apt-get install chromium"
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
            "--virtual-time-budget=20000", "--window-size=1600,1000"]
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=180)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_mlflow_ui_lists_the_sweep_runs(tmp_path):
    """The experiment opens on its runs table (not MLflow 3's GenAI overview), and the view the sweep saves
    shows its trials with the metric and the swept values as columns, best first. The screenshot is the
    README's ``docs/mlflow-sweep-runs.png``."""
    proc, url = start_mlflow_server("127.0.0.1", free_port(), tmp_path / "mlflow")
    try:
        base = tiny_config("train.rounds=2", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={url}",
                           "tracking.experiment=ui-sweep")
        summary = run_sweep(base, load_space("mu_lambda.yaml", base), num_samples=4, scheduler="fifo",
                            max_concurrent=2, name="ui-sweep", storage=tmp_path / "tune", search="optuna")
        assert summary["trials"] == 4
        client = mlflow.MlflowClient(tracking_uri=url)
        exp = client.get_experiment_by_name("ui-sweep")
        assert len(client.search_runs([exp.experiment_id])) == 5  # the parent and four trials
        # the runs table (MLflow 3 opens experiments on a GenAI overview); trials nest under the parent
        page = f"{url}/#/experiments/{exp.experiment_id}/runs"
        text = re.sub(r"<[^>]+>", " ", _chromium("--dump-dom", page).stdout)
        assert "Training runs" in text and "ui-sweep" in text, "the sweep's parent run is not listed by the MLflow UI"
        assert re.search(r"5\s+matching runs", text)  # rendered as "<strong>5</strong> matching runs"
        # the sweep's view: the four trials, acc_mean and the swept values as columns
        assert summary["view"] == f"{page}?viewStateShareKey=sweep-ui-sweep"
        text = re.sub(r"<[^>]+>", " ", _chromium("--dump-dom", summary["view"]).stdout)
        assert re.search(r"4\s+matching runs", text), text[-3000:]
        for column in ("acc_mean", "train_loss", "method.mu", "method.lam"):
            assert column in text, f"column {column} not shown"
        shot = tmp_path / "ui.png"
        _chromium(f"--screenshot={shot}", summary["view"])
        assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 10_000
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "mlflow-sweep-runs.png")
    finally:
        stop(proc)
