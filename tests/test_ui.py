"""The MLflow UI shows lcfed's runs as a user meets them: checked in headless Chromium against one real
tracking server, at the addresses lcfed prints (the model-training view). A sweep's trials side by side,
their visible names different; runs of two methods told apart by name in the runs table; a run's overview
listing accuracy first and its logged models, the experiment's Models tab listing them too; a run's
charts opening on its accuracy section, traffic last.

Slow (runs, a sweep and a browser): ``make test-slow``. Needs Debian's ``chromium``. The screenshots are
the docs': ``docs/mlflow-sweep-runs.png``, ``docs/mlflow-runs-table.png``, ``docs/mlflow-run-overview.png``,
``docs/mlflow-models-tab.png``, ``docs/mlflow-run-page.png``.
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
from lcfed.run.metric_catalog import SECTIONS
from lcfed.tracking.ui import ML_VIEW
from tests.conftest import tiny_config
from tests.test_jobs import free_port
from tune_jobs.cli import main
from tune_jobs.mlflow_server import start_mlflow_server, stop
from tune_jobs.sweep.options import SweepOptions
from tune_jobs.sweep.run import run_sweep
from tune_jobs.sweep.space import load_space

ROOT = Path(__file__).resolve().parents[1]

#: characters of a run's name the runs table shows at 1600 px before it cuts the name
VISIBLE_NAME = 16

#: sidebar entries of MLflow's GenAI mode, absent from the model-training view lcfed's addresses open
GENAI_ONLY = ("Judges", "Evaluation runs", "Agent versions")


def _chromium(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed: apt-get install chromium"
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
            "--virtual-time-budget=60000", "--run-all-compositor-stages-before-draw", "--window-size=1600,1000"]
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
    # the runs table in the model-training view (MLflow 3 opens in its GenAI mode unless the address asks)
    page = f"{url}/#/experiments/{exp.experiment_id}/runs?{ML_VIEW}"
    text = _text(page)
    assert "ui-sweep" in text, "the sweep's parent run is not listed by the MLflow UI"
    assert not [w for w in GENAI_ONLY if w in text], "the UI opened in its GenAI mode"
    assert re.search(r"5\s+matching runs", text)  # rendered as "<strong>5</strong> matching runs"
    # the sweep's view: the four trials, acc_mean and the swept values as columns
    assert summary["view"] == f"{page}&viewStateShareKey=sweep-ui-sweep"
    text = _text(summary["view"])
    assert re.search(r"4\s+matching runs", text), text[-3000:]
    for column in ("accuracy/acc_mean", "loss/train_loss", "method.mu", "method.lam"):
        assert column in text, f"column {column} not shown"
    # each trial listed, and what the table shows of their names differs (they lead with the swept values)
    trials = [r.info.run_name for r in client.search_runs([exp.experiment_id], "tags.sweep = 'ui-sweep'")]
    assert len(trials) == 4 and all(name in text for name in trials), (trials, text[-3000:])
    assert len({name[:VISIBLE_NAME] for name in trials}) == 4, trials
    _screenshot(summary["view"], "mlflow-sweep-runs.png", tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_runs_told_apart_a_run_overview_leads_with_accuracy_and_lists_its_models(tmp_path, server):
    """Two ``lcfed run``s differing in the method: the runs table names each for what ran; the LCFed run's
    overview lists accuracy first and its three logged models; the experiment's Models tab lists both runs'
    models; the run's charts ("Model metrics") open on the accuracy section, then loss, server, time,
    traffic. The screenshots are the docs' ``docs/mlflow-runs-table.png``, ``docs/mlflow-run-overview.png``,
    ``docs/mlflow-models-tab.png`` and ``docs/mlflow-run-page.png``."""
    config = tmp_path / "base.yaml"  # the settings in a file: the names show the method set on the command line
    base = tiny_config("train.rounds=3", "tracking.enabled=true", f"tracking.uri={server}", "tracking.experiment=ui-runs")
    config.write_text(yaml.safe_dump(to_dict(base)))
    run_ids = {}
    for method in ("lcfed", "fedavg"):
        out = tmp_path / f"{method}.json"
        assert main(["run", "-q", "-c", str(config), "--json", str(out), "--set", f"method.name={method}"]) == 0
        run_ids[method] = json.loads(out.read_text())["run_id"]
    exp = mlflow.MlflowClient(tracking_uri=server).get_experiment_by_name("ui-runs")
    base = f"{server}/#/experiments/{exp.experiment_id}"
    table = f"{base}/runs?{ML_VIEW}"
    text = " ".join(_text(table).split())
    for method in run_ids:
        assert f"{method} · digits path2 · s0" in text, text[-3000:]
    _screenshot(table, "mlflow-runs-table.png", tmp_path)

    # the run's overview, at the address `lcfed run` prints: accuracy first, the models it logged
    overview = f"{base}/runs/{run_ids['lcfed']}?{ML_VIEW}"
    text = " ".join(_text(overview).split())
    metrics = re.search(r"Metrics \(\d+\) Metric Value Models (.*?) Parameters \(", text)
    assert metrics, text[-3000:]
    assert re.findall(r"([a-z]+)/\w+ [\d.e-]+", metrics.group(1))[:5] == ["accuracy"] * 5, metrics.group(1)[:500]
    assert "system/" not in text
    assert "Logged models (3)" in text, text[-3000:]  # clusters, embedding, personal
    _screenshot(overview, "mlflow-run-overview.png", tmp_path)

    # the experiment's Models tab lists them, each from its run
    models = f"{base}/models?{ML_VIEW}"
    text = " ".join(_text(models).split())
    for name in ("clusters", "embedding", "personal", "global"):
        assert re.search(rf"#\w+ {name} Ready", text), (name, text[-3000:])
    assert "lcfed · digits path2 · s0" in text and "fedavg · digits path2 · s0" in text
    _screenshot(models, "mlflow-models-tab.png", tmp_path)

    page = f"{base}/runs/{run_ids['lcfed']}/model-metrics?{ML_VIEW}"
    text = " ".join(_text(page).split())
    sections = [name for name, count in re.findall(r"(\S+) \((\d+)\) Add chart", text) if int(count)]
    assert sections == list(SECTIONS), text[-3000:]  # the per-layer traffic is a table, not a section of flat lines
    _screenshot(page, "mlflow-run-page.png", tmp_path)
