"""``run_sweep``: a Ray Tune sweep over any config field, each trial a full federation.

A trial runs its federation one of two ways (``--trial-engine``, see :func:`resolve_trial_engine`):
``local``, the in-process engine inside the trial's own process (one bundle: the trial's CPUs and its
GPU share; trial processes are reused from trial to trial, so torch is imported once per slot), or
``ray``, a placement group with a small bundle for the trial's driver and one bundle per device actor
(with its fraction of the trial's GPUs; the ServerActor takes no CPU), as a multi-node cluster with
GPU workers needs. Every round is reported to Tune (so ASHA can stop poor trials early); the trial
checkpoint is the engine's snapshot, so ``--resume`` continues interrupted trials bit-identically.
MLflow gets one parent run per sweep and one child run per trial; the parent gets the best config
and summary plots. An untracked sweep (``tracking.enabled`` false: ``--no-track``) has neither: its trials
report to Tune alone and the summary gives the best trial.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import ray
import yaml
from ray import tune

from actors.nodes import alive_nodes
from lcfed import logs
from lcfed.config import ExperimentConfig, to_dict
from lcfed.errors import ConfigError
from lcfed.logs import tune_verbosity
from lcfed.tracking import mlflow_key, resolve_tracking_uri, run_tags
from lcfed.tracking.ui import parallel_chart, scatter_chart, share_view, view_path, view_url
from tune_jobs.feasible import check_live, sweep_ask, trial_engine_nodes
from tune_jobs.parent_run import ParentRun
from tune_jobs.sweep.best import best_result, child_run, log_parent, trial_order
from tune_jobs.sweep.callbacks import SweepProgress, TrialTracker
from tune_jobs.sweep.models import log_best_models, prune_models, register_run
from tune_jobs.sweep.objective import METRIC, Objective
from tune_jobs.sweep.options import (
    DEFAULT_STORAGE,
    SweepInterrupted,
    SweepOptions,
    check_storage,
    error_line,
    experiment_path,
    resolve_trial_engine,
    storage_location,
)
from tune_jobs.sweep.search import check_search, make_scheduler, make_search
from tune_jobs.sweep.space import describe_domain, log_keys, log_param, numeric_keys, space_spec, swept_keys
from tune_jobs.sweep.trial import load_sources, run_trial, trial_resources


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's settings, resolved and checked before anything starts."""

    base: ExperimentConfig  # its tracking: an absolute URI, or disabled (an untracked sweep)
    space: dict[str, Any]  # as given: Tune domains, grids and fixed values
    tune_space: dict[str, Any]  # the Tuner's param_space entries for the search (:func:`check_search`)
    options: SweepOptions  # as given, validated
    objective: Objective  # the options' (:meth:`SweepOptions.validate`)
    name: str
    storage_uri: str
    parent_run_id: str | None = None  # the run the sweep's parent run nests under (``lcfed compare``)
    named: Mapping[str, Any] | None = None  # values the trials' run names show besides the swept ones
    label: str | None = None  # the start of each progress line (:class:`SweepProgress`)

    @property
    def swept(self) -> list[str]:
        return swept_keys(self.space)

    @property
    def exp_path(self) -> str:
        """Where Tune keeps the sweep (the summary's ``storage``)."""
        return experiment_path(self.storage_uri, self.name)

    @property
    def tracked(self) -> bool:
        """Whether the sweep logs to MLflow (a parent run, a child run per trial)."""
        return self.base.tracking.enabled

    @property
    def models_wanted(self) -> bool:
        """Whether the best trial's models are logged on its child run (``--register`` needs them)."""
        return self.tracked and (self.options.log_models or self.options.register is not None)


def run_sweep(base: ExperimentConfig, space: dict[str, Any], options: SweepOptions, *,
              parent_run_id: str | None = None, named: Mapping[str, Any] | None = None,
              shared: dict[Any, Any] | None = None, label: str | None = None) -> dict[str, Any]:
    """Run (or resume) a sweep; return the best trial's config, metric and the MLflow parent run.

    ``options`` (:class:`~tune_jobs.sweep.options.SweepOptions`, checked by its ``validate`` before anything
    starts, whoever calls; ``lcfed sweep`` has checked them before loading Tune): the search (:func:`check_search`), the objective (:func:`resolve_objective`: one metric
    and mode for the scheduler, the best trial and the parent run), the trial engine
    (:func:`resolve_trial_engine`), the storage and its checkpoints, and the best trial's models (logged on
    its child run with ``log_models``; ``register``ed under that name in the Model Registry:
    :mod:`tune_jobs.sweep.models`). A resumed sweep keeps the objective and search it started with.
    ``parent_run_id``: the sweep's run nests under it (``lcfed compare``). ``named``: config values every
    trial's run name shows besides its swept ones (``lcfed sweep``: its ``--set`` values; a trial is named
    ``mu=0.0312 lam=0.2 · lcfed · digits dir0.15 · s0``). With ``base.tracking.enabled`` false the sweep is
    untracked: no MLflow run or store, the summary's run fields None (``register`` is refused). ``shared``: the
    object-store copies of the datasets, kept across the sweeps of one Ray session (``lcfed compare``: one copy
    for all its sweeps, :func:`put_sources`). ``label``: the start of each progress line (``lcfed compare``: the
    method, whose sweeps run beside other methods').
    """
    tracked = base.tracking.enabled
    obj = options.validate(base.train.rounds, tracked)
    tune_space = check_search(options.search, space)
    uri = resolve_tracking_uri(base.tracking.uri) if tracked else None
    if tracked:
        base = base.replace(**{"tracking.uri": uri})
    storage = DEFAULT_STORAGE if options.storage is None else options.storage
    plan = SweepPlan(base=base, space=space, tune_space=tune_space, options=options, objective=obj,
                     name=options.name or f"{base.name}-sweep", storage_uri=storage_location(storage),
                     parent_run_id=parent_run_id, named=named, label=label)
    sources = load_sources(base, space)  # a missing dataset fails here, before any run or trial exists
    if logs.progress_shown():
        print(f"lcfed sweep {plan.name}: Tune state and each trial's latest {options.keep_checkpoints} checkpoint(s) "
              f"go to {plan.exp_path}", file=sys.stderr, flush=True)
    hint = f"; the Tune state is saved: continue with --resume --name {plan.name}"
    with ParentRun(base.engine, uri, hint, stop_reason=_stop_reason) as parent:
        return _run_under(parent, plan, sources if shared is None else put_sources(sources, shared))


def put_sources(sources: dict[Any, Any], shared: dict[Any, Any]) -> Any:
    """The object-store copy of ``sources`` in ``shared`` (put there the first time): what ``tune.with_parameters``
    hands the trials. Given the datasets themselves it puts them again, and Tune's parameter registry keeps every
    such copy for the rest of the Ray session (an MNIST comparison spilled to disk from its fifth sweep on)."""
    key = tuple(sources)  # the datasets' source keys
    if key not in shared:
        shared[key] = ray.put(sources)
    return shared[key]


def _run_under(parent: ParentRun, plan: SweepPlan, sources: Any) -> dict[str, Any]:
    """The checked sweep under its open parent run: the trials, then the best one logged on the parent
    (and, if the plan wants them, its models on its child run, registered under ``--register``'s name)."""
    base, obj, uri = plan.base, plan.objective, plan.base.tracking.uri
    check_storage(plan.storage_uri)
    live = alive_nodes()
    engine = resolve_trial_engine(plan.options.trial_engine, plan.options.gpus_per_trial, trial_engine_nodes(live))
    check_live(sweep_ask(base, plan.options.gpus_per_trial, engine), live)  # before any trial waits for a node
    tracker = None
    if plan.tracked:
        parent.connect(base.tracking.experiment)  # once, before any trial
        _open_parent(parent, plan, engine)
        assert uri is not None and parent.run_id is not None  # run_sweep resolved the uri; _open_parent opened the run
        tracker = TrialTracker(uri, parent.experiment_id, parent.run_id, plan.name, base.train.rounds, plan.swept,
                               plan.named, log_keys(plan.space))
    results = _fit(_tuner(plan, engine, parent.run_id, sources, tracker), tracker, plan.name)
    best = best_result(results, obj.metric, obj.mode, trial_order(results))
    summary = _summary(plan, results, best, engine, parent)
    if plan.tracked:
        assert parent.run_id is not None  # (as above)
        log_parent(parent.client, parent.run_id, parent.experiment_id, results, best, summary["best_config"],
                   plan.space, obj.metric, obj.mode, view_links(parent.experiment_id, plan.name))
    wanted = plan.models_wanted
    summary.update(_best_models(parent, uri, best, plan.options.register) if wanted and uri is not None
                   else {"best_models": {}, "registered": None})
    prune_models(results, best if wanted else None)
    return summary


def _best_models(parent: ParentRun, uri: str, best: Any, register: str | None) -> dict[str, Any]:
    """The best trial's models logged on its child run (``best_models``: name -> URI) and, with ``register``,
    registered (``registered``: name, version, URI, run)."""
    child = child_run(parent.client, parent.experiment_id, best)
    if child is None:
        return {"best_models": {}, "registered": None}
    models = log_best_models(parent.client, uri, best, child)
    if models:
        parent.client.set_tag(parent.run_id, "best_models", ",".join(sorted(models)))
    child = parent.client.get_run(child.info.run_id)  # with its model.* tags
    registered = register_run(parent.client, uri, register, child) if register else None
    return {"best_models": models, "registered": registered}


def _stop_reason(exc: BaseException) -> str:
    """A stopped sweep's ``failure_reason``: the message alone (:class:`SweepInterrupted`'s says how to
    continue)."""
    return str(exc) or "interrupted"


def _open_parent(parent: ParentRun, plan: SweepPlan, engine: str) -> None:
    """The sweep's parent run, opened: found again by the sweep's name to resume it, or created with the
    sweep's settings as params, its space as ``space.yaml`` and a UI view of its trials, nested under the
    plan's ``parent_run_id`` if it has one (``lcfed compare``)."""
    client, obj = parent.client, plan.objective
    query = f"tags.sweep_name = '{plan.name}' and tags.sweep_parent = 'true'"
    previous = client.search_runs([parent.experiment_id], query) if plan.options.resume else []
    if previous:  # Tune restores the scheduler it started with: the flags must agree with it
        logged = previous[0].data.params
        for key, value in {**obj.as_params(), "search": plan.options.search}.items():
            if key in logged and logged[key] != value:
                raise ConfigError(f"--{key.replace('_', '-')}", value,
                                  f"sweep {plan.name} was started with {logged[key]}: resume it with the same")
        parent.open(previous[0].info.run_id)
        return
    nested = {"mlflow.parentRunId": plan.parent_run_id} if plan.parent_run_id else {}
    tags = {"sweep_parent": "true", "sweep_name": plan.name, **run_tags(plan.base, seed="seed" not in plan.space),
            **nested}
    params = {**{f"space.{k}": describe_domain(v) for k, v in plan.space.items()}, "num_samples": str(plan.options.num_samples),
              "trial_engine": engine, "search": plan.options.search, **obj.as_params()}
    run_id = parent.create(plan.name, tags, params)
    client.log_text(run_id, yaml.safe_dump({k: space_spec(v) for k, v in plan.space.items()}, sort_keys=False),
                    "space.yaml")
    shown = [mlflow_key(m) for m in [obj.metric] + [m for m in (METRIC, "train_loss") if m != obj.metric]]
    share_view(client, parent.experiment_id, view_key(plan.name), metrics=shown, params=plan.swept,
               tags=["best_trial", "stopped_early"], ascending=obj.mode == "min", run_filter=f"tags.sweep = '{plan.name}'",
               name=f"sweep {plan.name}", charts=sweep_charts(plan.space, shown[0], f"sweep {plan.name}"),
               section=f"sweep {plan.name}")
    client.set_tag(run_id, "mlflow.note.content", view_links(parent.experiment_id, plan.name))


def sweep_charts(space: dict[str, Any], metric_key: str, section: str) -> list[dict[str, Any]]:
    """The sweep view's charts: parallel coordinates of the swept values (``log10.<key>`` where the space is
    log: :func:`~tune_jobs.sweep.space.log_keys`) and the metric, and a scatter of the metric against each
    numeric swept value (at most three)."""
    logs = log_keys(space)
    axis = {k: log_param(k) if k in logs else k for k in swept_keys(space)}
    return [parallel_chart(list(axis.values()), [metric_key], section)] + [
        scatter_chart(("PARAM", axis[k]), ("METRIC", metric_key), section) for k in numeric_keys(space)[:3]]


def view_links(exp_id: str, name: str) -> str:
    """The parent run's description: where its trials are side by side, as a table and as charts."""
    key = view_key(name)
    return (f"Trials side by side: [table]({view_path(exp_id, key)}) · [charts]({view_path(exp_id, key, True)}) "
            f"(the experiment's Views menu lists it as \"sweep {name}\").")


def view_key(name: str) -> str:
    """The MLflow UI view of a sweep's trials (:func:`lcfed.tracking.share_view`)."""
    return f"sweep-{name}"


def _tuner(plan: SweepPlan, engine: str, parent_id: str | None, sources: Any, tracker: TrialTracker | None) -> Any:
    """The sweep's Tuner: restored from the storage to resume it, else a new one. Each trial gets the base
    config and the sweep's facts beside its sampled values, and the datasets (``sources``: or their object-store
    copy, :func:`put_sources`) through the object store."""
    obj = plan.objective
    param_space = {**plan.tune_space, "__base__": to_dict(plan.base),
                   "__sweep__": {"parent_run_id": parent_id, "name": plan.name, "gpus_per_trial": plan.options.gpus_per_trial,
                                 "trial_engine": engine, "metric": obj.metric}}
    # Tune warns whenever keeping only the latest checkpoints forces a snapshot of its (small) state
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    trainable = tune.with_resources(tune.with_parameters(run_trial, sources=sources),
                                    trial_resources(plan.base, plan.options.gpus_per_trial, engine))
    progress = SweepProgress(plan.swept, obj.metric, obj.mode, obj.max_t or plan.base.train.rounds, label=plan.label)
    # verbose=0 but with -v: Tune's own status output repeats the whole base config; the progress table replaces it
    callbacks: list[Any] = [progress] if tracker is None else [tracker, progress]
    run_config = tune.RunConfig(name=plan.name, storage_path=plan.storage_uri, callbacks=callbacks,
                                verbose=tune_verbosity(),
                                checkpoint_config=tune.CheckpointConfig(num_to_keep=plan.options.keep_checkpoints))
    if plan.options.resume and tune.Tuner.can_restore(plan.exp_path):
        return tune.Tuner.restore(plan.exp_path, trainable, param_space=param_space, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(metric=obj.metric, mode=obj.mode, num_samples=plan.options.num_samples,
                                    scheduler=make_scheduler(obj),
                                    search_alg=make_search(plan.options.search, plan.base.seed,
                                                          plan.options.max_concurrent),
                                    # a local trial's process (torch imported, warm) serves the next trial
                                    reuse_actors=engine == "local"),
        run_config=run_config,
    )


def _fit(tuner: Any, tracker: TrialTracker | None, name: str) -> Any:
    """Tune's results of the sweep. A signal stops it, Tune saving its state: the unfinished trials' runs are
    closed KILLED and :class:`SweepInterrupted` says how to continue."""
    # -q: a failed trial is the sweep's one closing line (SweepFailed), not Tune's logged traceback as well
    hush = logs.quiet_logger("ray.tune", logging.CRITICAL) if not logs.progress_shown() else contextlib.nullcontext()
    with forward_signals_to_tune() as received, hush:
        results = tuner.fit()
    unfinished = len([t for t in getattr(getattr(results, "_experiment_analysis", None), "trials", None) or []
                      if t.status not in ("TERMINATED", "ERROR")]) or (tracker.unfinished() if tracker is not None else 0)
    if received or unfinished:
        reason = received[0] if received else "SIGINT"
        why = (f"{reason}: sweep stopped with {unfinished} trial(s) unfinished; the Tune state is saved: "
               f"continue with the same command plus --resume --name {name}")
        if tracker is not None:
            tracker.close_open(why)
        raise SweepInterrupted(reason, why)
    return results


def _summary(plan: SweepPlan, results: Any, best: Any, engine: str, parent: ParentRun) -> dict[str, Any]:
    """What ``lcfed sweep`` prints (and ``--json`` writes): the best trial, the runs, the failures, where
    Tune keeps the sweep and the settings it ran with."""
    obj, uri = plan.objective, plan.base.tracking.uri if plan.tracked else None
    assert uri is not None or not plan.tracked  # run_sweep resolved it
    best_cfg = {k: v for k, v in best.config.items() if not k.startswith("__")}
    failed = [error_line(str(r.error)) for r in results if r.error is not None]
    return {"best_config": best_cfg, "best_" + obj.metric: best.metrics.get(obj.metric),
            "metric": obj.metric, "mode": obj.mode, "best_trial_id": best.metrics.get("trial_id"),
            "parent_run_id": parent.run_id, "experiment_id": parent.experiment_id or None, "tracking_uri": uri,
            "trials": len(results), "errors": len(failed), "first_error": failed[0] if failed else None,
            "storage": plan.exp_path, "trial_engine": engine, "scheduler": obj.scheduler,
            "grace_period": obj.grace_period, "max_t": obj.max_t, "search": plan.options.search,
            "view": view_url(uri, parent.experiment_id, view_key(plan.name)) if uri is not None else None,
            "view_charts": view_url(uri, parent.experiment_id, view_key(plan.name), True) if uri is not None else None}


def restore_results(path: str) -> Any:
    """Tune's results of a sweep (its ``storage`` in the summary): ``tune.Tuner.restore(path, run_trial)
    .get_results()``; ``get_best_result()`` uses the sweep's metric and mode. Config keys are the space's
    (``method.mu``), besides ``__base__`` (the base config) and ``__sweep__``."""
    return tune.Tuner.restore(path, run_trial).get_results()


@contextlib.contextmanager
def forward_signals_to_tune() -> Iterator[list[str]]:
    """SIGTERM / SIGHUP become SIGINT, which Tune answers by stopping its trials and saving the
    experiment (a second one stops at once); yields the names of the signals received."""
    received: list[str] = []

    def forward(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if not received:
            print(f"lcfed: {name}: stopping the sweep and saving its state (send it again to stop now)",
                  file=sys.stderr, flush=True)
        received.append(name)
        signal.raise_signal(signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
