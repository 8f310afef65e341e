"""The MLflow UI shows lcfed's runs as a user meets them: checked in headless Chromium against one real
tracking server. A sweep's trials side by side; runs of two methods told apart by name in the runs table;
a run's page opening on its accuracy section, traffic last.

Slow (runs, a sweep and a browser): ``make test-slow``. Needs Debian's ``chromium``. The screenshots are
the docs': ``docs/mlflow-sweep-runs.png``, ``docs/mlflow-runs-table.png``, ``docs/mlflow-run-page.png``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import mlflow
import pytest
import yaml

from lcfed.config import to_dict
from lcfed.metric_catalog import SECTIONS
from tests.conftest import tiny_config
from tests.test_jobs import free_port
from tune_jobs.cli import main
from tune_jobs.mlflow_server import start_mlflow_server, stop
from tune_jobs.sweep.options import SweepOptions
from tune_jobs.sweep.run import run_sweep
from tune_jobs.sweep.space import load_space

ROOT = Path(__file__).resolve().parents[1]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed: apt-get install chromium"
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
            "--virtual-time-budget=20000", "--window-size=1600,1000"]
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One MLflow server for the module's tests: its URL."""
    proc, url = start_mlflow_server("127.0.0.1", free_port(), tmp_path_factory.mktemp("mlflow"))
    try:
        yield url
    finally:
        stop(proc)


def _text(url: str) -> str:
    """The page's text once the UI has rendered it."""
    return re.sub(r"<[^>]+>", " ", _chromium("--dump-dom", url).stdout)


def _screenshot(url: str, name: str, tmp_path: Path) -> None:
    shot = tmp_path / name
    _chromium(f"--screenshot={shot}", url)
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 10_000
    (ROOT / "docs").mkdir(exist_ok=True)
    shutil.copy(shot, ROOT / "docs" / name)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_mlflow_ui_lists_the_sweep_runs(tmp_path, server):
    """The experiment opens on its runs table (not MLflow 3's GenAI overview), and the view the sweep saves
    shows its trials with the metric and the swept values as columns, best first. The screenshot is the
    docs' ``docs/mlflow-sweep-runs.png``."""
    url = server
    base = tiny_config("train.rounds=2", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={url}",
                       "tracking.experiment=ui-sweep")
    summary = run_sweep(base, load_space("mu_lambda.yaml", base), SweepOptions(
        num_samples=4, scheduler="fifo", max_concurrent=2, name="ui-sweep", storage=tmp_path / "tune", search="optuna"))
    assert summary["trials"] == 4
    client = mlflow.MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("ui-sweep")
    assert len(client.search_runs([exp.experiment_id])) == 5  # the parent and four trials
    # the runs table (MLflow 3 opens experiments on a GenAI overview); trials nest under the parent
    page = f"{url}/#/experiments/{exp.experiment_id}/runs"
    text = _text(page)
    assert "Training runs" in text and "ui-sweep" in text, "the sweep's parent run is not listed by the MLflow UI"
    assert re.search(r"5\s+matching runs", text)  # rendered as "<strong>5</strong> matching runs"
    # the sweep's view: the four trials, acc_mean and the swept values as columns
    assert summary["view"] == f"{page}?viewStateShareKey=sweep-ui-sweep"
    text = _text(summary["view"])
    assert re.search(r"4\s+matching runs", text), text[-3000:]
    for column in ("accuracy/acc_mean", "loss/train_loss", "method.mu", "method.lam"):
        assert column in text, f"column {column} not shown"
    _screenshot(summary["view"], "mlflow-sweep-runs.png", tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_runs_of_two_methods_are_told_apart_and_a_run_page_opens_on_accuracy(tmp_path, server):
    """Two ``lcfed run``s differing in the method: the runs table names each for what ran; a run's page
    ("Model metrics") opens on the accuracy section, then loss, server, time, traffic (the per-layer traffic
    last). The screenshots are the docs' ``docs/mlflow-runs-table.png`` and ``docs/mlflow-run-page.png``."""
    config = tmp_path / "base.yaml"  # the settings in a file: the names show the method set on the command line
    base = tiny_config("train.rounds=3", "tracking.enabled=true", f"tracking.uri={server}", "tracking.experiment=ui-runs")
    config.write_text(yaml.safe_dump(to_dict(base)))
    run_ids = {}
    for method in ("lcfed", "fedavg"):
        out = tmp_path / f"{method}.json"
        assert main(["run", "-q", "-c", str(config), "--json", str(out), "--set", f"method.name={method}"]) == 0
        run_ids[method] = json.loads(out.read_text())["run_id"]
    exp = mlflow.MlflowClient(tracking_uri=server).get_experiment_by_name("ui-runs")
    table = f"{server}/#/experiments/{exp.experiment_id}/runs"
    text = " ".join(_text(table).split())
    for method in run_ids:
        assert f"{method} · digits path2 · s0" in text, text[-3000:]
    _screenshot(table, "mlflow-runs-table.png", tmp_path)

    page = f"{table}/{run_ids['lcfed']}/model-metrics"
    text = " ".join(_text(page).split())
    sections = [name for name, count in re.findall(r"(\S+) \((\d+)\) Add chart", text) if int(count)]
    assert sections == [*SECTIONS, "traffic/bytes_down", "traffic/bytes_up"], text[-3000:]
    assert sections[0] == "accuracy" and sections[-1].startswith("traffic")
    _screenshot(page, "mlflow-run-page.png", tmp_path)
