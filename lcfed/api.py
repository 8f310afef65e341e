"""The Python API: build a config, run it in-process or on Ray, sweep it, or hand Ray Tune a trainable.

    from lcfed import api
    cfg = api.config("configs/demo.yaml", {"method.mu": 0.5, "train.rounds": 5})
    result = api.run(cfg)                       # in-process; engine="ray" on Ray actors: same numbers
    result.final["acc_mean"], result.history    # the last evaluation, every round's metrics

    from ray import tune  # (Ray in the trial's process only)
    tuner = tune.Tuner(api.trainable(cfg), param_space={"method.mu": tune.loguniform(0.01, 1)},
                       tune_config=tune.TuneConfig(metric="acc_mean", mode="max", num_samples=4))
    results = tuner.fit()                        # your Tuner: your space, scheduler and callbacks

    api.sweep(cfg, {"method.mu": tune.loguniform(0.01, 1)}, num_samples=4)   # lcfed's own sweep (MLflow)

Ray, Tune and MLflow are imported inside the calls that use them: ``lcfed`` itself stays free of Ray,
and a process that only runs in-process never loads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lcfed import engines, numerics
from lcfed.config import ExperimentConfig, from_dict, to_dict
from lcfed.config.overrides import apply_overrides, parse_override
from lcfed.config.yaml_input import read_yaml
from lcfed.errors import require
from lcfed.run.contracts import Observer
from lcfed.run.result import RunResult

#: metrics a trainable reports on every round (NaN until the first evaluation), so that a Tune metric
#: named after one of them is in every result even when ``train.eval_every`` skips rounds
EVALUATED = ("acc_mean", "acc_weighted", "test_loss", "val_acc_mean", "val_acc_weighted", "val_loss")


def config(source: str | Path | Mapping[str, Any] | ExperimentConfig | None = None,
           overrides: Mapping[str, Any] | Iterable[str] = ()) -> ExperimentConfig:
    """A validated config from a YAML file, a nested dict or another config (``None``: the defaults), with
    ``overrides``: dotted keys to values (``{"method.mu": 0.5}``) or ``"key=value"`` strings as ``--set``
    takes them. Raises :class:`lcfed.config.ConfigError` naming the field."""
    if isinstance(source, ExperimentConfig):
        raw: Any = to_dict(source)
    elif isinstance(source, (str, Path)):
        raw = read_yaml(source, "config", "YAML experiment config")
        require(isinstance(raw, Mapping), "config", str(source), "must be a mapping of sections (name, seed, data, ...)")
    else:
        raw = source or {}
    pairs = dict(overrides) if isinstance(overrides, Mapping) else dict(parse_override(o) for o in overrides)
    return from_dict(apply_overrides(raw, pairs))


class _KeepModels:
    """Asks the engine for the final models (``RunResult.models``)."""

    wants_models = True

    def on_start(self, cfg: ExperimentConfig, fed: Any) -> None: ...

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None: ...

    def on_end(self, result: RunResult) -> None: ...


def run(cfg: ExperimentConfig, *, engine: str | None = None, track: bool = False, models: bool = False,
        observers: Sequence[Observer] = ()) -> RunResult:
    """Run one federation and return its :class:`~lcfed.run.result.RunResult`: ``final`` (the last evaluation),
    ``history`` (every round), ``assignment``, ``provenance`` and, with ``models=True``, ``models`` (the
    server's state and each device's personalized weights).

    ``engine``: ``local`` (in this process) or ``ray`` (device and server actors; a private local Ray
    unless ``engine.address`` names a cluster); default ``cfg.engine.kind``. ``track``: log the run to
    MLflow (``cfg.tracking``), as ``lcfed run`` does. ``observers``: your own (``on_start``,
    ``on_round``, ``on_end``)."""
    if engine is not None:
        require(engine in engines.ENGINES, "engine", engine, f"one of {engines.names()}")
        cfg = cfg.replace(**{"engine.kind": engine})
    chosen: list[Any] = list(observers)
    if models:
        chosen.append(_KeepModels())
    if track:
        from lcfed.tracking import MLflowObserver  # MLflow only when asked

        tracker = MLflowObserver(cfg.tracking.uri)
        tracker.check()
        chosen.append(tracker)
    return engines.run(cfg, chosen)  # Ray is imported only by its engine


def sweep(cfg: ExperimentConfig, space: Mapping[str, Any] | str | Path, **options: Any) -> dict[str, Any]:
    """``lcfed sweep`` from Python: ``space`` maps dotted fields to Tune domains (or is a search-space YAML
    file); ``options`` are :func:`tune_jobs.sweep.run.run_sweep`'s: the fields of its
    :class:`~tune_jobs.sweep.options.SweepOptions` (``num_samples``, ``scheduler``, ``search``, ``metric``,
    ``storage``, ...), ``parent_run_id`` and ``named``. With ``cfg.tracking.enabled`` every trial is an MLflow
    child run of one parent; without it, the trials are in Tune's storage only. Returns the summary (best config
    and metric, the parent run)."""
    # Tune only when asked
    from tune_jobs.sweep.options import SweepOptions
    from tune_jobs.sweep.run import run_sweep
    from tune_jobs.sweep.space import load_space

    resolved = load_space(space, cfg) if isinstance(space, (str, Path)) else dict(space)
    nesting = {k: options.pop(k) for k in ("parent_run_id", "named") if k in options}
    summary: dict[str, Any] = run_sweep(cfg, resolved, SweepOptions(**options), **nesting)  # (a lazy name: Any)
    return summary


class _Report:
    """Each round's metrics to Tune: the evaluated ones (:data:`EVALUATED`, the ``val_*`` ones with
    ``data.val_fraction``) carried forward between evaluations, and ``round``, the round's index from 0
    as in ``RunResult.history`` and MLflow's steps (rounds completed = ``round + 1``, as the CLI prints
    them; Tune's own ``training_iteration`` counts from 1)."""

    def __init__(self) -> None:
        self.last = dict.fromkeys(EVALUATED, math.nan)

    def on_start(self, cfg: ExperimentConfig, fed: Any) -> None: ...

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        from ray import tune  # (Ray in the trial's process only)

        self.last.update({k: float(v) for k, v in metrics.items() if k in EVALUATED})
        tune.report({**{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, **self.last,
                     "round": rnd})

    def on_end(self, result: RunResult) -> None: ...


def trainable(base: ExperimentConfig | Mapping[str, Any] | str | Path, *, track: bool = False
              ) -> Callable[[dict[str, Any]], None]:
    """A Ray Tune function trainable for your own ``tune.Tuner``: each trial runs ``base`` with the trial's
    ``param_space`` entries (dotted config fields, e.g. ``"method.mu"``) in the trial's process and
    reports every round (all metrics, ``round`` from 0 as in ``RunResult.history``; accuracies and
    validation metrics carried forward between evaluations).
    ``track``: each trial also logs its own MLflow run (``base.tracking``). Give trials CPUs with
    ``tune.with_resources``; a trial trains on as many threads as it holds CPUs."""
    cfg = base if isinstance(base, ExperimentConfig) else config(base)

    def train(trial: dict[str, Any]) -> None:
        import ray  # in the trial's process: lcfed.api imports no Ray at its top (docs/python-api.md)

        from lcfed.engines.local import LocalEngine  # (the same: torch work in the trial)
        from lcfed.run.sources import load  # (the same)

        chosen = config(cfg, {k: v for k, v in trial.items()}).replace(**{"engine.kind": "local"})
        numerics.activate(chosen.engine.numerics)  # before load(), the trial's first tensor op
        cpus = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
        engine = LocalEngine(chosen, load(chosen), cpus)
        observers: list[Any] = [_Report()]
        if track:
            from lcfed.tracking import MLflowObserver, run_name  # MLflow only for a tracked trial

            observers.append(MLflowObserver(chosen.tracking.uri, run_name=run_name(chosen, trial)))
        try:
            engine.run(observers)
        finally:
            engine.close()

    train.__name__ = train.__qualname__ = f"lcfed_{cfg.name}"
    return train
