"""MLflow tracking as a round observer: one federation run's life in MLflow, from creating (or reopening)
the run to closing it FINISHED, KILLED or FAILED.

Uses an explicit :class:`mlflow.MlflowClient` and run id (no fluent global run), so several runs can
log from one process (sweeps, reproductions) without stepping on each other. The observer decides what
happens when; the pieces it calls live beside it: params and the dataset input (``inputs``), per-round
points and their outage buffer (``rounds``), system metrics (``system``), the end-of-run artifacts
(``artifacts``), the final models (``models``) and the run guard (``guard``).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lcfed.config import ExperimentConfig
from lcfed.methods.round import Federation, RoundStats
from lcfed.numerics import provenance
from lcfed.run.contracts import MAX_PERSONAL_BYTES
from lcfed.run.faults import ClusterLost
from lcfed.run.metric_catalog import SECTIONS, order_key
from lcfed.run.result import RunResult
from lcfed.run.stop import STOP
from lcfed.tracking.artifacts import log_artifacts
from lcfed.tracking.guard import RunGuard
from lcfed.tracking.inputs import dataset_input, federation_facts, log_dataset, log_params
from lcfed.tracking.models import log_model, logging_models_to, run_models
from lcfed.tracking.naming import metric_name, mlflow_key
from lcfed.tracking.naming import run_name as default_run_name
from lcfed.tracking.rounds import MetricBuffer, round_points
from lcfed.tracking.store import (
    HTTP_RETRY_BUDGET,
    get_or_create_experiment,
    is_server_uri,
    open_client,
    probe_health,
    reachable,
    resolve_tracking_uri,
)
from lcfed.tracking.system import start_monitor, stop_monitor, wanted_by_env
from lcfed.tracking.tags import provenance_tags, run_tags, source_tags

#: the section whose metrics a run logs first (:meth:`MLflowObserver.log_round`)
LEAD = f"{SECTIONS[0]}/"


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
        resume_command: str = "",
        run_name: str | None = None,
    ) -> None:
        """``backfill``: when resuming, the checkpoint's per-round history; rounds the store lacks (e.g.
        buffered during an outage when the process died) are logged from it, all of them to a new run
        (:meth:`new_run_if_gone`). ``guard``: a :class:`RunGuard` closes the run as FAILED if this process
        dies without closing it.
        ``log_models``: log the final models (:meth:`log_models`). ``system_metrics``: sample this
        machine's CPU/memory/GPU while the run trains (default: only when
        ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is true; :func:`lcfed.tracking.system.wanted_by_env` says why). ``resume_command``: the command that continues
        the run, named in the failure reason when its cluster is lost. ``run_name``: the new run's name unless
        ``tracking.run_name`` sets one (default: :func:`lcfed.tracking.naming.run_name` of the config, the
        method, data and seed; ``lcfed run`` adds its ``--set`` values)."""
        self.resume_command = resume_command
        self.log_models_enabled = log_models
        self.system_metrics = wanted_by_env() if system_metrics is None else system_metrics
        self.monitor: Any = None  # mlflow's SystemMetricsMonitor while it runs
        self.wants_models = False  # read by the engine: collect the final models for on_end
        self.max_personal_bytes = MAX_PERSONAL_BYTES  # (lcfed.run.contracts.PersonalLimit) none built past what is logged
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
        self.buffer = MetricBuffer(self.client, self.uri)  # metric points not yet accepted by the store
        self.parent_run_id = parent_run_id
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.run_id: str | None = resume_run_id
        self.backfill = list(backfill)
        self.finished = False
        self.experiment_id: str | None = None
        self.assignments: list[np.ndarray] = []
        self.assignment_rounds: list[int] = []  # the round (MLflow step) of each entry of ``assignments``
        # whether the run's first metric points went out (rounds before the first evaluation, with
        # train.eval_every > 1, wait for it: :meth:`log_round`); a reopened run has them
        self.led = False

    @property
    def is_server(self) -> bool:
        return is_server_uri(self.uri)

    @property
    def unlogged(self) -> Path | None:
        """Where the metrics the store never took were saved (None until that happens)."""
        return self.buffer.unlogged

    def check(self, timeout: float = 10.0) -> None:
        """Fail fast (before training) if the tracking store cannot be reached.

        A tracking server is probed once on ``/health``: the client's own retries would take
        minutes to give up on a server that is not there.
        """
        if self.is_server:
            probe_health(self.uri, timeout)
            return
        self.client.search_experiments(max_results=1)

    # -- the run: created or reopened, params, tags, dataset, guard -------------------------------

    def on_start(self, cfg: ExperimentConfig, fed: Federation) -> None:
        """The run of a training process: params, tags, the dataset input, system metrics."""
        self.fed = fed
        resumed = self.run_id is not None
        self.start(cfg, federation_facts(fed), provenance.record(threads=cfg.engine.torch_threads))
        assert self.run_id is not None
        log_dataset(self.client, self.run_id, dataset_input(cfg, fed))
        self.wants_models = self.log_models_enabled and bool(fed.input_shape)
        if self.system_metrics:
            self.monitor = start_monitor(self.run_id, self.uri, resumed)

    def start(self, cfg: ExperimentConfig, facts: dict[str, str], provenance: dict[str, str] | None = None) -> None:
        """Create (or reopen, when resuming) the run; ``facts`` are logged as ``federation.*`` params,
        ``provenance`` (what produces the numbers: :func:`lcfed.numerics.provenance.record`) as ``provenance.json`` and its
        ``provenance.numerics`` / ``.fingerprint`` tags."""
        self.cfg = cfg
        self.experiment_id = get_or_create_experiment(self.client, cfg.tracking.experiment, self.uri)
        if self.run_id is not None:  # resuming: same run, metrics continue at the next step
            self._reopen(cfg, provenance or {})
        else:
            self._create(cfg, facts, provenance or {})

    def _create(self, cfg: ExperimentConfig, facts: dict[str, str], provenance: dict[str, str]) -> None:
        """A new run of the experiment: its name, tags (source, method, dataset, partition, seed, engine,
        provenance, the caller's), nested under the parent run if any, guarded, with its params."""
        assert self.experiment_id is not None
        tags = {**source_tags(), **run_tags(cfg), "engine": cfg.engine.kind, **provenance_tags(provenance), **self.tags}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        name = cfg.tracking.run_name or self.run_name or default_run_name(cfg)
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.run_id = run.info.run_id
        self._guard(cfg)
        if provenance:
            self.client.log_dict(self.run_id, dict(provenance), "provenance.json")
        log_params(self.client, run.info.run_id, cfg, facts, self.uri)
        for row in self.backfill:  # resumed into a new run: the checkpoint's rounds first
            self.log_round(int(row["round"]), dict(row), None)

    def _reopen(self, cfg: ExperimentConfig, provenance: dict[str, str]) -> None:
        """The resumed run RUNNING again, tagged ``resumed``, its provenance replaced, and the rounds of
        the backfill the store lacks logged."""
        assert self.run_id is not None
        self.client.update_run(self.run_id, status="RUNNING")
        self.led = True
        self._guard(cfg)
        self.client.set_tag(self.run_id, "resumed", "true")
        self.log_provenance(provenance)
        if self.backfill:
            logged = {m.step for m in self.client.get_metric_history(self.run_id, mlflow_key("train_loss"))}
            for row in self.backfill:
                if int(row["round"]) not in logged:
                    self.log_round(int(row["round"]), dict(row), None)

    def new_run_if_gone(self) -> str:
        """When resuming (with the checkpoint's history as backfill): reopen the checkpoint's run if the store
        holds it; else log to a new run, tagged ``resumed_from_run``, that gets the checkpoint's rounds too.
        Returns a note saying so ("" when the run is reopened)."""
        rounds = "round 1" if len(self.backfill) == 1 else f"rounds 1-{len(self.backfill)}"
        if self.run_id is None:
            return (f"the checkpoint names no MLflow run (its rounds ran untracked): logging to a new run, "
                    f"{rounds} from the checkpoint")
        if self.has_run(self.run_id):
            return ""
        gone, self.run_id = self.run_id, None
        self.tags["resumed_from_run"] = gone
        return (f"MLflow run {gone} of the checkpoint is not in {self.uri} (deleted, or the store was replaced): "
                f"continuing in a new run, which gets {rounds} from the checkpoint")

    def has_run(self, run_id: str) -> bool:
        """Whether the store holds run ``run_id`` (not deleted): a resumed run reopens it, else logs anew."""
        from mlflow.exceptions import MlflowException  # MLflow only where a run is logged

        try:
            return bool(self.client.get_run(run_id).info.lifecycle_stage == "active")
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise

    def _guard(self, cfg: ExperimentConfig) -> None:
        if self.want_guard and self.guard is None and self.run_id is not None:
            hint = "; continue it with --resume (checkpoint.dir is set)" if cfg.checkpoint.dir else ""
            self.guard = RunGuard(self.uri, self.run_id, hint)

    def release_guard(self) -> None:
        if self.guard is not None:
            self.guard.release()
            self.guard = None

    def log_provenance(self, provenance: dict[str, str]) -> None:
        """The whole record as ``provenance.json`` and its ``provenance.numerics`` / ``.fingerprint`` tags,
        replacing earlier ones."""
        from mlflow.entities import RunTag  # MLflow only when a run is logged (never on Tune workers)

        if provenance and self.run_id is not None:
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in provenance_tags(provenance).items()])
            self.client.log_dict(self.run_id, dict(provenance), "provenance.json")

    # -- every round ------------------------------------------------------------------------------

    def on_round(self, rnd: int, metrics: dict[str, float], stats: RoundStats) -> None:
        self.log_round(rnd, metrics, stats.assignment)

    def log_round(self, rnd: int, metrics: dict[str, float], assignment: np.ndarray | None) -> None:
        """One round's metrics (step = round) and, for clustered methods, its assignment."""
        assert self.run_id is not None
        if assignment is not None:
            self.assignments.append(np.asarray(assignment).copy())
            self.assignment_rounds.append(int(rnd))
        self.buffer.add(round_points(rnd, metrics, assignment, self.cfg.method.params))
        if self.led or any(p.key.startswith(LEAD) for p in self.buffer.points):
            self._flush(final=False)

    def _flush(self, final: bool) -> bool:
        """Send buffered metrics (:meth:`MetricBuffer.flush`); True once the store has them all. At the end
        (``final``) a tracking server that is gone gets ``tracking.end_wait_s`` to come back (a restart); a
        signal ends the wait."""
        assert self.run_id is not None
        if not self.led:  # a run's first points: MLflow's overview lists metrics as first logged, accuracy first
            self.buffer.points.sort(key=lambda p: (order_key(metric_name(p.key)), p.step))
            self.led = True
        if not final:
            return self.buffer.flush(self.run_id, False)
        return self.buffer.flush(self.run_id, True, self.cfg.tracking.end_wait_s, lambda: STOP.reason is not None)

    # -- the end: FINISHED with artifacts and models, or KILLED / FAILED with the reason -----------

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
        if not self._flush(final=True):
            # the run's artifacts and status wait for a replay
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

    def stop_system_metrics(self, flush: bool = True) -> None:
        """Stop the sampler (:func:`lcfed.tracking.system.stop_monitor`), sending what it holds when ``flush``."""
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            stop_monitor(monitor, flush)

    def on_error(self, exc: BaseException) -> None:
        try:
            self.stop_system_metrics(flush=self.monitor is not None and reachable(self.uri))
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
        reason = exc.describe(self.resume_command) if isinstance(exc, ClusterLost) else f"{type(exc).__name__}: {exc}"
        self.client.set_tag(self.run_id, "failure_reason", reason[:5000])
        self.client.set_terminated(self.run_id, "FAILED")

    def location(self) -> dict[str, str]:
        return {"tracking_uri": self.uri, "experiment_id": str(self.experiment_id), "run_id": str(self.run_id)}

    def _artifacts(self, result: RunResult) -> None:
        assert self.run_id is not None
        log_artifacts(self.client, self.run_id, result, self.cfg, self.assignments, self.assignment_rounds)

    def log_models(self, result: RunResult) -> None:
        """The final models as MLflow PyTorch models of this run (``mlflow.pytorch.load_model``,
        ``mlflow.pyfunc.load_model``), each a :class:`lcfed.tracking.RawInputModel` with a signature: stored samples in,
        the run's scaling inside, logits out. ``global`` (one model), ``clusters`` and ``personal`` (device
        ``d``'s personalized model is ``m(x, device_id=d)``), ``embedding`` (the shared layers φ, the
        decision layer replaced by an identity). Their URIs are tags ``model.<name>``. A failure here
        warns and leaves the run's metrics and artifacts as they are."""
        if result.models is None or self.fed is None or not self.fed.input_shape:
            return
        t0 = time.perf_counter()
        try:
            self._log_models(result)
        except Exception as exc:
            warnings.warn(f"the final models were not logged: {type(exc).__name__}: {exc}", stacklevel=2)
        self.model_seconds = time.perf_counter() - t0

    def _log_models(self, result: RunResult) -> None:
        assert result.models is not None and self.fed is not None and self.run_id is not None
        models = run_models(self.fed, self.cfg, result)
        step = int(result.history[-1]["round"]) if result.history else 0
        with logging_models_to(self.uri):
            for name, module in models.items():
                self.model_uris[name] = log_model(self.run_id, name, module, step, self.cfg.method.name)
                self.client.set_tag(self.run_id, f"model.{name}", self.model_uris[name])
        result.tracking.update({f"model_{k}": v for k, v in self.model_uris.items()})
