"""MLflow tracking as a round observer: params, per-round metrics, assignment artifacts, plots.

Uses an explicit :class:`mlflow.MlflowClient` and run id (no fluent global run), so several runs can
log from one process (sweeps, reproductions) without stepping on each other.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch

from lcfed import numerics
from lcfed.config import ConfigError, ExperimentConfig, drop_later_defaults, flatten, require
from lcfed.engine import SERVER_MODELS, RunResult
from lcfed.methods.base import Federation, RoundStats
from lcfed.metrics import cluster_sizes
from lcfed.models import ParamSpec


class TrackingError(RuntimeError):
    """The MLflow store could not take the run's data; nothing was dropped silently."""


#: the tracking client's retry budget against a server, unless the environment sets its own: MLflow's
#: defaults (7 retries, backoff factor 2, 120 s timeout) spend minutes per call on a server that is gone,
#: and training must not wait on tracking
HTTP_RETRY_BUDGET = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}

#: metrics drawn in the accuracy-vs-round plot
PLOTTED = ("acc_mean", "acc_weighted", "acc_p10", "acc_p90")

#: seconds between two samples of the system metrics (``system/cpu_utilization_percentage``, memory,
#: disk, network, GPU): MLflow's default; ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` overrides it and
#: ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false`` turns them off
SYSTEM_METRICS_INTERVAL_S = 10.0

#: the personalized models are logged only up to this size (devices x parameters x 4 bytes)
MAX_PERSONAL_BYTES = 512 * 2**20


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




#: how long a process waits for others to finish opening (creating, migrating) a local sqlite store
STORE_LOCK_TIMEOUT_S = 300.0


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores and in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


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
    import mlflow

    if _sqlite_path(uri) is not None:
        # import the store's modules (a second of CPU) before the lock: waiting runs would queue behind it
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    with store_lock(uri):
        return mlflow.MlflowClient(tracking_uri=uri)


def _artifact_root(uri: str) -> str | None:
    """For a local sqlite store, artifacts go beside the database (absolute), not in the cwd."""
    path = _sqlite_path(uri)
    return (path.parent / "mlartifacts").resolve().as_uri() if path is not None else None


#: the experiment tag MLflow 3's UI reads to choose its layout: ``custom_model_development`` opens an
#: experiment on its runs table (classic ML); without it the UI may infer ``genai_development`` and
#: open on the GenAI overview (traces, "Detect issues")
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


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


@functools.cache
def git_commit(where: str | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``where`` (default: this package); None when
    it is not a git checkout or git is missing."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where or Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out if len(out) == 40 else None


def source_tags() -> dict[str, str]:
    """MLflow's source tags, which its fluent API sets and an explicit client does not: the command
    (``mlflow.source.name``, ``.type``), the code's git commit when it runs from a checkout, the user."""
    import getpass
    import sys

    from mlflow.utils import mlflow_tags as mt

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python"
    tags = {mt.MLFLOW_SOURCE_NAME: argv0, mt.MLFLOW_SOURCE_TYPE: "LOCAL"}
    commit = git_commit()
    if commit:
        tags[mt.MLFLOW_GIT_COMMIT] = commit
    try:
        tags[mt.MLFLOW_USER] = getpass.getuser()
    except Exception:  # no user name in the environment (e.g. a container's uid without passwd entry)
        pass
    return tags


def ui_hint(uri: str) -> str:
    """How to open the MLflow UI for this store."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000   # then open http://127.0.0.1:5000"


#: experiment tag prefix under which the MLflow UI keeps a shared view of its runs table
SHARED_VIEW_TAG = "mlflow.sharedViewState."


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
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{exp_id}/runs?viewStateShareKey={key}"


def federation_facts(fed: Federation) -> dict[str, str]:
    """What the config alone does not say about a federation, logged as ``federation.*`` params: model
    size, and the partition's statistics as ``federation.partition.*`` (train/test sizes, classes per
    device)."""
    return {
        "num_params": str(fed.spec.size),
        "embedding_params": str(fed.spec.embedding_size),
        "train_samples": str(int(fed.train_sizes.sum())),
        **{f"partition.{k}": f"{v:g}" for k, v in fed.partition_stats.items()},
    }


class MLflowObserver:
    """Logs one federation run to MLflow.

    Params: the flattened config plus federation facts. Metrics every round (step = round).
    Artifacts: final cluster assignment (CSV), assignment history (CSV), metrics history (CSV),
    accuracy-vs-round plot (PNG). A failed run ends FAILED with the reason as a tag.
    """

    def __init__(
        self,
        uri: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        resume_run_id: str | None = None,
        backfill: Sequence[dict[str, float]] = (),
        guard: bool = False,
        log_models: bool = True,
        system_metrics: bool | None = None,
    ) -> None:
        """``backfill``: when resuming, the checkpoint's per-round history; rounds the store lacks (e.g.
        buffered during an outage when the process died) are logged from it. ``guard``: a
        :class:`RunGuard` closes the run as FAILED if this process dies without closing it.
        ``log_models``: log the final models (:meth:`log_models`). ``system_metrics``: sample this
        machine's CPU/memory/GPU while the run trains (default: unless
        ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is false)."""
        if system_metrics is None:
            system_metrics = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true").lower() not in ("false", "0")
        self.log_models_enabled = log_models
        self.system_metrics = system_metrics
        self.monitor: Any = None  # mlflow's SystemMetricsMonitor while it runs
        self.wants_models = False  # read by the engine: collect the final models for on_end
        self.fed: Federation | None = None
        self.model_uris: dict[str, str] = {}
        self.model_seconds = 0.0  # time spent logging models (reported, kept small)
        self.guard: RunGuard | None = None
        self.want_guard = guard
        self.uri = resolve_tracking_uri(uri)
        if self.is_server:
            for key, value in HTTP_RETRY_BUDGET.items():
                os.environ.setdefault(key, value)
        self.client = open_client(self.uri)
        self.unlogged: Path | None = None  # where metrics the store never took were saved
        self.parent_run_id = parent_run_id
        self.tags = dict(tags or {})
        self.run_id: str | None = resume_run_id
        self.backfill = list(backfill)
        self.pending: list[Any] = []  # metric points not yet accepted by the store
        self.unreachable_since = 0.0
        self.finished = False
        self.experiment_id: str | None = None
        self.assignments: list[np.ndarray] = []
        self.assignment_rounds: list[int] = []  # the round (MLflow step) of each entry of ``assignments``

    @property
    def is_server(self) -> bool:
        return self.uri.startswith(("http://", "https://"))

    def _probe_health(self, timeout: float) -> None:
        """GET ``/health`` once, within ``timeout``; raises unless the server answers 200."""
        import urllib.request

        with urllib.request.urlopen(f"{self.uri.rstrip('/')}/health", timeout=timeout) as resp:
            if resp.status != 200:
                raise TrackingError(f"MLflow server {self.uri} answered /health with HTTP {resp.status}")

    def _healthy(self) -> bool:
        """A 2-second probe: while a server is gone, rounds do not wait on the client's retries."""
        if not self.is_server:
            return True
        try:
            self._probe_health(2.0)
            return True
        except (OSError, TrackingError):
            return False

    def check(self, timeout: float = 10.0) -> None:
        """Fail fast (before training) if the tracking store cannot be reached.

        A tracking server is probed once on ``/health``: the client's own retries would take
        minutes to give up on a server that is not there.
        """
        if self.is_server:
            self._probe_health(timeout)
            return
        self.client.search_experiments(max_results=1)

    def on_start(self, cfg: ExperimentConfig, fed: Federation) -> None:
        """The run of a training process: params, tags, the dataset input, system metrics."""
        self.fed = fed
        resumed = self.run_id is not None
        self.start(cfg, federation_facts(fed), numerics.provenance())
        assert self.run_id is not None
        log_dataset(self.client, self.run_id, dataset_input(cfg, fed))
        self.wants_models = self.log_models_enabled and bool(fed.input_shape)
        if self.system_metrics:
            self._start_system_metrics(resumed)

    def _start_system_metrics(self, resumed: bool) -> None:
        """MLflow's system-metrics sampler (a thread) on this run; never fails the run."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self.monitor = SystemMetricsMonitor(self.run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                                resume_logging=resumed, tracking_uri=self.uri)
            self.monitor.start()
        except Exception as exc:  # e.g. psutil missing: the run goes on without them
            self.monitor = None
            warnings.warn(f"system metrics not logged: {type(exc).__name__}: {exc}", stacklevel=2)

    def stop_system_metrics(self, flush: bool = True) -> None:
        """Stop the sampler: its thread ends within a second; what it holds is sent only when
        ``flush`` (when the store is gone it would wait out the client's retries)."""
        monitor, self.monitor = self.monitor, None
        if monitor is None:
            return
        monitor._shutdown_event.set()
        thread = getattr(monitor, "_process", None)
        if thread is not None:
            thread.join(timeout=5.0)
        monitor._process = None
        if flush:
            try:
                pending = monitor.aggregate_metrics()  # samples since the last logged point (a short run's only one)
                if pending:
                    monitor.publish_metrics(pending)
                monitor.mlflow_logger.flush()
            except Exception as exc:
                warnings.warn(f"last system metrics not logged: {type(exc).__name__}: {exc}", stacklevel=2)

    def start(self, cfg: ExperimentConfig, facts: dict[str, str], provenance: dict[str, str] | None = None) -> None:
        """Create (or reopen, when resuming) the run; ``facts`` are logged as ``federation.*`` params,
        ``provenance`` (what produces the numbers: :func:`lcfed.numerics.provenance`) as ``provenance.*`` tags."""
        from mlflow.entities import Param

        self.cfg = cfg
        self.experiment_id = get_or_create_experiment(self.client, cfg.tracking.experiment, self.uri)
        if self.run_id is not None:  # resuming: same run, metrics continue at the next step
            self.client.update_run(self.run_id, status="RUNNING")
            self._guard(cfg)
            self.client.set_tag(self.run_id, "resumed", "true")
            self.log_provenance(provenance or {})
            if self.backfill:
                logged = {m.step for m in self.client.get_metric_history(self.run_id, "train_loss")}
                for row in self.backfill:
                    if int(row["round"]) not in logged:
                        self.log_round(int(row["round"]), dict(row), None)
            return
        tags = {**source_tags(), "method": cfg.method.name, "dataset": cfg.data.dataset, "engine": cfg.engine.kind,
                **provenance_tags(provenance or {}), **self.tags}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=cfg.tracking.run_name or cfg.name, tags=tags)
        self.run_id = run.info.run_id
        self._guard(cfg)
        params = {k: str(v) for k, v in flatten(cfg).items()}
        params.update({f"federation.{k}": str(v) for k, v in facts.items()})
        items = [Param(k, v[:6000]) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def _guard(self, cfg: ExperimentConfig) -> None:
        if self.want_guard and self.guard is None and self.run_id is not None:
            hint = "; continue it with --resume (checkpoint.dir is set)" if cfg.checkpoint.dir else ""
            self.guard = RunGuard(self.uri, self.run_id, hint)

    def log_provenance(self, provenance: dict[str, str]) -> None:
        """``provenance.*`` tags, replacing earlier values (one call)."""
        from mlflow.entities import RunTag

        if provenance and self.run_id is not None:
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in provenance_tags(provenance).items()])

    def release_guard(self) -> None:
        if self.guard is not None:
            self.guard.release()
            self.guard = None

    def on_round(self, rnd: int, metrics: dict[str, float], stats: RoundStats) -> None:
        self.log_round(rnd, metrics, stats.assignment)

    def log_round(self, rnd: int, metrics: dict[str, float], assignment: np.ndarray | None) -> None:
        """One round's metrics (step = round) and, for clustered methods, its assignment."""
        from mlflow.entities import Metric

        assert self.run_id is not None
        ts = int(time.time() * 1000)
        values = {k: v for k, v in metrics.items() if k != "round"}
        if assignment is not None:
            self.assignments.append(np.asarray(assignment).copy())
            self.assignment_rounds.append(int(rnd))
            k = getattr(self.cfg.method.params, "num_clusters", int(assignment.max()) + 1)
            for c, size in enumerate(cluster_sizes(assignment, max(k, int(assignment.max()) + 1))):
                values[f"cluster_size_{c}"] = float(size)
        self.pending.extend(Metric(k, float(v), ts, rnd) for k, v in values.items() if np.isfinite(v))
        self._flush(final=False)

    def _flush(self, final: bool) -> bool:
        """Send buffered metrics; True once the store has them all. While the store is unreachable they
        stay buffered (training goes on, one warning); at the end, what is left is saved to a file
        that ``lcfed tracking replay`` sends later."""
        assert self.run_id is not None
        if self.pending and self.unreachable_since and not self._healthy():
            exc: Exception = ConnectionError(f"{self.uri} does not answer /health")
        else:
            try:
                while self.pending:
                    self.client.log_batch(self.run_id, metrics=self.pending[:1000])
                    del self.pending[:1000]
                self.unreachable_since = 0.0
                return True
            except Exception as err:
                exc = err
        if final:
            dump = Path(f"unlogged-metrics-{self.run_id}.json").resolve()
            dump.write_text(json.dumps({"tracking_uri": self.uri, "run_id": self.run_id,
                                        "metrics": [[m.key, m.value, m.timestamp, m.step] for m in self.pending]}))
            self.unlogged = dump
            warnings.warn(f"MLflow store {self.uri} unreachable at the end of the run: {len(self.pending)} metric "
                          f"points saved in {dump} ({type(exc).__name__})", stacklevel=2)
            return False
        if not self.unreachable_since:
            self.unreachable_since = time.time()
            warnings.warn(f"MLflow store {self.uri} unreachable ({type(exc).__name__}); buffering metrics",
                          stacklevel=2)
        return False

    def on_end(self, result: RunResult) -> None:
        try:
            self._end(result)
        finally:
            self.stop_system_metrics(flush=False)  # already stopped unless _end failed
            self.release_guard()

    def _end(self, result: RunResult) -> None:
        assert self.run_id is not None
        self.finished = True
        result.tracking.update(self.location())
        if not self._flush(final=True):  # the run's artifacts and status wait for a replay
            self.stop_system_metrics(flush=False)
            result.tracking["unlogged_metrics"] = str(self.unlogged)
            if result.models is not None:
                warnings.warn("the final models were not logged: the MLflow store is unreachable", stacklevel=2)
            return
        self.stop_system_metrics(flush=True)
        self.log_provenance(result.provenance)  # the engine's, with the device actors' kernels and GPUs
        self._artifacts(result)
        self.log_models(result)
        self.client.set_terminated(self.run_id, "FINISHED")

    def on_error(self, exc: BaseException) -> None:
        try:
            self.stop_system_metrics(flush=self.monitor is not None and self._healthy())
            self._error(exc)
        finally:
            self.release_guard()

    def _error(self, exc: BaseException) -> None:
        if self.run_id is None or self.finished:  # e.g. Tune ending a trial after its last report
            return
        if isinstance(exc, SystemExit) and exc.code in (0, None):  # a scheduler (e.g. ASHA) ended the run early
            self.client.set_tag(self.run_id, "stopped_early", "true")
            self.client.set_terminated(self.run_id, "KILLED")
            return
        if isinstance(exc, KeyboardInterrupt):  # a signal or Ctrl-C: logged rounds are kept, the run is KILLED
            self._flush(final=False)
            self.client.set_tag(self.run_id, "failure_reason", str(exc) or "interrupted")
            self.client.set_terminated(self.run_id, "KILLED")
            return
        self.client.set_tag(self.run_id, "failure_reason", f"{type(exc).__name__}: {exc}"[:5000])
        self.client.set_terminated(self.run_id, "FAILED")

    def location(self) -> dict[str, str]:
        return {"tracking_uri": self.uri, "experiment_id": str(self.experiment_id), "run_id": str(self.run_id)}

    def _artifacts(self, result: RunResult) -> None:
        assert self.run_id is not None
        self.client.log_text(self.run_id, history_csv(result.history), "metrics/history.csv")
        if result.assignment is not None:
            rows = ["device,cluster"] + [f"{d},{c}" for d, c in enumerate(result.assignment)]
            self.client.log_text(self.run_id, "\n".join(rows) + "\n", "clusters/assignment.csv")
            if self.assignments:
                hist, rounds = np.stack(self.assignments), self.assignment_rounds
            else:  # only the final assignment is known: it belongs to the last round
                last = int(result.history[-1].get("round", 0)) if result.history else 0
                hist, rounds = np.asarray(result.assignment)[None], [last]
            self.client.log_text(self.run_id, assignment_history_csv(hist, rounds), "clusters/assignment_history.csv")
        self.client.log_figure(self.run_id, accuracy_figure(result.history, self.cfg), "plots/accuracy.png")
        if result.evaluation:
            self.client.log_text(self.run_id, devices_csv(result), "metrics/devices.csv")

    def log_models(self, result: RunResult) -> None:
        """The final models as MLflow PyTorch models of this run (``mlflow.pytorch.load_model``):
        ``global`` (one model), ``clusters`` and ``personal`` (a :class:`StackedModels`: model ``i``
        is ``m(x, i)``, device ``d``'s personalized model is ``personal``'s row ``d``), ``embedding``
        (the shared layers φ, the decision layer replaced by an identity). Their URIs are tags
        ``model.<name>``. A failure here warns and leaves the run's metrics and artifacts as they are."""
        if result.models is None or self.fed is None or not self.fed.input_shape:
            return
        t0 = time.perf_counter()
        try:
            self._log_models(result)
        except Exception as exc:
            warnings.warn(f"the final models were not logged: {type(exc).__name__}: {exc}", stacklevel=2)
        self.model_seconds = time.perf_counter() - t0

    def _log_models(self, result: RunResult) -> None:
        import mlflow.pytorch
        import torch

        from lcfed.models import build_network

        assert result.models is not None and self.fed is not None and self.run_id is not None
        fed, cfg = self.fed, self.cfg
        net, _ = build_network(cfg.model.name, tuple(fed.input_shape), fed.num_classes, cfg.seed)  # type: ignore[arg-type]
        models = final_modules(net.module, net.spec, result.models.server_state)
        personal = result.models.personal
        if personal and len(personal) * fed.spec.size * 4 <= MAX_PERSONAL_BYTES:
            devices = sorted(personal)
            models["personal"] = StackedModels(net.module, net.spec, torch.stack([personal[d] for d in devices]),
                                               [f"device_{d}" for d in devices])
        requirements = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"]
        step = int(result.history[-1]["round"]) if result.history else 0
        with _global_tracking_uri(self.uri), _quiet("mlflow.pytorch"):  # its pickle-format notice, per model
            for name, module in models.items():
                info = mlflow.pytorch.log_model(module, name=name, run_id=self.run_id, pip_requirements=requirements,
                                                serialization_format="pickle", step=step,
                                                tags={"lcfed.model": name, "method": cfg.method.name})
                self.model_uris[name] = info.model_uri
                self.client.set_tag(self.run_id, f"model.{name}", info.model_uri)
        result.tracking.update({f"model_{k}": v for k, v in self.model_uris.items()})


@contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to ``uri`` for the block (``mlflow.pytorch.log_model``
    takes no client), then put back as it was, ``$MLFLOW_TRACKING_URI`` included (MLflow's own
    helper unsets that variable on the way out)."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    old, env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(old)  # type: ignore[arg-type]
        if env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    import logging

    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def devices_csv(result: RunResult) -> str:
    """The last evaluation per device: ``device,cluster,trained,correct,total,accuracy,test_loss``
    (``cluster`` -1 or empty when the method has none; ``trained`` 1 = counted in ``acc_mean``)."""
    lines = ["device,cluster,trained,correct,total,accuracy,test_loss"]
    for d, r in sorted(result.evaluation.items()):
        cluster = "" if result.assignment is None else str(int(result.assignment[d]))
        trained = "" if result.trained is None else str(int(bool(result.trained[d])))
        acc = repr(r.correct / r.total) if r.total else ""
        loss = repr(r.loss_sum / r.total) if r.total else ""
        lines.append(f"{d},{cluster},{trained},{r.correct},{r.total},{acc},{loss}")
    return "\n".join(lines) + "\n"


def provenance_tags(provenance: dict[str, str]) -> dict[str, str]:
    """``provenance.<field>`` tags of :func:`lcfed.numerics.provenance`'s record (MLflow caps a tag at 8000 characters)."""
    return {f"provenance.{k}": str(v)[:8000] for k, v in provenance.items()}


def partition_digest(cfg: ExperimentConfig) -> str:
    """What decides the devices' samples (the ``data`` section but where files live, and the seed),
    hashed: equal digests, equal partitions."""
    import dataclasses
    import hashlib

    data = {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in ("data_dir", "download")}
    drop_later_defaults({"data": data})  # digests of runs without a validation split stay as they were
    blob = json.dumps({"data": data, "seed": cfg.seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def dataset_input(cfg: ExperimentConfig, fed: Federation) -> Any:
    """The run's dataset as an MLflow dataset input (no data uploaded): name = the dataset, digest =
    :func:`partition_digest`, source = the data directory (MLflow's ``local`` source), profile = the partition's config and
    statistics; context ``training`` (each device's train and test split come from it)."""
    import dataclasses

    from mlflow.entities import Dataset, DatasetInput, InputTag

    where = str(Path(cfg.data.data_dir).expanduser().resolve())
    profile = {"partition": {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in ("data_dir", "download")},
               "seed": cfg.seed, "num_devices": fed.num_devices, "train_samples": int(fed.train_sizes.sum()),
               "num_classes": fed.num_classes, "input_shape": list(fed.input_shape),
               "stats": {k: float(v) for k, v in fed.partition_stats.items()}}
    entity = Dataset(name=cfg.data.dataset, digest=partition_digest(cfg), source_type="local",
                     source=json.dumps({"uri": where}), profile=json.dumps(profile, default=str))
    return DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")])


def log_dataset(client: Any, run_id: str, dataset: Any, attempts: int = 5) -> None:
    """``client.log_inputs`` that survives concurrent runs of one experiment logging the same dataset: the
    store looks the dataset up, then inserts it, so all but one racer hit the UNIQUE constraint; again,
    they find the row."""
    from mlflow.exceptions import MlflowException

    for attempt in range(attempts):
        try:
            client.log_inputs(run_id, datasets=[dataset])
            return
        except MlflowException as exc:
            duplicate = any(k in str(exc) for k in ("UNIQUE constraint", "IntegrityError", "Duplicate entry",
                                                     "duplicate key"))
            if not duplicate or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def _module(skeleton: Any, spec: ParamSpec, flat: Any) -> Any:
    """A copy of ``skeleton`` holding the flat weights ``flat`` (in eval mode)."""
    import copy

    import torch

    module = copy.deepcopy(skeleton)
    with torch.no_grad():
        for name, value in spec.unflatten(flat.detach().float().cpu()).items():
            module.get_parameter(name).copy_(value)
    return module.requires_grad_(False).eval()


def final_modules(skeleton: Any, spec: ParamSpec, state: Any) -> dict[str, Any]:
    """The server state's models (:data:`SERVER_MODELS` fields) as modules: a full-size vector
    (``weights``) as the model itself, rows of them (``centers``) as :class:`StackedModels`, the
    embedding part (``embedding``) as the model with an identity for its decision layer."""
    import torch

    out: dict[str, Any] = {}
    for field_name, name in SERVER_MODELS.items():
        value = getattr(state, field_name, None)
        if not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 1 and value.numel() == spec.size:
            out[name] = _module(skeleton, spec, value)
        elif value.dim() == 2 and value.shape[1] == spec.size:
            out[name] = StackedModels(skeleton, spec, value, [f"cluster_{k}" for k in range(value.shape[0])])
        elif value.dim() == 1 and value.numel() == spec.embedding_size:
            full = torch.cat([value.detach().float().cpu(), torch.zeros(spec.decision_size)])
            module = _module(skeleton, spec, full)
            setattr(module, getattr(skeleton, "decision_layer", "fc3"), torch.nn.Identity())
            out[name] = module
    return out


class StackedModels(torch.nn.Module):
    """Several models of one architecture in one module (what ``models/clusters`` and
    ``models/personal`` hold): ``m(x, i)`` is model ``i``'s logits, ``m.module(i)`` a standalone copy
    of it, ``m.names[i]`` its name (``device_<d>``, ``cluster_<k>``), ``m.weights`` the (n, parameters)
    flat weights."""

    def __init__(self, skeleton: Any, spec: ParamSpec, weights: Any, names: Sequence[str]) -> None:
        import copy

        super().__init__()
        self.skeleton = copy.deepcopy(skeleton).requires_grad_(False).eval()
        self.spec = spec
        self.weights: torch.Tensor
        self.register_buffer("weights", weights.detach().float().cpu().clone())
        self.names = tuple(names)

    def __len__(self) -> int:
        return int(self.weights.shape[0])

    def forward(self, x: Any, index: int = 0) -> Any:
        from torch.func import functional_call

        return functional_call(self.skeleton, self.spec.unflatten(self.weights[index]), (x,))

    def module(self, index: int) -> Any:
        return _module(self.skeleton, self.spec, self.weights[index])


def _fmt(v: Any) -> str:
    return "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def history_csv(history: Sequence[dict[str, float]]) -> str:
    """One row per round, one column per metric (sorted, ``round`` = MLflow step); a plain CSV whose
    first line is the header."""
    keys = sorted({k for row in history for k in row})
    if "round" in keys:
        keys.remove("round")
        keys.insert(0, "round")
    lines = [",".join(keys)] + [",".join(_fmt(row.get(k)) for k in keys) for row in history]
    return "\n".join(lines) + "\n"


def assignment_history_csv(hist: np.ndarray, rounds: Sequence[int]) -> str:
    """The cluster of every device per round: header ``round,device_0,device_1,...`` (no comment line,
    so MLflow's preview and any CSV reader take the first line as the header); ``round`` is the
    MLflow step, a cluster of -1 means unassigned."""
    hist = np.asarray(hist, dtype=np.int64).reshape(len(rounds), -1)
    header = ",".join(["round"] + [f"device_{d}" for d in range(hist.shape[1])])
    lines = [header] + [",".join(str(int(v)) for v in (r, *row)) for r, row in zip(rounds, hist, strict=True)]
    return "\n".join(lines) + "\n"


def read_assignment_history(text: str) -> tuple[np.ndarray, np.ndarray]:
    """``(rounds, assignment)`` from an ``assignment_history.csv``: the plain CSV that
    :func:`assignment_history_csv` writes, or the older form (a ``#`` comment, no round column,
    rows = rounds from 0)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if lines and lines[0].split(",")[0].strip() == "round":
        data = np.array([[int(v) for v in ln.split(",")] for ln in lines[1:]], dtype=np.int64).reshape(len(lines) - 1, -1)
        return data[:, 0], data[:, 1:]
    data = np.array([[int(float(v)) for v in ln.split(",")] for ln in lines], dtype=np.int64).reshape(len(lines), -1)
    return np.arange(len(data)), data


#: x-axis label of plots over rounds: rounds are numbered from 0, as MLflow's metric steps are
ROUND_AXIS = "round (MLflow step, from 0)"


def accuracy_figure(history: Sequence[dict[str, float]], cfg: ExperimentConfig) -> Any:
    """Personalized test accuracy (mean, weighted mean, 10th-90th percentile band) per round. The
    x values are the rounds as logged (0-based, equal to the MLflow step); the legend sits below
    the axes so it never hides the band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = [r for r in history if "acc_mean" in r]
    fig, ax = plt.subplots(figsize=(6, 4.4), dpi=100, layout="constrained")
    if rows:
        x = [int(r["round"]) for r in rows]
        ax.fill_between(x, [r["acc_p10"] for r in rows], [r["acc_p90"] for r in rows], alpha=0.2, label="p10–p90")
        ax.plot(x, [r["acc_mean"] for r in rows], label="mean")
        ax.plot(x, [r["acc_weighted"] for r in rows], "--", label="sample-weighted mean")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(ROUND_AXIS)
    ax.set_ylabel("personalized test accuracy")
    ax.set_title(f"{cfg.method.name} on {cfg.data.dataset} ({cfg.data.partition})")
    ax.grid(alpha=0.3)
    if rows:
        fig.legend(loc="outside lower center", ncols=3, frameon=False)
    plt.close(fig)
    return fig


#: The guard (run as ``python -c``): blocks on stdin until its starter closes it (or dies, which closes
#: it too); ``q`` means the run was closed properly. Otherwise the run (and its RUNNING children) is
#: still open with nobody to close it: mark it FAILED with the reason. MLflow is imported only then.
_GUARD = """import sys
uri, run_id, hint = sys.argv[1], sys.argv[2], sys.argv[3]
if sys.stdin.buffer.read().endswith(b"q"):
    sys.exit(0)
import mlflow
client = mlflow.MlflowClient(tracking_uri=uri)
run = client.get_run(run_id)
children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
reason = ("the lcfed process ended without closing this run (killed, e.g. kill -9 or out of memory, "
          "or its Ray node died); the metrics logged until then are kept" + hint)
for r in [run, *children]:
    if r.info.status == "RUNNING":
        client.set_tag(r.info.run_id, "failure_reason", reason)
        client.set_terminated(r.info.run_id, "FAILED")
"""


class RunGuard:
    """A small process that marks a run FAILED, with the reason, if this process dies without closing
    it (``kill -9``, the OOM killer, Ray ending the driver when its raylet dies): no run stays RUNNING
    forever. :meth:`release` once the run is closed (or deliberately left open for a replay)."""

    def __init__(self, uri: str, run_id: str, hint: str = "") -> None:
        import subprocess
        import sys

        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", _GUARD, uri, run_id, hint],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or a signal to our process group must not reach it
        )

    def release(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(b"q")
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, ValueError):
            pass
        except Exception:  # subprocess.TimeoutExpired: it has nothing left to do
            proc.kill()


def read_unlogged(path: str | Path) -> dict[str, Any]:
    """A dump of unlogged metrics, checked: ``{tracking_uri, run_id, metrics: [[key, value, ts, step], ...]}``.
    Anything else is a :class:`ConfigError` naming the file and what is wrong."""
    from lcfed.config import TrackingConfig

    what = "must be an unlogged-metrics-<run>.json file that a run wrote when its tracking store was gone"
    p = Path(path)
    require(p.is_file(), "FILE", str(path), what)
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("FILE", str(path), f"{what} (not UTF-8 JSON: {exc})") from None
    require(isinstance(data, dict) and {"tracking_uri", "run_id", "metrics"} <= set(data), "FILE", str(path),
            f"{what} (an object with tracking_uri, run_id and metrics)")
    require(isinstance(data["run_id"], str) and bool(data["run_id"]), "FILE", str(path), f"{what} (run_id: a string)")
    require(isinstance(data["tracking_uri"], str), "FILE", str(path), f"{what} (tracking_uri: a string)")
    try:
        TrackingConfig(uri=data["tracking_uri"]).validate()
    except ConfigError as exc:
        raise ConfigError("FILE", str(path), f"tracking_uri {exc.value!r}: {exc.allowed}") from None
    rows = data["metrics"]
    require(isinstance(rows, list) and all(
        isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r[1:]) for r in rows),
        "FILE", str(path), f"{what} (metrics: a list of [key, value, timestamp, step])")
    return data


def replay(path: str | Path, finish: bool = True) -> tuple[str, int]:
    """Send a file of unlogged metrics (written when the store was gone at the end of a run) to its
    run; mark the run FINISHED unless told not to. Returns (run id, points sent)."""
    import mlflow
    from mlflow.entities import Metric

    data = read_unlogged(path)
    client = mlflow.MlflowClient(tracking_uri=data["tracking_uri"])
    points = [Metric(str(k), float(v), int(ts), int(step)) for k, v, ts, step in data["metrics"]]
    for start in range(0, len(points), 1000):
        client.log_batch(data["run_id"], metrics=points[start : start + 1000])
    if finish:
        client.set_terminated(data["run_id"], "FINISHED")
    return str(data["run_id"]), len(points)
