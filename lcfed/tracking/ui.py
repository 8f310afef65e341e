"""How people look at a store: the command that opens the MLflow UI and the runs-table views saved for it.

Separate from the store and the observer because nothing here logs a run: the sweep saves its view and
the CLI prints the hint after the runs are logged.
"""

from __future__ import annotations

import json
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


def ui_hint(uri: str) -> str:
    """How to open the MLflow UI for this store."""
    if is_server_uri(uri):
        return f"open {uri}"
    return (f"{mlflow_command()} ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000   "
            "# then open http://127.0.0.1:5000")


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
    """Where the UI shows the view :func:`share_view` saved (for a local store, the address ``mlflow ui``
    serves by default, as :func:`ui_hint` starts it)."""
    base = uri.rstrip("/") if is_server_uri(uri) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{exp_id}/runs?viewStateShareKey={key}"
