"""What lcfed gives the MLflow UI, without a browser (tests/test_ui.py checks it in one): the sweep's view as the
UI's Views menu lists it, its charts on log10 axes where the space is log, the page line that opens the UI in
model training, and a run's first metric points accuracy first with ``train.eval_every`` > 1."""

from __future__ import annotations

import asyncio
import json
import math

import mlflow
import pytest
from ray import tune

from lcfed.tracking import MLflowObserver
from lcfed.tracking.ui import NAME_COLUMN, SHARED_VIEW_TAG, read_view, share_view, view_path
from lcfed.tracking.ui_app import SCRIPT, ModelTrainingFirst
from tests.conftest import tiny_config
from tune_jobs.sweep.callbacks import log_params
from tune_jobs.sweep.run import sweep_charts
from tune_jobs.sweep.space import log_keys, numeric_keys


class Tags:
    """A client that keeps experiment tags."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}

    def set_experiment_tag(self, exp_id: str, key: str, value: str) -> None:
        self.tags[key] = value


def test_a_view_is_saved_as_the_ui_lists_it_with_its_charts_first():
    client = Tags()
    space = {"method.mu": tune.loguniform(1e-3, 1), "method.lam": tune.uniform(0, 1),
             "method.name": tune.choice(["lcfed", "fedavg"]), "train.rounds": 3}
    charts = sweep_charts(space, "accuracy/acc_mean", "sweep s")
    share_view(client, "1", "sweep-s", metrics=["accuracy/acc_mean"], params=["method.mu"], name="sweep s",
               charts=charts, section="sweep s", run_filter="tags.sweep = 's'")
    envelope = json.loads(client.tags[SHARED_VIEW_TAG + "sweep-s"])
    assert envelope["name"] == "sweep s" and isinstance(envelope["state"], str) and envelope["createdAt"] > 0
    state = read_view(client.tags[SHARED_VIEW_TAG + "sweep-s"])
    assert state["selectedColumns"] == ["metrics.`accuracy/acc_mean`", "params.`method.mu`"]
    assert state["columnOrder"][0] == NAME_COLUMN and state["searchFilter"] == "tags.sweep = 's'"
    assert [s["uuid"] for s in state["compareRunSections"]] == ["sweep s"] and state["isAccordionReordered"]
    parallel, *scatters = state["compareRunCharts"]
    # log10 where the space is log; a choice of names an axis of the parallel chart, not of a scatter
    assert parallel["selectedParams"] == ["log10.method.mu", "method.lam", "method.name"]
    assert parallel["selectedMetrics"] == ["accuracy/acc_mean"]
    assert [c["xaxis"] for c in scatters] == [{"type": "PARAM", "key": "log10.method.mu"},
                                             {"type": "PARAM", "key": "method.lam"}]
    assert {c["metricSectionId"] for c in state["compareRunCharts"]} == {"sweep s"}
    assert view_path("1", "sweep-s", charts=True) == \
        "#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=sweep-s&compareRunsMode=CHART"


def test_log_scale_keys_and_numeric_keys():
    space = {"a": tune.loguniform(1e-3, 1), "b": tune.qloguniform(1e-3, 1, 1e-3), "c": tune.lograndint(1, 64),
             "d": tune.grid_search([0.1, 1.0]), "e": tune.choice(["x", "y"]), "f": 2}
    assert log_keys(space) == ["a", "b", "c"]
    assert numeric_keys(space) == ["a", "b", "c", "d"]


def test_a_trial_logs_log10_of_the_log_scale_values_its_run_logged(tracking_uri):
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    run = client.create_run(client.create_experiment("e"))
    client.log_param(run.info.run_id, "method.mu", "0.01")  # method.lam not logged: its method has none
    log_params(client, run.info.run_id, {"method.mu": 0.01, "method.lam": 0.1}, ["method.mu", "method.lam"])
    params = client.get_run(run.info.run_id).data.params
    assert float(params["log10.method.mu"]) == pytest.approx(-2) and "log10.method.lam" not in params


def test_the_ui_page_gets_the_line_that_opens_model_training():
    page = b"<!doctype html><html><head><title>MLflow</title></head></html>"

    async def ui(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html"), (b"content-length", str(len(page)).encode())]})
        await send({"type": "http.response.body", "body": page})

    def get(path: str) -> tuple[dict, bytes]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        asyncio.run(ModelTrainingFirst(ui)({"type": "http", "path": path}, None, send))
        return dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])

    headers, body = get("/")
    assert body.startswith(b"<!doctype html><html><head>" + SCRIPT) and int(headers[b"content-length"]) == len(body)
    assert b'setItem("mlflow.workflowType_v1","\\"machine_learning\\"")' in SCRIPT
    assert get("/static-files/x.js")[1] == page  # other paths untouched


def test_with_eval_every_2_a_run_logs_accuracy_first(tracking_uri):
    """MLflow's overview lists metrics in the order they were first logged: round 0, not evaluated, waits for
    round 1's evaluation and goes out after accuracy's points."""
    uri = tracking_uri
    cfg = tiny_config("train.rounds=2", "train.eval_every=2", "tracking.enabled=true", f"tracking.uri={uri}")
    obs = MLflowObserver(uri, log_models=False)
    obs.start(cfg, {})
    sent: list[list[str]] = []
    log_batch = obs.client.log_batch
    obs.client.log_batch = lambda run_id, metrics=(), **kw: (sent.append([m.key for m in metrics]),
                                                            log_batch(run_id, metrics=metrics, **kw))
    obs.log_round(0, {"train_loss": 1.0, "coverage": 0.5}, None)
    assert sent == []  # held
    obs.log_round(1, {"acc_mean": 0.5, "train_loss": 0.9, "coverage": 1.0}, None)
    assert sent == [["accuracy/acc_mean", "loss/train_loss", "loss/train_loss", "server/coverage", "server/coverage"]]
    steps = [m.step for m in obs.client.get_metric_history(obs.run_id, "loss/train_loss")]
    assert sorted(steps) == [0, 1] and math.isfinite(obs.client.get_run(obs.run_id).data.metrics["loss/train_loss"])
    obs.log_round(2, {"train_loss": 0.8}, None)  # from here every round goes out as it comes
    assert sent[-1] == ["loss/train_loss"]
    obs.release_guard()


def test_lcfed_mlflow_server_serves_the_ui_that_opens_in_model_training():
    """``lcfed mlflow-server`` runs ``mlflow server --app-name lcfed`` where the app is registered (an install
    of the project, as ``make setup`` makes): its UI is this app's (the browser's part: tests/test_ui.py)."""
    from tune_jobs.mlflow_server import server_command

    cmd = server_command("127.0.0.1", 5000, "sqlite:///x.db", "/tmp/a")
    assert cmd[-2:] == ["--app-name", "lcfed"]
