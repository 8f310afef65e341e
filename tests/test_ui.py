"""The MLflow UI shows lcfed's runs as a user meets them: checked in headless Chromium against real servers. The
README's address (the UI's home page, then a click on the experiment) opens model training, not GenAI. A
sweep's trials side by side in a view the UI lists, their names whole, the metric and the swept values as
columns; its charts: parallel coordinates and scatters on the swept values, log10 where the space is log;
the parent run's description linking the best trial and the view. Runs of two methods told apart by name; a
run's overview listing accuracy first (with ``train.eval_every`` > 1 too) and its logged models, the
experiment's Models tab listing them; a run's charts opening on its accuracy section, traffic last.

Slow (runs, a sweep and a browser): ``make test-slow``. Needs Debian's ``chromium``. The screenshots are
the docs': ``docs/mlflow-sweep-runs.png``, ``docs/mlflow-sweep-charts.png``, ``docs/mlflow-sweep-parent.png``,
``docs/mlflow-readme-address.png``, ``docs/mlflow-runs-table.png``, ``docs/mlflow-run-overview.png``,
``docs/mlflow-models-tab.png``, ``docs/mlflow-run-page.png``.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import mlflow
import pytest
import yaml

from lcfed.config import to_dict
from lcfed.run.metric_catalog import SECTIONS
from lcfed.tracking.ui import ML_VIEW, NAME_COLUMN, NAME_WIDTH, SHARED_VIEW_TAG, read_view, view_path
from tests.conftest import tiny_config
from tests.raycluster import free_port
from tune_jobs.cli import main
from tune_jobs.mlflow_server import server_env, start_mlflow_server, stop, wait_healthy
from tune_jobs.server_group import spawn_watched
from tune_jobs.sweep.options import SweepOptions
from tune_jobs.sweep.run import run_sweep
from tune_jobs.sweep.space import load_space

pytestmark = [pytest.mark.slow]  # every test: `-m` leaves the file unimported

ROOT = Path(__file__).resolve().parents[1]

#: characters of a run's name the runs table shows at 1600 px before it cuts the name
VISIBLE_NAME = 16

#: sidebar entries of MLflow's GenAI mode, absent from the model-training view lcfed's addresses open
GENAI_ONLY = ("Judges", "Evaluation runs", "Agent versions")


def _chromium(*args: str, profile: Path | None = None) -> subprocess.CompletedProcess:
    """Chromium on ``args``; ``profile``: its user-data directory (what the browser remembers), else a fresh one."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed: apt-get install chromium"
    where = [f"--user-data-dir={profile}"] if profile is not None else []
    base = [exe, *where, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
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


def _dom(url: str, profile: Path | None = None) -> str:
    """The page's DOM once the UI has rendered it."""
    return _chromium("--dump-dom", url, profile=profile).stdout


def _text(url: str, profile: Path | None = None) -> str:
    """The page's text once the UI has rendered it, its white space collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", _dom(url, profile)).split())


def _screenshot(url: str, name: str, tmp_path: Path, profile: Path | None = None) -> None:
    shot = tmp_path / name
    _chromium(f"--screenshot={shot}", url, profile=profile)
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
    assert text.count("Hide run") == 4, text[-3000:]  # a row each (the view's closed run list shows no count)
    for column in ("accuracy/acc_mean", "loss/train_loss", "method.mu", "method.lam"):
        assert column in text, f"column {column} not shown"
    # each trial listed, and what the table shows of their names differs (they lead with the swept values)
    trials = [r.info.run_name for r in client.search_runs([exp.experiment_id], "tags.sweep = 'ui-sweep'")]
    assert len(trials) == 4 and all(name in text for name in trials), (trials, text[-3000:])
    assert len({name[:VISIBLE_NAME] for name in trials}) == 4, trials
    # a view the UI lists: its "Views" menu names the open one (a view it cannot list it opens as "Views")
    state = read_view(client.get_experiment(exp.experiment_id).tags[f"{SHARED_VIEW_TAG}sweep-ui-sweep"])
    assert "Views sweep ui-sweep" not in text and "sweep ui-sweep" in text, text[:3000]
    # the names whole: the name column as wide as the view says (the screenshot shows them uncut)
    assert state["columnWidths"] == {NAME_COLUMN: NAME_WIDTH}
    header = re.search(rf'<div[^>]*role="columnheader"[^>]*col-id="{re.escape(NAME_COLUMN)}"[^>]*>', _dom(summary["view"]))
    assert header and f"width: {NAME_WIDTH}px" in header.group(0), header
    _screenshot(summary["view"], "mlflow-sweep-runs.png", tmp_path)

    # its charts: parallel coordinates and scatters on log10 of the log-scale swept values, no name axis
    children = client.search_runs([exp.experiment_id], "tags.sweep = 'ui-sweep'")
    for child in children:
        for key in ("method.mu", "method.lam"):
            assert float(child.data.params[f"log10.{key}"]) == pytest.approx(
                math.log10(float(child.data.params[key])), abs=1e-5)
    assert summary["view_charts"] == f"{summary['view']}&compareRunsMode=CHART"
    text = _text(summary["view_charts"])
    for axis in ("log10.method.mu", "log10.method.lam", "accuracy/acc_mean"):
        assert axis in text, (axis, text[-3000:])
    assert "tracking.run_name" not in text and "Parallel" in text, text[-3000:]
    _screenshot(summary["view_charts"], "mlflow-sweep-charts.png", tmp_path)

    # the parent run's description links the best trial (tagged best_trial) and the view, table and charts
    parent = client.get_run(summary["parent_run_id"])
    best = parent.data.tags["best_run_id"]
    assert client.get_run(best).data.tags["best_trial"] == "true"
    dom = _dom(f"{url}/#/experiments/{exp.experiment_id}/runs/{summary['parent_run_id']}?{ML_VIEW}")
    for href in (f"#/experiments/{exp.experiment_id}/runs/{best}", view_path(exp.experiment_id, "sweep-ui-sweep"),
                 view_path(exp.experiment_id, "sweep-ui-sweep", charts=True)):
        assert f'href="{html.escape(href)}"' in dom, (href, dom[-3000:])
    _screenshot(f"{url}/#/experiments/{exp.experiment_id}/runs/{summary['parent_run_id']}?{ML_VIEW}",
                "mlflow-sweep-parent.png", tmp_path)


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
    text = _text(table)
    for method in run_ids:
        assert f"{method} · digits path2 · s0" in text, text[-3000:]
    _screenshot(table, "mlflow-runs-table.png", tmp_path)

    # the run's overview, at the address `lcfed run` prints: accuracy first, the models it logged
    overview = f"{base}/runs/{run_ids['lcfed']}?{ML_VIEW}"
    text = _text(overview)
    assert _leading_sections(text) == ["accuracy"] * 5
    assert "system/" not in text
    assert "Logged models (3)" in text, text[-3000:]  # clusters, embedding, personal
    _screenshot(overview, "mlflow-run-overview.png", tmp_path)

    # the experiment's Models tab lists them, each from its run
    models = f"{base}/models?{ML_VIEW}"
    text = _text(models)
    for name in ("clusters", "embedding", "personal", "global"):
        assert re.search(rf"#\w+ {name} Ready", text), (name, text[-3000:])
    assert "lcfed · digits path2 · s0" in text and "fedavg · digits path2 · s0" in text
    _screenshot(models, "mlflow-models-tab.png", tmp_path)

    page = f"{base}/runs/{run_ids['lcfed']}/model-metrics?{ML_VIEW}"
    text = _text(page)
    sections = [name for name, count in re.findall(r"(\S+) \((\d+)\) Add chart", text) if int(count)]
    assert sections == list(SECTIONS), text[-3000:]  # the per-layer traffic is a table, not a section of flat lines
    _screenshot(page, "mlflow-run-page.png", tmp_path)


def _leading_sections(text: str) -> list[str]:
    """The sections of the first five metrics a run's overview (its text) lists."""
    metrics = re.search(r"Metrics \(\d+\) Metric Value Models (.*?) Parameters \(", text)
    assert metrics, text[-3000:]
    return re.findall(r"([a-z]+)/\w+ [\d.e-]+", metrics.group(1))[:5]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_address_opens_model_training_and_an_overview_leads_with_accuracy(tmp_path):
    """The README's ``mlflow ui --backend-store-uri sqlite:///mlflow.db --app-name lcfed``, its address (the home
    page), then the experiment's link there, in a browser that never chose a mode: the model-training runs
    table, where MLflow's own default is GenAI's traces. The run evaluates every second round
    (``train.eval_every: 2``), yet its overview lists accuracy first. The screenshot is the docs'
    ``docs/mlflow-readme-address.png``."""
    config, store = tmp_path / "base.yaml", f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.write_text(yaml.safe_dump(to_dict(tiny_config(
        "train.rounds=4", "train.eval_every=2", "tracking.enabled=true", f"tracking.uri={store}",
        "tracking.experiment=readme"))))
    out = tmp_path / "run.json"
    assert main(["run", "-q", "-c", str(config), "--json", str(out)]) == 0
    run_id = json.loads(out.read_text())["run_id"]
    exp_id = mlflow.MlflowClient(tracking_uri=store).get_run(run_id).info.experiment_id
    # the app as `pip install -e .` registers it, for an environment installed before it existed
    where = [str(ROOT)]
    if not any(e.name == "lcfed" for e in entry_points(group="mlflow.app")):
        info = tmp_path / "entry" / "lcfed_ui-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lcfed-ui\nVersion: 0\n")
        (info / "entry_points.txt").write_text("[mlflow.app]\nlcfed = lcfed.tracking.ui_app:create_app\n")
        where.insert(0, str(info.parent))
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "ui.log"
    cmd = [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", store, "--host", "127.0.0.1",
           "--port", str(port), "--app-name", "lcfed"]
    with open(log, "ab") as sink:
        proc = spawn_watched(cmd, {**server_env(), "PYTHONPATH": os.pathsep.join(where)}, sink)
    try:
        wait_healthy(proc, url, 300, log)
        profile = tmp_path / "browser"  # one browser: what the home page stores, the click finds
        link = re.search(rf'href="(#/experiments/{exp_id})"', _dom(f"{url}/", profile))
        assert link, "the home page lists no link to the experiment"
        text = _text(f"{url}/{link.group(1)}", profile)
        assert not [w for w in GENAI_ONLY if w in text], text[:3000]
        assert "lcfed · digits path2 · s0" in text and re.search(r"1\s+matching run\b", text), text[-3000:]
        _screenshot(f"{url}/{link.group(1)}", "mlflow-readme-address.png", tmp_path, profile)
        text = _text(f"{url}/#/experiments/{exp_id}/runs/{run_id}", profile)
        assert _leading_sections(text) == ["accuracy"] * 5
    finally:
        stop(proc)
