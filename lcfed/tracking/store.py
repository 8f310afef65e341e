"""Where runs go: the tracking URI, the lock around a local sqlite store, the client, experiments and a
server's health.

Separate from the observer because the sweep driver, ``lcfed compare``, ``lcfed reproduce`` and the
MLflow server command open stores and experiments without logging a run themselves. MLflow is
imported inside :func:`open_client` only: ``lcfed.tracking`` is imported on Tune worker nodes, where
MLflow is not installed.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lcfed.errors import TrackingError, require
from lcfed.run.output_paths import check_holds_files

#: the tracking client's retry budget against a server, unless the environment sets its own: MLflow's
#: defaults (7 retries, backoff factor 2, 120 s timeout) spend minutes per call on a server that is gone,
#: and training must not wait on tracking
HTTP_RETRY_BUDGET = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}

#: metric points per ``log_batch`` call: MLflow's limit for one batch
METRICS_PER_BATCH = 1000

#: how long a process waits for others to finish opening (creating, migrating) a local sqlite store
STORE_LOCK_TIMEOUT_S = 300.0

#: the experiment tag MLflow 3's UI reads to choose its layout: ``custom_model_development`` opens an
#: experiment on its runs table (classic ML); without it the UI may infer ``genai_development`` and
#: open on the GenAI overview (traces, "Detect issues")
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI: the config's, else ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db`` (sqlite).

    Local paths are made absolute so Ray workers and Tune trials (which run in other directories)
    write to the same store.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri[len("sqlite:///") :]
        if path and not path.startswith("/") and path != ":memory:":
            return f"sqlite:///{(Path.cwd() / path).resolve()}"
        return uri
    if parsed.scheme in ("", "file"):
        local = Path(parsed.path if parsed.scheme == "file" else uri).expanduser().resolve()
        return local.as_uri()
    return uri


def is_server_uri(uri: str) -> bool:
    """True for a tracking server (``http(s)://``), False for a store this process opens itself."""
    return uri.startswith(("http://", "https://"))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores and in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def check_tracking_store(uri: str | None, flag: str = "tracking.uri") -> None:
    """Refuse, before any work, a local sqlite store (:func:`resolve_tracking_uri`'s) that is a directory or
    whose directory cannot hold files; a server or another database is reached, and refused, by the store."""
    resolved = resolve_tracking_uri(uri)
    path = _sqlite_path(resolved)
    if path is None:
        return
    require(not path.is_dir(), flag, resolved, "is a directory: name the database file, e.g. sqlite:///DIR/mlflow.db")
    check_holds_files(path.parent, flag, resolved, "the store's directory ")


def check_registry(name: str | None) -> None:
    """``--register NAME``: a registered model's name (no ``/`` or ``:``, which model URIs use). The store is
    one with a Model Registry already: a database or a server (a ``file:`` store is refused by the config)."""
    if name is None:
        return
    require(bool(name.strip()) and "/" not in name and ":" not in name, "--register", name,
            "a registered model name without '/' or ':'")


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold ``<db>.lock`` (an inter-process file lock) for a local sqlite store; no-op for other stores.

    MLflow creates and migrates a fresh sqlite database on first open without any lock, so runs started
    at once on a new store fail (``table _alembic_tmp_... already exists``): the first open of a store
    and the experiment lookup/creation run under this lock.
    """
    path = _sqlite_path(uri)
    if path is None:
        yield
        return
    # imported here, as before the split: ``import lcfed.tracking`` (Tune workers) loads no lock library
    from filelock import FileLock, Timeout

    lock = FileLock(f"{path}.lock", timeout=STORE_LOCK_TIMEOUT_S)
    held = False
    try:
        lock.acquire()
        held = True
    except Timeout:
        raise TrackingError(f"waited {STORE_LOCK_TIMEOUT_S:.0f} s for {lock.lock_file} (another process "
                            "holds it while it opens the store)") from None
    except OSError:  # a directory we cannot write to: nobody can create or migrate a store there either
        pass
    try:
        yield
    finally:
        if held:
            lock.release()


def open_client(uri: str) -> Any:
    """An :class:`mlflow.MlflowClient` for ``uri`` (resolved); creating it opens (and, for a new sqlite
    file, creates) the store, so that happens under :func:`store_lock`."""
    import mlflow  # MLflow only where a store is opened: never on Tune worker nodes

    if _sqlite_path(uri) is not None:
        # import the store's modules (a second of CPU) before the lock: waiting runs would queue behind it
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    with store_lock(uri):
        # the registry in the same store (MLflow's default is the process-wide URI, e.g. ./mlflow.db)
        return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def _artifact_root(uri: str) -> str | None:
    """For a local sqlite store, artifacts go beside the database (absolute), not in the cwd."""
    path = _sqlite_path(uri)
    return (path.parent / "mlartifacts").resolve().as_uri() if path is not None else None


def get_or_create_experiment(client: Any, name: str, uri: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a local sqlite store) if missing, as a
    classic ML experiment (:data:`EXPERIMENT_KIND`; an existing experiment without the tag gets it)."""
    key, kind = EXPERIMENT_KIND
    with store_lock(uri):  # processes on one sqlite file create the experiment once
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if key not in exp.tags:
                client.set_experiment_tag(exp.experiment_id, key, kind)
            return str(exp.experiment_id)
        root = _artifact_root(uri)
        location = f"{root}/{name}" if root else None
        try:
            return str(client.create_experiment(name, artifact_location=location, tags={key: kind}))
        except Exception:
            # another process (on a server, where no lock is shared) created it between lookup and create
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)


def probe_health(url: str, timeout: float) -> None:
    """GET ``<url>/health`` once, within ``timeout``; raises (:class:`OSError`, :class:`TrackingError`)
    unless the server answers 200."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as resp:  # noqa: S310 (http(s) only)
        if resp.status != 200:
            raise TrackingError(f"MLflow server {url} answered /health with HTTP {resp.status}")


def server_healthy(url: str, timeout: float = 2.0) -> bool:
    """True if the MLflow server at ``url`` answers ``GET /health`` with 200 within ``timeout``."""
    try:
        probe_health(url, timeout)
    except (OSError, TrackingError):
        return False
    return True


def reachable(uri: str, timeout: float = 2.0) -> bool:
    """A short probe of a tracking server (:func:`server_healthy`), so that while it is gone nothing waits
    on the client's retries; a store this process opens itself counts as reachable."""
    return not is_server_uri(uri) or server_healthy(uri, timeout)
