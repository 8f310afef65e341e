"""The MLflow parent run a command's runs nest under, and the Ray they run on: one context manager for
``lcfed sweep``, ``lcfed reproduce`` and ``lcfed compare``.

``with ParentRun(engine, uri, hint) as parent:`` starts a private Ray (or attaches, as ``engine.address``
says). The body makes the checks that need Ray, then :meth:`~ParentRun.connect` and
:meth:`~ParentRun.create` a run or :meth:`~ParentRun.open` one to continue it. From there the run is
guarded (:class:`lcfed.tracking.RunGuard` marks it FAILED should this process die without closing it)
and closed on the way out: FINISHED; KILLED on ``KeyboardInterrupt`` (a signal, Ctrl-C,
:class:`lcfed.run.stop.Stopped`) or FAILED on any other exception, the reason in its ``failure_reason`` tag,
the exception propagating. Last, a Ray started here is shut down; an attached one is left running.

Ray and MLflow are imported where they are used: ``lcfed`` builds its parser from ``reproduce`` and
``compare``, which import this module, and a command that runs neither must not load them.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from actors.connect import ensure_ray
from lcfed.config import EngineConfig
from lcfed.tracking import RunGuard, get_or_create_experiment, open_client, source_tags


def exception_line(exc: BaseException) -> str:
    """``ValueError: message``: an exception as a run's ``failure_reason``."""
    return f"{type(exc).__name__}: {exc}"


class ParentRun:
    """A command's parent run and Ray (see the module's docstring).

    ``uri``: the tracking store (None: no parent run, Ray only). ``hint``: what the guard's reason adds
    (how to continue the command). ``stop_reason``: the ``failure_reason`` of a run a ``KeyboardInterrupt``
    ended (KILLED); other exceptions read as :func:`exception_line`. ``ray``: False when the command has
    nothing left to run on Ray (a rerun of a finished command): no Ray is started or attached.
    """

    def __init__(self, engine: EngineConfig, uri: str | None = None, hint: str = "",
                 stop_reason: Callable[[BaseException], str] = exception_line, ray: bool = True) -> None:
        self.engine, self.uri, self.hint, self.stop_reason, self.ray = engine, uri, hint, stop_reason, ray
        self.client: Any = None
        self.experiment_id = ""
        self.run_id: str | None = None
        self._guard: RunGuard | None = None
        self._started = False

    def __enter__(self) -> ParentRun:
        self._started = self.ray and ensure_ray(self.engine)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self.run_id is not None:
                self._close(exc)
        finally:
            if self._guard is not None:
                self._guard.release()
            if self._started:
                import ray  # loaded already by ensure_ray; not at the top: see the module's docstring

                ray.shutdown()

    def connect(self, experiment: str) -> Any:
        """The tracking client (a fresh sqlite store is created under its lock) and ``experiment``'s id in
        :attr:`experiment_id` (the experiment created once, before any run nests under it)."""
        assert self.uri is not None  # only a command with a tracking store opens its parent run
        self.client = open_client(self.uri)
        self.experiment_id = get_or_create_experiment(self.client, experiment, self.uri)
        return self.client

    def create(self, name: str, tags: dict[str, str], params: dict[str, str] | None = None) -> str:
        """A new parent run, opened (:meth:`open`), with MLflow's source tags (the UI's Source and Created by)
        and ``params`` logged (each cut to MLflow's 6000 characters)."""
        tags = {**source_tags(), **tags}
        run_id = self.open(self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id)
        if params:
            from mlflow.entities import Param  # MLflow with the first run; not at the top: see the module's docstring

            self.client.log_batch(run_id, params=[Param(k, v[:6000]) for k, v in params.items()])
        return run_id

    def open(self, run_id: str, running: bool = False) -> str:
        """From here ``run_id`` is this command's parent run: guarded, and closed on the way out.
        ``running``: mark it RUNNING again first (a rerun continuing it)."""
        if running:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        assert self.uri is not None  # (as in connect)
        self._guard = RunGuard(self.uri, run_id, self.hint)
        return run_id

    def _close(self, exc: BaseException | None) -> None:
        if exc is None:
            self.client.set_terminated(self.run_id, "FINISHED")
            return
        stopped = isinstance(exc, KeyboardInterrupt)
        reason = self.stop_reason(exc) if stopped else exception_line(exc)
        self.client.set_tag(self.run_id, "failure_reason", reason[:5000])
        self.client.set_terminated(self.run_id, "KILLED" if stopped else "FAILED")
