"""An output directory (``--out``) that a rerun of the same command continues: ``state.json`` records the
settings and the MLflow parent run, and every finished piece is a whole JSON file, never redone
(``lcfed reproduce``: a cell; ``lcfed compare``: a method's phase)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lcfed.errors import ConfigError
from tune_jobs.parent_run import ParentRun


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, whole or not at all (written beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_state(out: Path, params: dict[str, str], what: str) -> dict[str, Any] | None:
    """``<out>/state.json`` of an earlier invocation (None if there is none); refused when its settings
    differ from ``params`` (``what``: "a reproduction", "a comparison")."""
    state_file = out / "state.json"
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    if state.get("params") != params:
        raise ConfigError("--out", str(out), f"holds {what} with other settings ({state.get('params')}); "
                          "use another --out to start a new one")
    return dict(state)


def open_recorded(parent: ParentRun, out: Path, state: dict[str, Any] | None, name: str, tags: dict[str, str],
                  params: dict[str, str]) -> str:
    """The parent run ``state`` (:func:`read_state`) records, RUNNING again; else a new one with ``params``,
    recorded in ``<out>/state.json``. Opened either way (:meth:`ParentRun.open`)."""
    if state is not None:
        return parent.open(str(state["parent_run_id"]), running=True)
    run_id = parent.create(name, tags, params)
    write_json(out / "state.json", {"parent_run_id": run_id, "params": params})
    return run_id
