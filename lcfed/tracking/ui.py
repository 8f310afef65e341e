"""How people look at a store: the command that opens the MLflow UI and the runs-table views saved for it.

Separate from the store and the observer because nothing here logs a run: the sweep saves its view and
the CLI prints the hint after the runs are logged.
"""

from __future__ import annotations

import json
import socket
import sys
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
    return (f"{mlflow_command()} ui --backend-store-uri {uri} --host 127.0.0.1 --port {port}   "
            f"# then open {where}")


def share_view(client: Any, exp_id: str, key: str, *, metrics: Sequence[str], params: Sequence[str] = (),
               tags: Sequence[str] = (), sort: str | None = None, ascending: bool = False,
               run_filter: str = "") -> None:
    """A runs-table view of the experiment that the UI opens with ``?viewStateShareKey=<key>``
    (:func:`view_url`): its columns are these metrics, params and tags, sorted by ``sort``. The UI's own
    default shows none of them (139 columns hidden behind "Show more columns"). Never fails the caller."""
    def column(kind: str, name: str) -> str:
        return f"{kind}.`{name}`"

    state = {"selectedColumns": [column("metrics", m) for m in metrics] + [column("params", p) for p in params]
             + [column("tags", t) for t in tags],
             "orderByKey": column("metrics", sort or metrics[0]), "orderByAsc": ascending,
             "searchFilter": run_filter}
    try:
        client.set_experiment_tag(exp_id, SHARED_VIEW_TAG + key, json.dumps(state))
    except Exception as exc:  # a view is a convenience: the runs are logged either way
        warnings.warn(f"MLflow view {key} not saved: {type(exc).__name__}: {exc}", stacklevel=2)


def view_url(uri: str, exp_id: str, key: str) -> str:
    """Where the UI shows the view :func:`share_view` saved (for a local store, on the port of the
    ``mlflow ui`` command :func:`ui_hint` prints), in the model-training view."""
    return f"{run_url(uri, exp_id)}&viewStateShareKey={key}"
