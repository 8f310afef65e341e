"""How people look at a store: the command that opens the MLflow UI and the runs-table views saved for it.

Separate from the store and the observer because nothing here logs a run: the sweep saves its view and
the CLI prints the hint after the runs are logged.
"""

from __future__ import annotations

import functools
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


@functools.cache
def ui_port(host: str = "127.0.0.1") -> int:
    """The port the printed ``mlflow ui`` command (:func:`ui_hint`) and every address lcfed prints for a local
    store use: :data:`UI_PORT`, or the next one nothing listens on (a UI already open on 5000 may be
    another store's). Asked once per process, so the command and the addresses agree."""
    for port in range(UI_PORT, UI_PORT + 50):
        try:
            socket.create_connection((host, port), timeout=0.2).close()
        except OSError:
            return port
    return UI_PORT


def ui_base(uri: str) -> str:
    """The UI's address for this store: the tracking server's own, else the ``mlflow ui`` that
    :func:`ui_hint` starts."""
    return uri.rstrip("/") if is_server_uri(uri) else f"http://127.0.0.1:{ui_port()}"


def run_url(uri: str, exp_id: str, run_id: str | None = None) -> str:
    """Where the UI shows run ``run_id`` (else experiment ``exp_id``'s runs table), in the model-training view."""
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{ui_base(uri)}/#/experiments/{exp_id}/{page}?{ML_VIEW}"


def ui_hint(uri: str, exp_id: str | None = None, run_id: str | None = None) -> str:
    """How to open the MLflow UI for this store, on run ``run_id`` of experiment ``exp_id`` when given."""
    where = run_url(uri, exp_id, run_id) if exp_id else ui_base(uri)
    if is_server_uri(uri):
        return f"open {where}"
    return (f"{mlflow_command()} ui --backend-store-uri {uri} --host 127.0.0.1 --port {ui_port()}   "
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
