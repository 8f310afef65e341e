"""How people look at a store: the command that opens the MLflow UI and the runs-table views saved for it.

Separate from the store and the observer because nothing here logs a run: the sweep saves its view and
the CLI prints the hint after the runs are logged.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lcfed.tracking.store import is_server_uri

#: experiment tag prefix under which the MLflow UI keeps a shared view of its runs table
SHARED_VIEW_TAG = "mlflow.sharedViewState."


def mlflow_command() -> str:
    """``mlflow`` as this environment has it: the one beside this Python (a virtualenv's ``bin/``, which is not
    on ``PATH`` unless it was activated), else the bare name."""
    here = Path(sys.executable).parent / "mlflow"
    if not here.is_file():
        return "mlflow"
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


#: the port ``mlflow ui`` serves on by default, and the first tried for the UI command lcfed prints
UI_PORT = 5000

#: MLflow 3's UI opens in its GenAI mode (traces, judges) unless the address asks for the model-training one
ML_VIEW = "workflowType=machine_learning"


#: the port each local store's addresses use, decided on first use (:func:`ui_port`)
_PORTS: dict[str, int] = {}
#: the local stores whose port an MLflow UI already served when it was decided (their hint prints no command)
_SERVED: set[str] = set()


def ui_port(uri: str = "", exp_id: str | None = None, run_id: str | None = None, host: str = "127.0.0.1",
            ports: Sequence[int] = range(UI_PORT, UI_PORT + 50)) -> int:
    """The port the printed ``mlflow ui`` command (:func:`ui_hint`) and every address lcfed prints for the local
    store ``uri`` use: the first from :data:`UI_PORT` on where an MLflow UI already serves this store (it knows
    run ``run_id``, else experiment ``exp_id``: the README's ``mlflow ui`` left open), else the first nothing
    listens on (a UI on 5000 may be another store's). Decided once per store and process, so the command and
    the addresses agree."""
    if uri not in _PORTS:
        free = None
        for port in ports:
            serving = _serves(host, port, exp_id, run_id)
            if serving:
                free = port
                _SERVED.add(uri)
                break
            if serving is None and free is None:
                free = port
                if not (exp_id or run_id):
                    break
        _PORTS[uri] = UI_PORT if free is None else free
    return _PORTS[uri]


def _serves(host: str, port: int, exp_id: str | None, run_id: str | None) -> bool | None:
    """None: nothing listens on ``port``; True: an MLflow server there knows the run (or the experiment);
    False: something else does (another store's UI, another program)."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return None
    if not (exp_id or run_id):
        return False
    import urllib.error
    import urllib.request

    query = f"runs/get?run_id={run_id}" if run_id else f"experiments/get?experiment_id={exp_id}"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/api/2.0/mlflow/{query}", timeout=1.0) as answer:
            body = json.loads(answer.read() or b"{}")
    except (OSError, ValueError, urllib.error.URLError):
        return False
    found = body.get("run", {}).get("info", {}).get("run_id") if run_id else \
        body.get("experiment", {}).get("experiment_id")
    return found == (run_id or exp_id)


def ui_base(uri: str, exp_id: str | None = None, run_id: str | None = None) -> str:
    """The UI's address for this store: the tracking server's own, else the ``mlflow ui`` that
    :func:`ui_hint` starts (or that already serves it)."""
    return uri.rstrip("/") if is_server_uri(uri) else f"http://127.0.0.1:{ui_port(uri, exp_id, run_id)}"


def run_url(uri: str, exp_id: str, run_id: str | None = None) -> str:
    """Where the UI shows run ``run_id`` (else experiment ``exp_id``'s runs table), in the model-training view."""
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{ui_base(uri, exp_id, run_id)}/#/experiments/{exp_id}/{page}?{ML_VIEW}"


def ui_hint(uri: str, exp_id: str | None = None, run_id: str | None = None) -> str:
    """How to open the MLflow UI for this store, on run ``run_id`` of experiment ``exp_id`` when given."""
    where = run_url(uri, exp_id, run_id) if exp_id else ui_base(uri)
    if is_server_uri(uri):
        return f"open {where}"
    port = ui_port(uri, exp_id, run_id)
    if uri in _SERVED:
        return f"open {where}   (the MLflow UI there serves this store)"
    return (f"{mlflow_command()} ui --backend-store-uri {uri} --host 127.0.0.1 --port {port}{app_flag()}   "
            f"# then open {where}")


#: the ``mlflow.app`` entry point whose UI opens in model training (:mod:`lcfed.tracking.ui_app`)
APP_NAME = "lcfed"


def app_flag() -> str:
    """`` --app-name lcfed`` where this environment registers the app (an install of this version: ``pip install
    -e .``, ``make setup``), else nothing: the printed addresses ask for model training themselves."""
    from importlib.metadata import entry_points

    return f" --app-name {APP_NAME}" if any(e.name == APP_NAME for e in entry_points(group="mlflow.app")) else ""


#: the runs table's name column (ag-grid's column id) and the width a sweep's view gives it: the UI's 190 px cut
#: trial names (``mu=0.0312 lam=0.2 · lcfed · digits dir0.15 · s0``) after their first values
NAME_COLUMN, NAME_WIDTH = "attributes.`Run Name`", 400


def column(kind: str, name: str) -> str:
    """A runs-table column as the UI names it: ``metrics.`accuracy/acc_mean```."""
    return f"{kind}.`{name}`"


def parallel_chart(params: Sequence[str], metrics: Sequence[str], section: str) -> dict[str, Any]:
    """A parallel-coordinates chart of a view (:func:`share_view`): one axis per param, then per metric. The
    UI leaves out a run that lacks one of them (a method without μ is not drawn at a made-up μ)."""
    return {"uuid": f"lcfed-parallel-{section}", "type": "PARALLEL", "selectedParams": list(params),
            "selectedMetrics": list(metrics), "showAllRuns": True, "metricSectionId": section,
            "isGenerated": False, "deleted": False, "runsCountToCompare": 100}


def scatter_chart(x: tuple[str, str], y: tuple[str, str], section: str) -> dict[str, Any]:
    """A scatter chart of a view: ``x``, ``y`` as (``"PARAM"`` or ``"METRIC"``, key)."""
    return {"uuid": f"lcfed-scatter-{section}-{x[1]}", "type": "SCATTER", "xaxis": {"type": x[0], "key": x[1]},
            "yaxis": {"type": y[0], "key": y[1]}, "metricSectionId": section, "isGenerated": False,
            "deleted": False, "runsCountToCompare": 100}


def share_view(client: Any, exp_id: str, key: str, *, metrics: Sequence[str], params: Sequence[str] = (),
               tags: Sequence[str] = (), sort: str | None = None, ascending: bool = False,
               run_filter: str = "", name: str | None = None, charts: Sequence[dict[str, Any]] = (),
               section: str = "") -> None:
    """A runs-table view of the experiment, listed under the UI's "Views" as ``name`` and opened by
    :func:`view_url`: its columns are these metrics, params and tags (the run name wide enough to read), sorted
    by ``sort``, and its charts ``charts`` (:func:`parallel_chart`, :func:`scatter_chart`) in the chart
    section ``section``, first. The UI's own default shows none of them (139 columns hidden behind "Show more
    columns"). MLflow 3.17 keeps such a view in an experiment tag, ``{name, createdAt, updatedAt, state}``
    with the state a JSON string (a bare state opens from the link but is not listed). Never fails the caller."""
    columns = [column("metrics", m) for m in metrics] + [column("params", p) for p in params] \
        + [column("tags", t) for t in tags]
    state: dict[str, Any] = {"selectedColumns": columns, "orderByKey": column("metrics", sort or metrics[0]),
                             "orderByAsc": ascending, "searchFilter": run_filter,
                             "columnOrder": [NAME_COLUMN, *columns], "columnWidths": {NAME_COLUMN: NAME_WIDTH}}
    if charts:
        state["compareRunCharts"] = list(charts)
        state["compareRunSections"] = [{"uuid": section, "name": section, "display": True, "isReordered": True}]
        state["isAccordionReordered"] = True  # the UI's own sections (accuracy, ...) after it, not sorted by name
        state["runListHidden"] = True  # the chart mode's run list (names cut at 150 px) left closed: wider charts
    now = int(time.time() * 1000)
    envelope = {"name": name or key, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    try:
        client.set_experiment_tag(exp_id, SHARED_VIEW_TAG + key, json.dumps(envelope))
    except Exception as exc:  # a view is a convenience: the runs are logged either way
        warnings.warn(f"MLflow view {key} not saved: {type(exc).__name__}: {exc}", stacklevel=2)


def read_view(tag_value: str) -> dict[str, Any]:
    """The state of a view :func:`share_view` saved (the experiment tag's value)."""
    return dict(json.loads(json.loads(tag_value)["state"]))


def view_path(exp_id: str, key: str, charts: bool = False) -> str:
    """The UI's address of a saved view, from ``#`` on (a run's description links to it this way), in the
    model-training view; ``charts``: its charts rather than its table."""
    mode = "&compareRunsMode=CHART" if charts else ""
    return f"#/experiments/{exp_id}/runs?{ML_VIEW}&viewStateShareKey={key}{mode}"


def view_url(uri: str, exp_id: str, key: str, charts: bool = False) -> str:
    """Where the UI shows the view :func:`share_view` saved (for a local store, on the port of the
    ``mlflow ui`` command :func:`ui_hint` prints), in the model-training view; ``charts``: its charts."""
    return f"{ui_base(uri, exp_id)}/{view_path(exp_id, key, charts)}"
