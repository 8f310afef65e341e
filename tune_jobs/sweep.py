"""``lcfed sweep``: Ray Tune over any config field, each trial a full federation.

A trial runs its federation one of two ways (``--trial-engine``, see :func:`resolve_trial_engine`):
``local``, the in-process engine inside the trial's own process (one bundle: the trial's CPUs and its
GPU share; trial processes are reused from trial to trial, so torch is imported once per slot), or
``ray``, a placement group with a small bundle for the trial's driver and one bundle per device actor
(with its fraction of the trial's GPUs; the ServerActor takes no CPU), as a multi-node cluster with
GPU workers needs. Every round is reported to Tune (so ASHA can stop poor trials early); the trial
checkpoint is the engine's snapshot, so ``--resume`` continues interrupted trials bit-identically.
MLflow gets one parent run per sweep and one child run per trial; the parent gets the best config
and summary plots.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lcfed import numerics
from lcfed.config import (
    NAME_RULE,
    ConfigError,
    ExperimentConfig,
    accepts,
    apply_overrides,
    check_output_dir,
    check_output_file,
    field_types,
    flatten,
    from_dict,
    load_config,
    read_yaml,
    require,
    safe_name,
    to_dict,
    type_name,
)
from lcfed.engine import Stopped
from tune_jobs.options import config_options, examples
from tune_jobs.sweep_progress import progress_callback, short_names, trial_index

SPACES_DIR = Path(__file__).resolve().parent / "spaces"
METRIC = "acc_mean"  # the default --metric

#: the per-round metrics a trial reports (``lcfed.engine`` and ``lcfed.metrics``) -> the better direction
#: (None: no natural one, --mode must be given). Accuracies exist on evaluation rounds (``train.eval_every``,
#: carried forward to the rounds between); num_clusters / label_homogeneity only for clustered methods, ari
#: only where the clusters can express the true groups, val_* only with a validation split
#: (``data.val_fraction``): the metrics to tune on, leaving the test split to the final report.
METRICS: dict[str, str | None] = {
    "acc_mean": "max", "acc_weighted": "max", "acc_p10": "max", "acc_p90": "max", "acc_std": "min",
    "test_loss": "min", "train_loss": "min", "label_homogeneity": "max", "ari": "max", "coverage": "max",
    "num_clusters": None, "bytes_up": "min", "bytes_down": "min", "bytes_up_total": "min",
    "bytes_down_total": "min", "sim_comm_seconds": "min", "sim_compute_seconds": "min", "sim_seconds_total": "min",
    "round_seconds": "min", "val_acc_mean": "max", "val_acc_weighted": "max", "val_loss": "min",
    # the held-out devices (data.holdout_fraction) once joined: reported on the last round only
    "acc_new_mean": "max", "acc_new_weighted": "max",
}
SCHEDULERS = ("asha", "hyperband", "fifo")

#: search-space file keywords -> how to build the Tune domain from the listed arguments
DOMAINS = {
    "loguniform": lambda tune, a: tune.loguniform(*a),
    "uniform": lambda tune, a: tune.uniform(*a),
    "choice": lambda tune, a: tune.choice(list(a)),
    "grid": lambda tune, a: tune.grid_search(list(a)),
    "randint": lambda tune, a: tune.randint(*a),
    "quniform": lambda tune, a: tune.quniform(*a),
    "qrandint": lambda tune, a: tune.qrandint(*a),
}
#: the domains whose draws are floats (Tune's Float domains) and those whose draws are integers
FLOAT_DOMAINS = ("uniform", "loguniform", "quniform")
INTEGER_DOMAINS = ("randint", "qrandint")


def load_space(path: str | Path, base: ExperimentConfig) -> dict[str, Any]:
    """Read a search space: ``{dotted.field: {loguniform: [lo, hi]} | {choice: [...]} | value}``.

    Each key must be a config field; each sampled value is validated with the base config before
    the sweep starts (the type of a range's draws, bounds of ranges, every element of choices).
    """
    from ray import tune

    p = Path(path)
    if not p.exists() and (SPACES_DIR / p).exists():
        p = SPACES_DIR / p
    require(p.is_file(), "--space", str(path), f"must be a YAML file (bundled spaces: {sorted(x.name for x in SPACES_DIR.glob('*.yaml'))})")
    raw = read_yaml(p, "--space", "search-space YAML file")
    require(isinstance(raw, Mapping), "--space", str(path), "must map config fields to domains")
    require(len(raw) > 0, "--space", str(path), "maps no field ({}): a sweep needs at least one field")
    space: dict[str, Any] = {}
    base_raw = to_dict(base)
    flat = flatten(base)
    field_type = field_types(base)
    for key, spec in raw.items():
        require(isinstance(key, str) and (key in flat or key.startswith("method.")), f"space.{key}", spec,
                "keys must be dotted config fields, e.g. method.mu or train.lr (see `lcfed config`)")
        if isinstance(spec, Mapping):
            require(len(spec) == 1 and next(iter(spec)) in DOMAINS, f"space.{key}", dict(spec),
                    f"one of {sorted(DOMAINS)} with its arguments, e.g. {{loguniform: [0.001, 1]}}")
            kind, args = next(iter(spec.items()))
            values = domain_extremes(f"space.{key}", kind, args)
            check_draw_type(key, dict(spec), kind, field_type.get(key))
            for v in values:  # every reachable extreme must make a valid config
                try:
                    from_dict(apply_overrides(base_raw, {key: v}))
                except ConfigError as exc:
                    raise ConfigError(f"space.{key}", v, f"gives an invalid config: {exc}") from None
            space[key] = DOMAINS[kind](tune, args)
        else:
            from_dict(apply_overrides(base_raw, {key: spec}))
            space[key] = spec
    return space


TRIAL_ENGINES = ("auto", "local", "ray")


def resolve_trial_engine(choice: str, gpus_per_trial: float, nodes: int) -> str:
    """The engine every trial of the sweep runs: ``local`` or ``ray``.

    ``auto`` is ``local`` when the whole federation fits one trial process on one node: the Ray
    cluster has a single node and a trial takes at most one GPU (one process drives one GPU).
    Otherwise ``ray``: on a multi-node cluster a trial's device actors go where the GPUs are
    (e.g. GPU workers beside a CPU head), and more than one GPU per trial needs several actors.
    """
    require(choice in TRIAL_ENGINES, "--trial-engine", choice, f"one of {list(TRIAL_ENGINES)}")
    if choice == "local":
        require(gpus_per_trial <= 1, "--gpus-per-trial", gpus_per_trial,
                "must be <= 1 with --trial-engine local (a trial in one process drives one GPU); "
                "use --trial-engine ray for more")
        return "local"
    if choice == "ray":
        return "ray"
    return "local" if nodes == 1 and gpus_per_trial <= 1 else "ray"


@dataclass(frozen=True)
class Objective:
    """What the sweep optimises and how trials are stopped early: the scheduler, the best trial and the
    parent run's summary all use this one ``metric`` / ``mode``."""

    metric: str = METRIC
    mode: str = "max"
    scheduler: str = "asha"
    grace_period: int | None = None  # asha / hyperband: rounds before a trial may be stopped (or paused)
    max_t: int | None = None  # asha / hyperband: rounds a trial may run at most

    def as_params(self) -> dict[str, str]:
        return {k: str(v) for k, v in vars(self).items() if v is not None}


def resolve_objective(rounds: int, metric: str = METRIC, mode: str | None = None, scheduler: str = "asha",
                      grace_period: int | None = None, max_t: int | None = None) -> Objective:
    """Check the sweep's metric, mode and scheduler flags against ``train.rounds`` and fill the defaults.

    ``mode``: the metric's natural direction unless given (max for accuracies, label_homogeneity, ari and
    coverage; min for losses, acc_std, bytes and seconds). ``max_t``: ``rounds``. ``grace_period``:
    ``max(1, max_t // 2)``: ASHA and HyperBand compare trials no earlier than half-way, where early
    rounds' near-ties (0.4290 vs 0.4302 at round 2) no longer decide which trial stops.
    """
    require(metric in METRICS, "--metric", metric, f"a per-round metric the trials report: one of {sorted(METRICS)}")
    require(mode in (None, "max", "min"), "--mode", mode, "max or min")
    mode = mode or METRICS[metric]
    require(mode is not None, "--mode", mode, f"must be given for --metric {metric} (max or min: it has no natural "
            "direction)")
    require(scheduler in SCHEDULERS, "--scheduler", scheduler, f"one of {list(SCHEDULERS)}")
    if scheduler == "fifo":
        require(grace_period is None, "--grace-period", grace_period, "only with --scheduler asha or hyperband "
                "(fifo never stops a trial)")
        require(max_t is None, "--max-t", max_t, "only with --scheduler asha or hyperband (fifo runs every trial "
                "for train.rounds)")
        return Objective(metric, str(mode), scheduler)
    max_t = rounds if max_t is None else max_t
    require(isinstance(max_t, int) and 1 <= max_t <= rounds, "--max-t", max_t,
            f"must be between 1 and train.rounds ({rounds})")
    grace = max(1, max_t // 2) if grace_period is None else grace_period
    require(isinstance(grace, int) and 1 <= grace <= max_t, "--grace-period", grace_period,
            f"must be between 1 and --max-t ({max_t}) rounds")
    return Objective(metric, str(mode), scheduler, grace, max_t)


def make_scheduler(obj: Objective) -> Any:
    """Tune's scheduler for the objective (metric and mode come from the TuneConfig)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler

    if obj.scheduler == "asha":
        return ASHAScheduler(time_attr="training_iteration", max_t=obj.max_t, grace_period=obj.grace_period)
    if obj.scheduler == "hyperband":
        sched = HyperBandScheduler(time_attr="training_iteration", max_t=obj.max_t)
        # Tune's HyperBand has no grace period: its brackets' first rung is max_t / 3^s rounds; no earlier
        # than grace_period here, so no trial is paused or stopped before it
        first_rung = sched._get_r0
        sched._get_r0 = lambda s: max(int(obj.grace_period or 1), first_rung(s))
        return sched
    return FIFOScheduler()


#: ``--search``: Tune's BasicVariantGenerator (random samples, grid points expanded), the same with every
#: swept field enumerated, or a model-based searcher from the ``lcfed[search]`` extra
SEARCHES = ("random", "grid", "optuna", "hyperopt")
SEARCH_LIBRARIES = {"optuna": "optuna", "hyperopt": "hyperopt"}


def check_search(search: str, space: Mapping[str, Any]) -> dict[str, Any]:
    """The Tune ``param_space`` for ``--search`` (checked before anything is started or created).

    ``grid``: every swept field is ``grid`` or ``choice`` (a choice is enumerated too). ``optuna`` /
    ``hyperopt``: no ``grid`` field (they sample, they do not enumerate), at least one range or choice, and
    the library installed (``pip install 'lcfed[search]'``)."""
    import importlib.util

    from ray import tune
    from ray.tune.search.sample import Categorical, Domain

    require(search in SEARCHES, "--search", search, f"one of {list(SEARCHES)}")
    grids = [k for k, v in space.items() if isinstance(v, Mapping) and set(v) == {"grid_search"}]
    domains = [k for k, v in space.items() if isinstance(v, Domain)]
    if search == "grid":
        for key in domains:
            require(isinstance(space[key], Categorical), f"space.{key}", describe_domain(space[key]),
                    "with --search grid every swept field is grid([...]) or choice([...]); a range needs "
                    "--search random, optuna or hyperopt")
        return {k: tune.grid_search(list(v.categories)) if isinstance(v, Categorical) else v
                for k, v in space.items()}
    if search in SEARCH_LIBRARIES:
        if grids:
            raise ConfigError(f"space.{grids[0]}", describe_domain(space[grids[0]]),
                              f"--search {search} samples ranges and choices; grid([...]) needs --search grid or "
                              "random (or write it as choice([...]))")
        require(bool(domains), "--space", sorted(space), f"--search {search} needs at least one range or choice")
        lib = SEARCH_LIBRARIES[search]
        require(importlib.util.find_spec(lib) is not None, "--search", search,
                f"needs the {lib} package: pip install 'lcfed[search]' (or pip install {lib})")
    return dict(space)


def make_search(search: str, seed: int, max_concurrent: int = 0) -> Any:
    """Tune's search algorithm for ``--search``, seeded by the base config's seed so a sweep proposes the
    same trials again, running at most ``max_concurrent`` trials at once (0: as the resources allow);
    metric and mode come from the TuneConfig. ``random`` and ``grid`` are Tune's BasicVariantGenerator."""
    if search in ("random", "grid"):
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(max_concurrent=max_concurrent, random_state=seed)
    from ray.tune.search import ConcurrencyLimiter

    if search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        searcher: Any = OptunaSearch(seed=seed)
    elif search == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        searcher = HyperOptSearch(random_state_seed=seed)
    else:
        raise ValueError(f"unknown search {search!r}")
    return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent) if max_concurrent else searcher


def space_spec(domain: Any) -> Any:
    """A search-space entry (a Tune domain, a grid or a value) in the ``--space`` file's form."""
    from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Quantized

    if isinstance(domain, Mapping) and set(domain) == {"grid_search"}:
        return {"grid": list(domain["grid_search"])}
    if isinstance(domain, Categorical):
        return {"choice": list(domain.categories)}
    if isinstance(domain, (Float, Integer)):
        sampler, q = domain.get_sampler(), None
        if isinstance(sampler, Quantized):
            sampler, q = sampler.sampler, sampler.q
        log = isinstance(sampler, LogUniform)
        if isinstance(domain, Integer):
            kind = "lograndint" if log else "randint"
        else:
            kind = "loguniform" if log else "uniform"
        if q is not None:
            kind = "q" + kind
        return {kind: [domain.lower, domain.upper] + ([q] if q is not None else [])}
    return domain


def describe_domain(domain: Any) -> str:
    """``loguniform(0.001, 1)``, ``choice([2, 4])``, ``grid([0.05, 0.2])`` or the fixed value."""
    spec = space_spec(domain)
    if isinstance(spec, dict) and len(spec) == 1:
        kind, args = next(iter(spec.items()))
        if isinstance(args, list) and kind not in ("choice", "grid"):
            return f"{kind}({', '.join(f'{a:g}' if isinstance(a, float) else str(a) for a in args)})"
        return f"{kind}({args})"
    return str(spec)


def swept_keys(space: Mapping[str, Any]) -> list[str]:
    """The space's keys that vary between trials (not fixed values)."""
    return [k for k, v in space.items() if space_spec(v) is not v]


def _short(v: Any) -> str:
    return f"{v:.2g}" if isinstance(v, float) else str(v)


def child_name(method: str, values: Mapping[str, Any]) -> str:
    """``lcfed mu=0.031 lam=0.2``: the method and each swept value (last part of its key, 2 digits)."""
    keys = short_names(list(values))
    return " ".join([method] + [f"{k}={_short(v)}" for k, v in zip(keys, values.values(), strict=True)])


def view_key(name: str) -> str:
    """The MLflow UI view of a sweep's trials (:func:`lcfed.tracking.share_view`)."""
    return f"sweep-{name}"


def trial_layout(cfg: ExperimentConfig, gpus_per_trial: float) -> tuple[int, float, float]:
    """(device actors, CPUs per actor, GPUs per actor) of one trial on the Ray engine."""
    n = cfg.engine.num_actors or 1
    return n, cfg.engine.cpus_per_actor, gpus_per_trial / n


def local_trial_cpus(cfg: ExperimentConfig) -> int:
    """CPUs a local-engine trial reserves: ``engine.workers`` training threads (at least one), each
    running ``engine.torch_threads`` intra-op threads."""
    return cfg.engine.torch_threads * max(1, cfg.engine.workers)


def trial_resources(cfg: ExperimentConfig, gpus_per_trial: float, engine: str = "ray") -> Any:
    from ray import tune

    if engine == "local":
        return tune.PlacementGroupFactory(
            [{"CPU": local_trial_cpus(cfg), **({"GPU": gpus_per_trial} if gpus_per_trial > 0 else {})}])
    n, cpu, gpu = trial_layout(cfg, gpus_per_trial)
    bundle = {"CPU": cpu, **({"GPU": gpu} if gpu > 0 else {})}
    return tune.PlacementGroupFactory([{"CPU": 0.5}] + [dict(bundle) for _ in range(n)])


#: the key of a Tune report holding what the driver logs to MLflow (nested: Tune's tables skip it)
REPORT_KEY = "lcfed"


class TuneReporter:
    """Reports every round to Tune, attaching the engine's checkpoint on rounds that wrote one.

    Besides the sweep's metric at the top level (its last value: accuracies exist on evaluation rounds
    only; NaN before the first), each report carries under ``lcfed`` the round's
    metrics, the cluster assignment and (first report) the federation's facts: the driver's
    :class:`TrialTracker` logs them to MLflow, so trial processes never talk to a tracking server.
    The last round is reported from ``on_end``: Tune ends a trial that reached its last iteration
    from inside ``report`` (``SystemExit``).
    """

    def __init__(self, cfg: ExperimentConfig, placement: dict[str, Any] | None = None, metric: str = METRIC) -> None:
        self.cfg = cfg
        self.metric = metric
        self.value = float("nan")
        self.facts: dict[str, str] | None = None
        self.provenance: dict[str, str] | None = None
        self.placement = placement
        self.pending: tuple[dict[str, Any], bool] | None = None

    def on_start(self, cfg: ExperimentConfig, fed: Any) -> None:
        from lcfed.tracking import federation_facts

        self.facts = federation_facts(fed)
        self.provenance = numerics.provenance()

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        self.value = float(metrics.get(self.metric, self.value))
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        data: dict[str, Any] = {"metrics": scalars}
        if stats.assignment is not None:
            data["assignment"] = [int(c) for c in stats.assignment]
        if self.facts is not None:
            data["federation"], self.facts = self.facts, None
        if self.placement is not None:
            data["placement"], self.placement = self.placement, None
        if self.provenance is not None:
            data["provenance"], self.provenance = self.provenance, None
        report = {self.metric: self.value, "round": rnd, REPORT_KEY: data}
        ck = self.cfg.checkpoint
        saved = bool(ck.dir) and ((rnd + 1) % ck.every == 0 or rnd == self.cfg.train.rounds - 1)
        if rnd == self.cfg.train.rounds - 1:
            self.pending = (report, saved)
        else:
            self._report(report, saved)

    def on_end(self, result: Any) -> None:
        if self.pending is not None:
            report, saved = self.pending
            # the last evaluation per counted device, as a JSON text (one column, however many devices): what
            # `lcfed compare` pairs device by device
            report[REPORT_KEY]["devices"] = json.dumps(device_accuracies(result))
            if getattr(result, "provenance", None):  # the engine's record, with its actors' kernels and GPUs
                report[REPORT_KEY]["provenance"] = result.provenance
            self._report(report, saved)

    def _report(self, metrics: dict[str, Any], saved: bool) -> None:
        from ray import tune

        if saved:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(self.cfg.checkpoint.dir))
        else:
            tune.report(metrics)


def device_accuracies(result: Any) -> dict[str, float]:
    """Device id -> test accuracy of the run's last evaluation, over the devices ``acc_mean`` counts."""
    trained = getattr(result, "trained", None)
    return {str(d): r.correct / r.total for d, r in sorted(result.evaluation.items())
            if r.total and (trained is None or bool(trained[d]))}


def trial_config(config: dict[str, Any], trial_id: str) -> ExperimentConfig:
    """The experiment config of one trial: the base config with the trial's sampled values."""
    base, meta = config["__base__"], config["__sweep__"]
    overrides = {k: v for k, v in config.items() if not k.startswith("__")}
    run_name = {"tracking.run_name": f"{meta['name']}-{trial_id}"}
    if meta.get("trial_engine", "ray") == "local":  # sweeps from before --trial-engine ran on Ray
        return from_dict(apply_overrides(base, {**overrides, "engine.kind": "local", **run_name}))
    n, _, gpu = trial_layout(from_dict(base), meta["gpus_per_trial"])
    return from_dict(apply_overrides(base, {**overrides, "engine.num_actors": n, "engine.gpus_per_actor": gpu,
                                            "engine.kind": "ray", **run_name}))


def run_trial(config: dict[str, Any], sources: dict[Any, Any] | None = None) -> None:
    """The Tune trainable: one federation with the trial's overrides of the base config, on the
    engine its ``engine.kind`` names (:func:`resolve_trial_engine` chose it for the sweep).

    ``sources`` are the datasets the sweep's driver loaded (through ``tune.with_parameters``, so the
    object store carries them): the node running the trial reads no data files.
    """
    import shutil

    import ray
    from ray import tune

    from lcfed import checkpoint
    from lcfed.federation import load, source_key

    ctx = tune.get_context()
    work = tempfile.mkdtemp(prefix="lcfed-trial-")
    try:
        cfg = trial_config(config, ctx.get_trial_id()).replace(**{"checkpoint.dir": work})
        dataset = load(cfg, (sources or {}).get(source_key(cfg)))
        resume = None
        prior = tune.get_checkpoint()
        if prior is not None:
            with prior.as_directory() as d:
                resume = checkpoint.load(Path(d) / "latest.pt")
        fed = _trial_federation(cfg, dataset)
        try:
            placement = {"engine": cfg.engine.kind, "trial_node": ray.get_runtime_context().get_node_id(),
                         **fed.placement()}
            if cfg.engine.kind == "local":  # the trial's own GPU share (actors report theirs)
                placement.update(gpus=config["__sweep__"]["gpus_per_trial"],
                                 gpu_ids=[str(g) for g in ray.get_gpu_ids()])
            fed.run([TuneReporter(cfg, placement, config["__sweep__"].get("metric", METRIC))], resume)
        finally:
            fed.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)  # Tune has persisted every reported checkpoint


def _trial_federation(cfg: ExperimentConfig, dataset: Any) -> Any:
    """The trial's federation on the engine ``engine.kind`` names: in this (the trial's) process, with
    one training thread per ``torch_threads`` CPUs the trial holds; or on device actors and a server
    actor inside the trial's placement group."""
    if cfg.engine.kind == "local":
        from lcfed.runner import LocalFederation

        return LocalFederation(cfg, dataset, local_trial_cpus(cfg))
    from actors.engine import RayFederation

    n, gpu = cfg.engine.num_actors, cfg.engine.gpus_per_actor
    return RayFederation(cfg, resources=(n * cfg.engine.cpus_per_actor, n * gpu), dataset=dataset)


def _trial_tracker(uri: str, exp_id: str, parent_id: str, sweep_name: str, rounds: int,
                   swept: Sequence[str] = ()) -> Any:
    from ray.tune import Callback

    from lcfed.engine import RunResult
    from lcfed.tracking import MLflowObserver

    class TrialTracker(Callback):
        """Logs every trial to MLflow from the sweep's driver, out of the trials' Tune reports: a
        child run per trial (params, per-round metrics, assignments, plots, status)."""

        def __init__(self) -> None:
            self.runs: dict[str, MLflowObserver] = {}
            self.history: dict[str, list[dict[str, float]]] = {}
            self.assignment: dict[str, np.ndarray] = {}
            self.last_round: dict[str, int] = {}
            self.names: set[str] | None = None  # child run names in use (unique within the sweep)

        def _name(self, client: Any, trial: Any, cfg: ExperimentConfig) -> str:
            """``<method> <param>=<value> ...`` of the swept values; `` #<trial index>`` where two round alike."""
            if self.names is None:
                children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent_id}'")
                self.names = {r.info.run_name for r in children}
            name = child_name(cfg.method.name, {k: trial.config[k] for k in swept if k in trial.config})
            if name in self.names:
                index = trial.trial_id.rsplit("_", 1)[-1]
                name = f"{name} #{int(index) if index.isdigit() else index}"
            self.names.add(name)
            return name

        def _run(self, trial: Any, facts: dict[str, str]) -> MLflowObserver:
            tid = trial.trial_id
            if tid not in self.runs:
                import mlflow

                client = mlflow.MlflowClient(tracking_uri=uri)
                query = f"tags.tune_trial_id = '{tid}' and tags.sweep = '{sweep_name}'"
                earlier = client.search_runs([exp_id], query)  # a resumed sweep continues the trial's run
                overrides = {k: v for k, v in trial.config.items() if not k.startswith("__")}
                tags = {"tune_trial_id": tid, "sweep": sweep_name, **{f"space.{k}": str(v) for k, v in overrides.items()}}
                obs = MLflowObserver(uri, parent_run_id=parent_id, tags=tags,
                                     resume_run_id=earlier[0].info.run_id if earlier else None)
                cfg = trial_config(trial.config, tid)
                if not earlier:
                    cfg = cfg.replace(**{"tracking.run_name": self._name(client, trial, cfg)})
                obs.start(cfg, facts)
                self.runs[tid] = obs
                self.history[tid] = []
            return self.runs[tid]

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            data = result.get(REPORT_KEY)
            if not isinstance(data, dict):
                return
            obs = self._run(trial, data.get("federation") or {})
            if isinstance(data.get("provenance"), dict):
                obs.log_provenance(data["provenance"])
            if isinstance(data.get("placement"), dict):
                place = data["placement"]
                obs.client.set_tag(obs.run_id, "placement.trial_node", place["trial_node"])
                device_nodes = {a["node_id"] for a in place.get("device_actors", ())} or {place["trial_node"]}
                obs.client.set_tag(obs.run_id, "placement.device_nodes", ",".join(sorted(device_nodes)))
                obs.client.log_dict(obs.run_id, place, "placement.json")
            rnd = int(result.get("round", 0))
            metrics = dict(data.get("metrics", {}))
            assignment = np.asarray(data["assignment"], dtype=np.int64) if "assignment" in data else None
            obs.log_round(rnd, metrics, assignment)
            self.history[trial.trial_id].append({**metrics, "round": rnd})
            self.last_round[trial.trial_id] = rnd
            if assignment is not None:
                self.assignment[trial.trial_id] = assignment

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            tid = trial.trial_id
            if tid not in self.runs:
                return
            obs, hist = self.runs[tid], self.history[tid]
            evals = [h for h in hist if METRIC in h]
            final = dict(evals[-1] if evals else hist[-1] if hist else {})
            obs.on_end(RunResult(final=final, history=hist, assignment=self.assignment.get(tid)))
            if self.last_round.get(tid, -1) < rounds - 1:  # the scheduler stopped it: not a failure
                obs.client.set_tag(obs.run_id, "stopped_early", "true")
                obs.client.set_tag(obs.run_id, "stopped_at_round", str(self.last_round.get(tid, -1)))

        def close_open(self, reason: str) -> None:
            """Mark the runs of trials the sweep left unfinished KILLED, with the reason."""
            for obs in self.runs.values():
                if not obs.finished:
                    obs.on_error(KeyboardInterrupt(reason))
                    obs.finished = True

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            obs = self._run(trial, {})
            obs.client.set_tag(obs.run_id, "failure_reason", _trial_error(trial)[-5000:])
            obs.client.set_terminated(obs.run_id, "FAILED")
            obs.finished = True

    return TrialTracker()


def _trial_error(trial: Any) -> str:
    """The trial's exception as ``module.Error: message`` (the last one its traceback names)."""
    text = ""
    if trial.error_file and Path(trial.error_file).is_file():
        text = Path(trial.error_file).read_text(errors="replace")
    return _error_line(text)


def _error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines()]
    named = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)(\(\w+\))?: ", ln)]
    return named[-1] if named else (text.strip().splitlines() or ["trial failed"])[-1]


def _join(storage: str, name: str) -> str:
    """``storage``/``name`` for a path or a URI (a query string stays at the end)."""
    head, sep, query = storage.partition("?")
    return f"{head.rstrip('/')}/{name}{sep}{query}"


def storage_location(storage: str | Path) -> str:
    """A URI (``s3://``, ``gs://``, ``file://``, ...) goes to Tune as it is; a path is made absolute."""
    text = str(storage)
    if "://" in text:
        return text
    return str(Path(text).expanduser().resolve())


def check_storage(storage_uri: str) -> None:
    """On a multi-node cluster, trials on other nodes write their checkpoints to the storage: a plain
    local path is this node's disk only. ``file://`` says the path is a filesystem every node mounts."""
    import ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    require(nodes == 1 or "://" in storage_uri, "--storage", storage_uri,
            f"must be a URI every one of the cluster's {nodes} nodes reaches (s3://bucket/prefix, gs://...), "
            "or file:///path on a filesystem all nodes mount")


def load_sources(base: ExperimentConfig, space: dict[str, Any]) -> dict[Any, Any]:
    """Every dataset the sweep's trials may use, loaded once here (the driver) for all of them."""
    from lcfed.federation import load_source, source_key

    keys = ("data.dataset", "data.data_dir", "data.download")
    choices: list[dict[str, Any]] = [{}]
    for key in keys:
        if key not in space:
            continue
        dom = space[key]
        if isinstance(dom, dict) and "grid_search" in dom:
            values = list(dom["grid_search"])
        elif hasattr(dom, "categories"):
            values = list(dom.categories)
        elif isinstance(dom, (str, bool)):
            values = [dom]
        else:
            raise ConfigError(f"space.{key}", str(dom), "must be a value, a choice or a grid (the driver loads each dataset)")
        choices = [{**c, key: v} for c in choices for v in values]
    sources = {}
    for c in choices:
        cfg = base.replace(**c) if c else base
        key = source_key(cfg)
        if key not in sources:
            sources[key] = load_source(cfg)
    return sources


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def domain_extremes(field_name: str, kind: str, args: Any) -> list[Any]:
    """Check a domain's arguments by type and bounds; return the values a trial can reach at the
    extremes (every element of a choice), which must each make a valid config."""
    if kind in ("choice", "grid"):
        require(isinstance(args, list) and len(args) > 0, field_name, {kind: args},
                f"{kind} takes a non-empty list of values, e.g. {{{kind}: [0.01, 0.1]}}")
        return list(args)
    quantized = kind in ("quniform", "qrandint")
    shape = {"loguniform": "[low, high] with 0 < low < high", "uniform": "[low, high] with low < high",
             "quniform": "[low, high, q] with low < high, q > 0 and low, high multiples of q",
             "randint": "[low, high] integers with low < high (high excluded)",
             "qrandint": "[low, high, q] integers with low < high, q >= 2 (q = 1 is randint) and low, high "
                         "multiples of q (high included)"}[kind]
    ok = isinstance(args, list) and len(args) == (3 if quantized else 2) and all(_number(v) for v in args)
    if ok and kind in INTEGER_DOMAINS:
        ok = all(isinstance(v, int) for v in args)
    if ok:
        low, high = args[0], args[1]
        ok = low < high and (kind != "loguniform" or low > 0)
        if quantized:  # bounds on the grid: Tune refuses others (quniform) or moves them inwards (qrandint)
            q = args[2]
            ok = ok and q > (1 if kind == "qrandint" else 0) and all(
                math.isclose(b / q, round(b / q)) for b in (low, high))
    require(ok, field_name, {kind: args}, f"{kind} takes {shape} (finite numbers; a single value needs no domain)")
    return [args[0], args[1] - 1] if kind == "randint" else [args[0], args[1]]


def check_draw_type(key: str, spec: Any, kind: str, annotation: Any) -> None:
    """Refuse a range drawing floats for a field that takes none (``annotation``; None for no such field,
    which the extremes check refuses): bounds such as ``uniform: [1, 10]`` make valid configs, but every
    trial would die on its first draw (2.7 local steps)."""
    if kind not in FLOAT_DOMAINS or annotation is None or accepts(annotation, 0.5):
        return
    fix = ("use randint: [low, high] or qrandint: [low, high, q] (integer draws), or choice: [...]"
           if accepts(annotation, 1) else "use choice: [...]")
    raise ConfigError(f"space.{key}", spec, f"{kind} draws floats, but {key} takes {type_name(annotation)}: {fix}")


def run_sweep(
    base: ExperimentConfig,
    space: dict[str, Any],
    *,
    num_samples: int = 1,
    scheduler: str = "asha",
    max_concurrent: int = 0,
    gpus_per_trial: float = 0.0,
    name: str | None = None,
    storage: str | Path = "~/lcfed-sweeps",
    resume: bool = False,
    trial_engine: str = "auto",
    metric: str = METRIC,
    mode: str | None = None,
    grace_period: int | None = None,
    max_t: int | None = None,
    search: str = "random",
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Run (or resume) a sweep; return the best trial's config, metric and the MLflow parent run.

    ``trial_engine``: ``auto``, ``local`` or ``ray`` (:func:`resolve_trial_engine`). ``metric``, ``mode``,
    ``scheduler``, ``grace_period``, ``max_t``: :func:`resolve_objective` (one metric and mode for the
    scheduler, the best trial and the parent run). ``search``: :func:`check_search`. A resumed sweep keeps
    the objective and search it started with. ``parent_run_id``: the sweep's run nests under it (``lcfed
    compare``).
    """
    import ray
    from ray import tune

    from actors.engine import alive_nodes, ensure_ray
    from lcfed.tracking import (
        RunGuard,
        get_or_create_experiment,
        open_client,
        resolve_tracking_uri,
        share_view,
        view_url,
    )

    obj = resolve_objective(base.train.rounds, metric, mode, scheduler, grace_period, max_t)
    tune_space = check_search(search, space)
    uri = resolve_tracking_uri(base.tracking.uri)
    base = base.replace(**{"tracking.uri": uri, "tracking.enabled": True})
    name = name or f"{base.name}-sweep"
    storage_uri = storage_location(storage)
    require(trial_engine in TRIAL_ENGINES, "--trial-engine", trial_engine, f"one of {list(TRIAL_ENGINES)}")
    sources = load_sources(base, space)  # a missing dataset fails here, before any run or trial exists
    started = ensure_ray(base.engine)
    try:
        check_storage(storage_uri)
        engine = resolve_trial_engine(trial_engine, gpus_per_trial, len(alive_nodes()))
    except BaseException:
        if started:
            ray.shutdown()
        raise
    client = open_client(uri)  # a fresh sqlite store is created under its lock
    exp_id = get_or_create_experiment(client, base.tracking.experiment, uri)  # once, before any trial
    parent_tag = f"tags.sweep_name = '{name}' and tags.sweep_parent = 'true'"
    previous = client.search_runs([exp_id], parent_tag) if resume else []
    nested = {"mlflow.parentRunId": parent_run_id} if parent_run_id else {}
    parent = previous[0] if previous else client.create_run(
        exp_id, run_name=name, tags={"sweep_parent": "true", "sweep_name": name, "method": base.method.name, **nested})
    parent_id = parent.info.run_id
    if previous:  # Tune restores the scheduler it started with: the flags must agree with it
        logged = previous[0].data.params
        for key, value in {**obj.as_params(), "search": search}.items():
            if key in logged and logged[key] != value:
                if started:
                    ray.shutdown()
                raise ConfigError(f"--{key.replace('_', '-')}", value,
                                  f"sweep {name} was started with {logged[key]}: resume it with the same")
    guard = RunGuard(uri, parent_id, f"; the Tune state is saved: continue with --resume --name {name}")
    if not previous:
        from mlflow.entities import Param

        params = {**{f"space.{k}": describe_domain(v) for k, v in space.items()}, "num_samples": str(num_samples),
                  "trial_engine": engine, "search": search, **obj.as_params()}
        client.log_batch(parent_id, params=[Param(k, v[:6000]) for k, v in params.items()])
        client.log_text(parent_id, yaml.safe_dump({k: space_spec(v) for k, v in space.items()}, sort_keys=False),
                        "space.yaml")
        shown = [obj.metric] + [m for m in (METRIC, "train_loss") if m != obj.metric]
        share_view(client, exp_id, view_key(name), metrics=shown, params=swept_keys(space), tags=["stopped_early"],
                   ascending=obj.mode == "min", run_filter=f"tags.sweep = '{name}'")

    try:
        param_space = {**tune_space, "__base__": to_dict(base),
                       "__sweep__": {"parent_run_id": parent_id, "name": name, "gpus_per_trial": gpus_per_trial,
                                     "trial_engine": engine, "metric": obj.metric}}
        trainable = tune.with_resources(tune.with_parameters(run_trial, sources=sources),
                                        trial_resources(base, gpus_per_trial, engine))
        rounds = base.train.rounds
        tracker = _trial_tracker(uri, exp_id, parent_id, name, rounds, swept_keys(space))
        progress = progress_callback(swept_keys(space), obj.metric, obj.mode, obj.max_t or rounds)
        # verbose=0: Tune's own status output repeats the whole base config; the progress table replaces it
        run_config = tune.RunConfig(name=name, storage_path=storage_uri, callbacks=[tracker, progress], verbose=0)
        exp_path = _join(storage_uri, name)
        if resume and tune.Tuner.can_restore(exp_path):
            tuner = tune.Tuner.restore(exp_path, trainable, param_space=param_space, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=param_space,
                tune_config=tune.TuneConfig(metric=obj.metric, mode=obj.mode, num_samples=num_samples,
                                            scheduler=make_scheduler(obj),
                                            search_alg=make_search(search, base.seed, max_concurrent),
                                            # a local trial's process (torch imported, warm) serves the next trial
                                            reuse_actors=engine == "local"),
                run_config=run_config,
            )
        with forward_signals_to_tune() as received:
            results = tuner.fit()
        unfinished = [t for t in getattr(getattr(results, "_experiment_analysis", None), "trials", None) or []
                      if t.status not in ("TERMINATED", "ERROR")]
        if received or unfinished:
            reason = received[0] if received else "SIGINT"
            why = (f"{reason}: sweep stopped with {len(unfinished)} trial(s) unfinished; the Tune state is saved: "
                   f"continue with the same command plus --resume --name {name}")
            tracker.close_open(why)
            raise SweepInterrupted(reason, why)
        best = _best_result(results, obj.metric, obj.mode, _trial_order(results))
        best_cfg = {k: v for k, v in best.config.items() if not k.startswith("__")}
        failed = [_error_line(str(r.error)) for r in results if r.error is not None]
        summary = {"best_config": best_cfg, "best_" + obj.metric: best.metrics.get(obj.metric),
                   "metric": obj.metric, "mode": obj.mode, "best_trial_id": best.metrics.get("trial_id"),
                   "parent_run_id": parent_id, "experiment_id": exp_id, "tracking_uri": uri, "trials": len(results),
                   "errors": len(failed), "first_error": failed[0] if failed else None, "storage": exp_path,
                   "trial_engine": engine, "scheduler": obj.scheduler, "grace_period": obj.grace_period,
                   "max_t": obj.max_t, "search": search, "view": view_url(uri, exp_id, view_key(name))}
        _log_parent(client, parent_id, exp_id, results, best, best_cfg, space, obj.metric, obj.mode)
        client.set_terminated(parent_id, "FINISHED")
        return summary
    except KeyboardInterrupt as exc:
        client.set_tag(parent_id, "failure_reason", (str(exc) or "interrupted")[:5000])
        client.set_terminated(parent_id, "KILLED")
        raise
    except BaseException as exc:
        client.set_tag(parent_id, "failure_reason", f"{type(exc).__name__}: {exc}"[:5000])
        client.set_terminated(parent_id, "FAILED")
        raise
    finally:
        guard.release()
        if started:
            ray.shutdown()


def restore_results(path: str) -> Any:
    """Tune's results of a sweep (its ``storage`` in the summary): ``tune.Tuner.restore(path, run_trial)
    .get_results()``; ``get_best_result()`` uses the sweep's metric and mode. Config keys are the space's
    (``method.mu``), besides ``__base__`` (the base config) and ``__sweep__``."""
    from ray import tune

    return tune.Tuner.restore(path, run_trial).get_results()


class SweepInterrupted(Stopped):
    """A signal (SIGTERM, SIGHUP, SIGINT) stopped the sweep; Tune saved its state for ``--resume``."""

    def __init__(self, reason: str, message: str) -> None:
        KeyboardInterrupt.__init__(self, message)
        self.reason, self.next_round, self.checkpointed = reason, 0, True

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, str(self)))


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


class SweepFailed(RuntimeError):
    """No trial of the sweep produced the metric; the message says how many failed and why."""


def _best_result(results: Any, metric: str = METRIC, mode: str = "max", order: Mapping[str, int] | None = None) -> Any:
    """The best trial: among those that reached the most rounds (under ASHA / HyperBand the survivors; a
    trial stopped at round 2 is not compared with finished ones on its round-2 accuracy), the best last
    ``metric``; ties go to the trial created first (``order``: trial id -> creation index, else the id)."""
    scored = [r for r in results if r.metrics and _number(r.metrics.get(metric))]
    if not scored:
        errors = [_error_line(str(r.error)) for r in results if r.error is not None]
        why = f"; first error: {errors[0]}" if errors else ""
        raise SweepFailed(f"no trial of {len(results)} reported a finite {metric} ({len(errors)} failed){why}")
    def reached(r: Any) -> float:
        rnd = r.metrics.get("round")
        return float(rnd) if _number(rnd) else -1.0

    farthest = max(reached(r) for r in scored)
    scored = [r for r in scored if reached(r) == farthest]
    sign = -1.0 if mode == "max" else 1.0
    order = order or {}

    def key(r: Any) -> tuple[float, float, str]:
        tid = str(r.metrics.get("trial_id", ""))
        return sign * r.metrics[metric], order.get(tid, math.inf), tid

    return min(scored, key=key)


def _trial_order(results: Any) -> dict[str, int]:
    """Trial id -> creation index (:func:`trial_index`)."""
    trials = getattr(getattr(results, "_experiment_analysis", None), "trials", None) or []
    return {str(t.trial_id): i for t in trials if (i := trial_index(t)) is not None}


def _child_run(client: Any, exp_id: str, result: Any) -> Any:
    """The MLflow child run of a Tune result (found by its ``tune_trial_id`` tag), or None."""
    trial_id = result.metrics.get("trial_id") if result.metrics else None
    runs = client.search_runs([exp_id], f"tags.tune_trial_id = '{trial_id}'") if trial_id else []
    return runs[0] if runs else None


def _log_parent(client: Any, parent_id: str, exp_id: str, results: Any, best: Any, best_cfg: dict, space: dict,
                metric: str = METRIC, mode: str = "max") -> None:
    """The best trial on the sweep's parent run, and summary plots.

    Metrics: the best trial's child run's metrics under their own names (the parent row shows its
    ``acc_mean``), plus ``best_<metric>``. Params: its swept values under the children's names
    (``method.mu``), so the collapsed parent row fills those columns. Tags ``best.*`` and ``best.json`` too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    value = float(best.metrics.get(metric, float("nan")))
    step = int(best.metrics.get("round", 0))
    ts = int(time.time() * 1000)
    child = _child_run(client, exp_id, best)
    points = [Metric(f"best_{metric}", value, ts, step)]
    if child is not None:
        points += [Metric(k, float(v), ts, step) for k, v in child.data.metrics.items() if math.isfinite(v)]
        client.set_tag(parent_id, "best_run_id", child.info.run_id)
        client.set_tag(parent_id, "best_run_name", child.info.run_name)
    client.log_batch(parent_id, metrics=points)
    for k, v in best_cfg.items():
        client.set_tag(parent_id, f"best.{k}", str(v))
    swept = [k for k in swept_keys(space) if k in best_cfg]
    try:  # params are write-once: a resumed sweep whose errored trials now win keeps the first best's
        client.log_batch(parent_id, params=[Param(k, str(best_cfg[k])[:6000]) for k in swept])
    except MlflowException:
        client.set_tag(parent_id, "best_params_stale", "true: see the best.* tags")
    client.set_tag(parent_id, "best_trial_id", str(best.metrics.get("trial_id")))
    client.log_dict(parent_id, {"best_config": best_cfg, f"best_{metric}": best.metrics.get(metric), "metric": metric,
                                "mode": mode, "best_trial_id": best.metrics.get("trial_id")}, "best.json")

    from lcfed.tracking import ROUND_AXIS

    def column(df: Any, name: str) -> Any:
        for col in (name, f"{REPORT_KEY}/metrics/{name}"):  # the top-level metric, or one of the nested ones
            if col in df:
                return df[col].to_numpy(dtype=float)
        return None

    rows = []
    for r in results:
        df = r.metrics_dataframe
        y = column(df, metric) if r.metrics is not None and df is not None else None
        if y is None:  # e.g. a trial that failed in its first round
            continue
        x = df["round"].to_numpy() if "round" in df else np.arange(len(df))
        rows.append((float(r.metrics.get(metric, float("nan"))),
                     {k: v for k, v in r.config.items() if not k.startswith("__")}, x, y, column(df, METRIC)))
    sign = -1.0 if mode == "max" else 1.0
    rows.sort(key=lambda t: sign * t[0] if math.isfinite(t[0]) else math.inf)

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for val, cfg, x, y, _ in rows[:5]:
        label = ", ".join(f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                          for k, v in cfg.items())
        ax.plot(x, y, label=f"{val:.3g}: {label}"[:60])
    ax.set_xlabel(ROUND_AXIS)
    ax.set_ylabel(metric)
    ax.set_title(f"top trials ({mode} {metric})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right" if mode == "max" else "upper right")
    fig.tight_layout()
    client.log_figure(parent_id, fig, "plots/top_trials.png")
    plt.close(fig)

    acc_rows = [t for t in rows if t[4] is not None]
    if "method.mu" in space and "method.lam" in space and acc_rows:  # the map shows acc_mean whatever the metric
        trials = [{"mu": c.get("method.mu"), "lam": c.get("method.lam"), "rounds": x, "values": acc}
                  for _, c, x, _, acc in acc_rows]
        fig = mu_lambda_figure(trials)
        client.log_figure(parent_id, fig, "plots/mu_lambda_heatmap.png")
        plt.close(fig)

    _log_assignment_heatmap(client, parent_id, exp_id, best)


def comparable_values(trials: Sequence[Mapping[str, Any]]) -> tuple[int | None, list[float | None]]:
    """The round every trial is compared at and each trial's value there (None: not comparable).

    Trials hold ``rounds`` and ``values`` (a metric per reported round). The round is the furthest
    any trial reached with a finite value; trials that stopped before it (ASHA, a failure) get None
    rather than an earlier round's value, which no later round's value can be compared with."""
    last: list[dict[int, float]] = []
    for t in trials:
        last.append({int(r): float(v) for r, v in zip(t["rounds"], t["values"], strict=True)
                     if v is not None and math.isfinite(float(v))})
    reached = [max(d) for d in last if d]
    if not reached:
        return None, [None] * len(trials)
    at = max(reached)
    return at, [d.get(at) for d in last]


def mu_lambda_figure(trials: Sequence[Mapping[str, Any]]) -> Any:
    """μ–λ map of a sweep's trials (each a mapping with ``mu``, ``lam``, ``rounds``, ``values``).

    Filled markers, coloured by the metric, are the trials that reached the last round, all at that
    same round (named in the title); trials stopped earlier are hollow and uncoloured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    at, values = comparable_values(trials)
    mu = [t["mu"] for t in trials]
    lam = [t["lam"] for t in trials]
    done = [i for i, v in enumerate(values) if v is not None]
    early = [i for i, v in enumerate(values) if v is None]
    fig, ax = plt.subplots(figsize=(5.5, 4.4), dpi=100, layout="constrained")
    if done:
        sc = ax.scatter([mu[i] for i in done], [lam[i] for i in done], c=[values[i] for i in done], cmap="viridis",
                        s=80, edgecolors="k", label=f"reached round {at}")
        fig.colorbar(sc, ax=ax, label=f"{METRIC} at round {at}")
    if early:
        ax.scatter([mu[i] for i in early], [lam[i] for i in early], facecolors="none", edgecolors="0.4", s=80,
                   linewidths=1.2, label=f"stopped before round {at} (not coloured)")
    if all(isinstance(v, (int, float)) and v > 0 for v in mu + lam):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("μ (cluster proximal weight)")
    ax.set_ylabel("λ (global embedding weight)")
    ax.set_title(f"μ–λ map: {METRIC} at round {at} (MLflow step)" if at is not None else "μ–λ map")
    if early:
        fig.legend(loc="outside lower center", fontsize=8, frameon=False)
    plt.close(fig)
    return fig


def assignment_figure(hist: np.ndarray, rounds: Sequence[int] | None = None, title: str = "") -> Any:
    """Cluster assignment per round (rows = rounds, columns = devices) with one categorical colour
    per cluster id (a discrete colour bar, integer ticks); unassigned (-1) is grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    from lcfed.tracking import ROUND_AXIS

    hist = np.asarray(hist, dtype=np.int64)
    if hist.ndim == 1:
        hist = hist[None]
    ids = [int(v) for v in np.unique(hist) if v >= 0]
    pool = [c for name in ("tab20", "tab20b", "tab20c") for c in plt.get_cmap(name).colors]
    if len(ids) <= 10:
        colours = list(plt.get_cmap("tab10").colors[:len(ids)])
    elif len(ids) <= len(pool):
        colours = pool[:len(ids)]
    else:
        colours = list(plt.get_cmap("turbo")(np.linspace(0, 1, len(ids))))
    labels = [str(i) for i in ids]
    if (hist < 0).any():
        colours, labels, ids = [(0.75, 0.75, 0.75)] + colours, ["unassigned"] + labels, [-1] + ids
    codes = np.searchsorted(np.asarray(ids), np.where(hist < 0, -1, hist))
    n = max(len(ids), 1)
    cmap = ListedColormap(colours or [(0.75, 0.75, 0.75)], name="clusters")
    norm = BoundaryNorm(np.arange(n + 1) - 0.5, n)
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100, layout="constrained")
    im = ax.imshow(codes, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    ax.set_xlabel("device")
    ax.set_ylabel(ROUND_AXIS)
    steps = list(range(len(hist))) if rounds is None else [int(r) for r in rounds]
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: str(steps[int(y)]) if 0 <= int(y) < len(steps) else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or "cluster assignment")
    bar = fig.colorbar(im, ax=ax, label="cluster", ticks=np.arange(n))
    bar.ax.set_yticklabels(labels or ["none"])
    bar.ax.tick_params(length=0)
    plt.close(fig)
    return fig


def _log_assignment_heatmap(client: Any, parent_id: str, exp_id: str, best: Any) -> None:
    """The best trial's cluster assignment per round (rows = rounds, columns = devices)."""
    import matplotlib.pyplot as plt

    from lcfed.tracking import read_assignment_history

    trial_id = best.metrics.get("trial_id")
    runs = client.search_runs([exp_id], f"tags.tune_trial_id = '{trial_id}'") if trial_id else []
    if not runs:
        return
    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # one small CSV: no bar between the table and the summary
    try:
        text = client.download_artifacts(runs[0].info.run_id, "clusters/assignment_history.csv")
    except Exception:
        return  # methods without clusters have no assignment
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
    rounds, hist = read_assignment_history(Path(text).read_text())
    fig = assignment_figure(hist, rounds, title="cluster assignment of the best trial")
    client.log_figure(parent_id, fig, "plots/assignment_heatmap.png")
    plt.close(fig)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="Ray Tune sweep over config fields; each trial a full federation",
        description="A Ray Tune sweep over the config fields a search space (--space) names: each trial is "
        "a full federation on the base config, reported every round; all trials go under one MLflow "
        "parent run. Prints the best config and its metric.",
        epilog=examples(
            "lcfed sweep --config configs/digits_dirichlet.yaml --space mu_lambda.yaml --num-samples 16",
            "lcfed sweep --space mu_lambda.yaml --search optuna --num-samples 20 --metric val_acc_mean "
            "--set data.val_fraction=0.2",
            "lcfed sweep --space mu_lambda.yaml --name my-sweep --resume   # continue an interrupted sweep"))
    config_options(p, "base experiment config", "override a base field")
    p.add_argument("--space", required=True, metavar="FILE",
                   help="search space YAML (a path, or a bundled name under tune_jobs/spaces/, e.g. mu_lambda.yaml)")
    p.add_argument("--search", choices=list(SEARCHES), default="random",
                   help="random (default): Tune's random samples, grid([...]) fields expanded; grid: every swept "
                   "field enumerated (grid or choice); optuna / hyperopt: Tune's OptunaSearch / HyperOptSearch, "
                   "seeded by the config's seed (pip install 'lcfed[search]')")
    p.add_argument("--num-samples", type=int, default=1,
                   help="trials (optuna, hyperopt), or samples per grid point (random, grid) (default %(default)s)")
    p.add_argument("--metric", default=METRIC,
                   help=f"the per-round metric to optimise (default %(default)s); one of: {', '.join(METRICS)}")
    p.add_argument("--mode", choices=["max", "min"],
                   help="max or min (default: the metric's direction: max for acc_*, label_homogeneity, ari, "
                   "coverage; min for *_loss, acc_std, bytes and seconds)")
    p.add_argument("--scheduler", choices=list(SCHEDULERS), default="asha",
                   help="asha (default): Tune's ASHAScheduler stops trials behind at a rung; hyperband: "
                   "HyperBandScheduler (pauses and stops trials in brackets); fifo: every trial runs all rounds")
    p.add_argument("--grace-period", type=int, metavar="N",
                   help="rounds a trial runs before asha/hyperband may stop it (default max(1, max_t // 2))")
    p.add_argument("--max-t", type=int, metavar="N",
                   help="rounds a trial runs at most under asha/hyperband (default train.rounds)")
    p.add_argument("--max-concurrent", type=int, default=0, help="trials at once (0 = as resources allow)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial, shared by its device actors")
    p.add_argument("--trial-engine", choices=list(TRIAL_ENGINES), default="auto",
                   help="local: each trial's federation in the trial's process (engine.torch_threads x engine.workers "
                   "CPUs, its GPU share); ray: device actors in the trial's placement group; auto (default): local on "
                   "a single-node Ray with --gpus-per-trial <= 1, else ray")
    p.add_argument("--name", help="sweep name (Tune experiment and MLflow parent run); default <config name>-sweep")
    p.add_argument("--storage", default="~/lcfed-sweeps",
                   help="Tune storage: a path, or a URI every node reaches (s3://bucket/prefix, gs://..., file://...) "
                   "as a multi-node cluster needs (default %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same --name")
    p.add_argument("--json", metavar="FILE", help="also write the summary (best config, metric, runs, storage) as JSON")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    import json

    from lcfed.tracking import ui_hint

    base = load_config(args.config, args.set)
    require(args.name is None or safe_name(args.name), "--name", args.name, NAME_RULE)
    check_output_file(args.json, "--json", protect=[args.config, args.space])
    check_output_dir(args.storage, "--storage")
    require(args.num_samples >= 1, "--num-samples", args.num_samples, "must be >= 1")
    require(args.max_concurrent >= 0, "--max-concurrent", args.max_concurrent, "must be >= 0")
    require(args.gpus_per_trial >= 0, "--gpus-per-trial", args.gpus_per_trial, "must be >= 0")
    resolve_objective(base.train.rounds, args.metric, args.mode, args.scheduler, args.grace_period, args.max_t)
    space = load_space(args.space, base)
    check_search(args.search, space)
    summary = run_sweep(base, space, num_samples=args.num_samples, scheduler=args.scheduler,
                        max_concurrent=args.max_concurrent, gpus_per_trial=args.gpus_per_trial, name=args.name,
                        storage=args.storage, resume=args.resume, trial_engine=args.trial_engine,
                        metric=args.metric, mode=args.mode, grace_period=args.grace_period, max_t=args.max_t,
                        search=args.search)
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"MLflow parent run {summary['parent_run_id']}: {ui_hint(summary['tracking_uri'])}")
    print(f"the trials side by side (metric, swept values): {summary['view']}")
    if summary["errors"]:
        print(f"lcfed: {summary['errors']} of {summary['trials']} trials failed; first: {summary['first_error']}",
              file=sys.stderr)
        return 1
    return 0
