"""Which MLflow run a resumed run logs to: the checkpoint's own run, in the store it was logged to.

A checkpoint records where its run was tracked (``tracking_uri``, ``run_id``). Resuming under another
store would look for that run where it is not (MLflow: ``Run with id=... not found``), or scatter one run's
rounds over two stores: it is refused before anything is opened, naming the store to use. When the store
is the same but no longer holds the run (deleted, or the database was replaced), the run continues in a
new run that gets every checkpointed round too (:meth:`MLflowObserver` logs its backfill), with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lcfed.errors import ConfigError
from lcfed.run.checkpoint import CheckpointError
from lcfed.tracking.store import is_server_uri, resolve_tracking_uri


def recorded_run(tracking: Mapping[str, Any], where: str) -> tuple[str, str] | None:
    """The (store, run id) a checkpoint's ``tracking`` names; None when it names none (written untracked).
    A checkpoint naming them as anything but text is a :class:`CheckpointError`."""
    run_id, uri = tracking.get("run_id"), tracking.get("tracking_uri")
    if run_id is None and uri is None:
        return None
    if not (isinstance(run_id, str) and run_id.isalnum() and isinstance(uri, str) and uri):
        raise CheckpointError(f"checkpoint {where} names its MLflow run as {run_id!r} in {uri!r}: a run id and a "
                              "tracking URI were expected; use another checkpoint.dir")
    return uri, run_id


def same_store(a: str, b: str) -> bool:
    """Whether two resolved tracking URIs name one store (a server's URL with or without a final '/')."""
    return a.rstrip("/") == b.rstrip("/") if is_server_uri(a) and is_server_uri(b) else a == b


def check_resume_store(tracking: Mapping[str, Any], uri: str | None, where: str) -> None:
    """Before anything is opened: refuse (:class:`ConfigError` on ``tracking.uri``) to resume a checkpoint
    whose run was logged to another store than ``uri`` (resolved as a run resolves it)."""
    recorded = recorded_run(tracking, where)
    here = resolve_tracking_uri(uri)
    if recorded is None or same_store(recorded[0], here):
        return
    store, run_id = recorded
    raise ConfigError("tracking.uri", here,
                      f"--resume continues MLflow run {run_id}, which the checkpoint {where} says is in {store}: set "
                      f"tracking.uri={store} to continue it there, or resume with --no-track")
