"""One trial: the Tune trainable (:func:`run_trial`), a federation on the base config with the trial's
sampled values, reporting every round to Tune; plus what the sweep's driver prepares for it (its config,
its resources, the datasets).

Trials run in Tune's worker processes, on any node of the cluster: nothing here imports MLflow (a worker
need not have it; the driver's :class:`tune_jobs.sweep.callbacks.TrialTracker` logs the reports).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray
from ray import tune

from lcfed import engines
from lcfed.config import ExperimentConfig, from_dict
from lcfed.config.overrides import apply_overrides
from lcfed.data.formats import FileSource
from lcfed.errors import ConfigError
from lcfed.numerics import provenance
from lcfed.run import checkpoint
from lcfed.run.contracts import MAX_PERSONAL_BYTES, Engine
from lcfed.run.loop import checkpoint_modules
from lcfed.run.sources import load, load_source, source_key
from lcfed.tracking import federation_facts, model_bundle, save_bundle
from tune_jobs.sweep.objective import METRIC
from tune_jobs.sweep.options import local_trial_cpus, trial_layout

#: the key of a Tune report holding what the driver logs to MLflow (nested: Tune's tables skip it)
REPORT_KEY = "lcfed"
#: the final models (:class:`lcfed.tracking.ModelBundle`) in a trial's last checkpoint, for the driver to log
MODELS_FILE = "final_models.pt"


class TuneReporter:
    """Reports every round to Tune, attaching the engine's checkpoint on rounds that wrote one.

    Besides the sweep's metric at the top level (its last value: accuracies exist on evaluation rounds
    only; NaN before the first), each report carries under ``lcfed`` the round's
    metrics, the cluster assignment and (first report) the federation's facts: the driver's
    :class:`TrialTracker` logs them to MLflow, so trial processes never talk to a tracking server.
    The last round is reported from ``on_end``: Tune ends a trial that reached its last iteration
    from inside ``report`` (``SystemExit``). Its checkpoint also holds the final models
    (:data:`MODELS_FILE`), which the driver logs for the sweep's best trial.
    """

    wants_models = True  # the engine hands the final models to on_end (lcfed.run.contracts.ModelsObserver)
    max_personal_bytes = MAX_PERSONAL_BYTES  # (lcfed.run.contracts.PersonalLimit) none past what the best trial would log

    def __init__(self, cfg: ExperimentConfig, placement: dict[str, Any] | None = None, metric: str = METRIC) -> None:
        self.cfg = cfg
        self.metric = metric
        self.value = float("nan")
        self.facts: dict[str, str] | None = None
        self.provenance: dict[str, str] | None = None
        self.placement = placement
        self.pending: tuple[dict[str, Any], bool] | None = None
        self.fed: Any = None

    def on_start(self, cfg: ExperimentConfig, fed: Any) -> None:
        self.fed = fed
        self.facts = federation_facts(fed)
        self.provenance = provenance.record(threads=cfg.engine.torch_threads)

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
        # "round": the round's index from 0, as in the history and MLflow's steps (the CLI prints rnd + 1; the
        # driver's progress table, best-trial step and `lcfed compare` curves all read it from 0)
        report = {self.metric: self.value, "round": rnd, REPORT_KEY: data}
        ck = self.cfg.checkpoint
        saved = bool(ck.dir) and checkpoint.due(rnd, ck.every, self.cfg.train.rounds)
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
            if saved and getattr(result, "models", None) is not None and self.fed is not None and self.fed.input_shape:
                assert self.cfg.checkpoint.dir is not None  # saved: on_round saves only with a checkpoint dir
                save_bundle(Path(self.cfg.checkpoint.dir) / MODELS_FILE, model_bundle(self.fed, result.models))
            self._report(report, saved)

    def _report(self, metrics: dict[str, Any], saved: bool) -> None:
        if saved:
            assert self.cfg.checkpoint.dir is not None  # (as in on_end)
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


def trial_resources(cfg: ExperimentConfig, gpus_per_trial: float, engine: str = "ray") -> Any:
    """What one trial asks Tune for: one bundle (the trial's CPUs and GPU share) on the local engine; on the
    Ray engine a small bundle for the trial's driver and one per device actor."""
    if engine == "local":
        return tune.PlacementGroupFactory(
            [{"CPU": local_trial_cpus(cfg), **({"GPU": gpus_per_trial} if gpus_per_trial > 0 else {})}])
    n, cpu, gpu = trial_layout(cfg, gpus_per_trial)
    bundle = {"CPU": cpu, **({"GPU": gpu} if gpu > 0 else {})}
    return tune.PlacementGroupFactory([{"CPU": 0.5}] + [dict(bundle) for _ in range(n)])


def load_sources(base: ExperimentConfig, space: dict[str, Any]) -> dict[Any, Any]:
    """Every dataset the sweep's trials may use, loaded once here (the driver) for all of them."""
    # the fields of experiment.source_key that pick the files read: each choice may read other files
    keys = ("data.dataset", "data.data_dir", "data.download", *(f"data.{f.name}" for f in dataclasses.fields(FileSource)))
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
        found = source_key(cfg)
        if found not in sources:
            sources[found] = load_source(cfg)
    return sources


def run_trial(config: dict[str, Any], sources: dict[Any, Any] | None = None) -> None:
    """The Tune trainable: one federation with the trial's overrides of the base config, on the
    engine its ``engine.kind`` names (:func:`resolve_trial_engine` chose it for the sweep).

    ``sources`` are the datasets the sweep's driver loaded (through ``tune.with_parameters``, so the
    object store carries them): the node running the trial reads no data files.
    """
    ctx = tune.get_context()
    work = tempfile.mkdtemp(prefix="lcfed-trial-")
    try:
        cfg = trial_config(config, ctx.get_trial_id()).replace(**{"checkpoint.dir": work})
        dataset = load(cfg, (sources or {}).get(source_key(cfg)))
        resume = None
        prior = tune.get_checkpoint()
        if prior is not None:  # into the trial's own folder: the states are read from their part files when used
            prior.to_directory(work)
            main_file = checkpoint.path(work)
            assert main_file is not None
            resume = checkpoint.load(main_file, allowed=checkpoint_modules(cfg))  # a plugin's own states too
        engine = _trial_engine(cfg, dataset)
        try:
            placement = {"engine": cfg.engine.kind, "trial_node": ray.get_runtime_context().get_node_id(),
                         **engine.placement()}
            if cfg.engine.kind == "local":  # the trial's own GPU share (actors report theirs)
                placement.update(gpus=config["__sweep__"]["gpus_per_trial"],
                                 gpu_ids=[str(g) for g in ray.get_gpu_ids()])
            engine.run([TuneReporter(cfg, placement, config["__sweep__"].get("metric", METRIC))], resume)
        finally:
            engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)  # Tune has persisted every reported checkpoint


def _trial_engine(cfg: ExperimentConfig, dataset: Any) -> Engine:
    """The trial's federation on the engine ``engine.kind`` names, inside what the trial holds: in this (the
    trial's) process, with one training thread per ``torch_threads`` CPUs; or on device actors and a server
    actor inside the trial's placement group."""
    if cfg.engine.kind == "local":
        resources = (float(local_trial_cpus(cfg)), 0.0)
    else:
        n = cfg.engine.num_actors
        resources = (n * cfg.engine.cpus_per_actor, n * cfg.engine.gpus_per_actor)
    return engines.open_engine(cfg, dataset, resources)
