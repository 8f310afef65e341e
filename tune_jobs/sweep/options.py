"""A sweep's options, once: :class:`SweepOptions` (what ``lcfed sweep`` and ``lcfed compare`` share, checked by
:meth:`SweepOptions.validate`), the flags that set them (:func:`add_sweep_options`) and the parsed flags as
options (:func:`sweep_options`); where a trial's federation runs (``--trial-engine``:
:func:`resolve_trial_engine`, and its layout), where Tune keeps the sweep (``--storage``, ``--keep-checkpoints``);
and how a sweep ends other than with a best trial (:class:`SweepFailed`, :class:`SweepInterrupted`).

No Ray, no MLflow here: the ``lcfed sweep`` and ``lcfed compare`` parsers, built for every ``lcfed`` command,
declare these flags, and ``lcfed``'s error handling catches :class:`SweepFailed` before any command runs. The
Tune resources a trial asks for are :func:`tune_jobs.sweep.trial.trial_resources`; the objective flags'
names and checks, :mod:`tune_jobs.sweep.objective`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from lcfed.config import NAME_RULE, ExperimentConfig, safe_name
from lcfed.engines import ENGINES
from lcfed.errors import require
from lcfed.run.metric_catalog import objectives
from lcfed.run.output_paths import check_output_dir
from lcfed.run.stop import Stopped
from lcfed.tracking import check_registry
from tune_jobs.sweep.objective import METRIC, SCHEDULERS, SEARCHES, Objective, check_finishes, resolve_objective

#: where Tune keeps sweeps unless --storage says: under the working directory's outputs/, which the
#: project's .gitignore covers (relative: made absolute when the sweep starts)
DEFAULT_STORAGE = "outputs/sweeps"
#: checkpoints each trial keeps (Tune's CheckpointConfig.num_to_keep): the latest, and the one before it in
#: case the latest was being written when the sweep stopped
DEFAULT_KEEP_CHECKPOINTS = 2


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep searches, what it optimises, where its trials run and where it keeps them: one field per
    ``lcfed sweep`` flag (``--max-concurrent`` is ``max_concurrent``), defaults as the flags'.

    ``name`` and ``storage``: ``None`` is the command's default (a sweep: ``<config name>-sweep`` and
    ``DEFAULT_STORAGE``; a comparison: the ``--out`` directory's name and ``<out>/tune``). ``log_models``
    (no flag): the best trial's final models are logged on its child run (always with ``register``).
    :meth:`validate` checks them all.
    """

    search: str = "random"
    num_samples: int = 1
    metric: str = METRIC
    mode: str | None = None
    scheduler: str = "asha"
    grace_period: int | None = None
    max_t: int | None = None
    max_concurrent: int = 0
    gpus_per_trial: float = 0.0
    trial_engine: str = "auto"
    name: str | None = None
    storage: str | Path | None = None
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS
    register: str | None = None
    resume: bool = False
    log_models: bool = True

    def validate(self, rounds: int, tracked: bool = True) -> Objective:
        """Refuse, before anything starts, an option no sweep of ``rounds`` rounds (the base config's
        ``train.rounds``) can run: a :class:`~lcfed.config.ConfigError` naming the flag and what it takes.
        ``tracked``: whether the sweep logs to MLflow (untracked: ``--no-track`` or ``tracking.enabled=false``,
        where ``--register`` has no registry). Returns the objective the options resolve to
        (:func:`resolve_objective`: the metric's mode, the scheduler's grace period and ``max_t`` filled in)."""
        require(self.name is None or safe_name(self.name), "--name", self.name, NAME_RULE)
        check_output_dir(self.storage, "--storage")
        require(_integer(self.num_samples) and self.num_samples >= 1, "--num-samples", self.num_samples,
                "must be >= 1")
        require(_integer(self.max_concurrent) and self.max_concurrent >= 0, "--max-concurrent", self.max_concurrent,
                "must be >= 0")
        require(isinstance(self.gpus_per_trial, (int, float)) and self.gpus_per_trial >= 0, "--gpus-per-trial",
                self.gpus_per_trial, "must be >= 0")
        require(self.trial_engine in trial_engines(), "--trial-engine", self.trial_engine,
                f"one of {trial_engines()}")
        require(self.search in SEARCHES, "--search", self.search, f"one of {list(SEARCHES)}")
        check_keep(self.keep_checkpoints)
        check_registry(self.register)
        require(tracked or self.register is None, "--register", self.register,
                f"cannot be used with {NO_TRACK}: the Model Registry is in the MLflow tracking store")
        obj = resolve_objective(rounds, self.metric, self.mode, self.scheduler, self.grace_period, self.max_t)
        check_finishes(obj, rounds, self.register)
        return obj


#: how a sweep or comparison is told not to log to MLflow, as its errors name it
NO_TRACK = "--no-track (or tracking.enabled=false)"
NO_TRACK_HELP = ("do not log to MLflow (as --set tracking.enabled=false): no parent or child runs, no tracking store "
                 "created; the summary still gives the best trial")


def add_no_track(parser: argparse.ArgumentParser, help: str = NO_TRACK_HELP) -> None:
    """``--no-track`` (``args.no_track``), as ``lcfed run`` has it."""
    parser.add_argument("--no-track", action="store_true", help=help)


def tracking_of(base: ExperimentConfig, no_track: bool) -> ExperimentConfig:
    """``base`` with tracking off where ``--no-track`` says so: a sweep or comparison is tracked exactly
    when the result's ``tracking.enabled`` is true (``--set tracking.enabled=false`` is the same)."""
    return base.replace(**{"tracking.enabled": False}) if no_track and base.tracking.enabled else base


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- where a trial's federation runs

def trial_engines() -> list[str]:
    """``--trial-engine``'s choices: ``auto`` and every registered engine."""
    return ["auto", *ENGINES]


def resolve_trial_engine(choice: str, gpus_per_trial: float, nodes: int) -> str:
    """The engine every trial of the sweep runs: ``local`` or ``ray``.

    ``auto`` is ``local`` when the whole federation fits one trial process on one node: the Ray
    cluster has a single node and a trial takes at most one GPU (one process drives one GPU).
    Otherwise ``ray``: on a multi-node cluster a trial's device actors go where the GPUs are
    (e.g. GPU workers beside a CPU head), and more than one GPU per trial needs several actors.
    """
    require(choice in trial_engines(), "--trial-engine", choice, f"one of {trial_engines()}")
    if choice == "local":
        require(gpus_per_trial <= 1, "--gpus-per-trial", gpus_per_trial,
                "must be <= 1 with --trial-engine local (a trial in one process drives one GPU); "
                "use --trial-engine ray for more")
        return "local"
    if choice != "auto":
        return choice
    return "local" if nodes == 1 and gpus_per_trial <= 1 else "ray"


def trial_layout(cfg: ExperimentConfig, gpus_per_trial: float) -> tuple[int, float, float]:
    """(device actors, CPUs per actor, GPUs per actor) of one trial on the Ray engine."""
    n = cfg.engine.num_actors or 1
    return n, cfg.engine.cpus_per_actor, gpus_per_trial / n


def local_trial_cpus(cfg: ExperimentConfig) -> int:
    """CPUs a local-engine trial reserves: ``engine.workers`` training threads (at least one), each
    running ``engine.torch_threads`` intra-op threads."""
    return cfg.engine.torch_threads * max(1, cfg.engine.workers)


# ---------------------------------------------------------------- where Tune keeps the sweep

def check_keep(keep: int) -> None:
    """``--keep-checkpoints``: at least 1 (a trial resumes from its latest checkpoint)."""
    require(_integer(keep) and keep >= 1, "--keep-checkpoints", keep,
            "must be an integer >= 1 (each trial's latest checkpoints kept)")


def storage_location(storage: str | Path) -> str:
    """``--storage``: a URI (``s3://``, ``gs://``, ``file://``, ...) goes to Tune as it is; a path is made
    absolute."""
    text = str(storage)
    if "://" in text:
        return text
    return str(Path(text).expanduser().resolve())


def experiment_path(storage: str, name: str) -> str:
    """``storage``/``name`` for a path or a URI (a query string stays at the end): where Tune keeps the
    sweep ``name``."""
    head, sep, query = storage.partition("?")
    return f"{head.rstrip('/')}/{name}{sep}{query}"


def check_storage(storage_uri: str) -> None:
    """On a multi-node cluster, trials on other nodes write their checkpoints to the storage: a plain
    local path is this node's disk only. ``file://`` says the path is a filesystem every node mounts."""
    import ray  # here: the lcfed parser reads this module's defaults, and loads no Ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    require(nodes == 1 or "://" in storage_uri, "--storage", storage_uri,
            f"must be a URI every one of the cluster's {nodes} nodes reaches (s3://bucket/prefix, gs://...), "
            "or file:///path on a filesystem all nodes mount")


#: each option's flag: its argparse settings and its help as ``lcfed sweep`` words it
_FLAGS: dict[str, dict[str, Any]] = {
    "search": dict(
        choices=list(SEARCHES), default="random",
        help="random (default): Tune's random samples, grid([...]) fields expanded; grid: every swept field "
        "enumerated (grid or choice); optuna / hyperopt: Tune's OptunaSearch / HyperOptSearch, seeded by the "
        "config's seed (pip install 'lcfed[search]')"),
    "num_samples": dict(
        type=int, default=1,
        help="trials (optuna, hyperopt), or samples per grid point (random, grid) (default %(default)s)"),
    "metric": dict(
        default=METRIC,
        help=f"the per-round metric to optimise (default %(default)s); one of: {', '.join(objectives())}"),
    "mode": dict(
        choices=["max", "min"],
        help="max or min (default: the metric's direction: max for acc_*, label_homogeneity, ari, coverage; min "
        "for *_loss, acc_std, bytes and seconds)"),
    "scheduler": dict(
        choices=list(SCHEDULERS), default="asha",
        help="asha (default): Tune's ASHAScheduler stops trials behind at a rung; hyperband: HyperBandScheduler "
        "(pauses and stops trials in brackets); fifo: every trial runs all rounds"),
    "grace_period": dict(
        type=int, metavar="N",
        help="rounds a trial runs before asha/hyperband may stop it (default max(1, max_t // 2))"),
    "max_t": dict(
        type=int, metavar="N", help="rounds a trial runs at most under asha/hyperband (default train.rounds)"),
    "max_concurrent": dict(type=int, default=0, help="trials at once (0 = as resources allow)"),
    "gpus_per_trial": dict(type=float, default=0.0, help="GPUs per trial, shared by its device actors"),
    "trial_engine": dict(
        choices=trial_engines(), default="auto",
        help="local: each trial's federation in the trial's process (engine.torch_threads x engine.workers CPUs, "
        "its GPU share); ray: device actors in the trial's placement group; auto (default): local on a "
        "single-node Ray with --gpus-per-trial <= 1 (and no autoscaler that may add workers), else ray"),
    "name": dict(help="sweep name (Tune experiment and MLflow parent run); default <config name>-sweep"),
    "storage": dict(
        default=DEFAULT_STORAGE,
        help="Tune storage: a path, or a URI every node reaches (s3://bucket/prefix, gs://..., file://...) as a "
        "multi-node cluster needs (default %(default)s, under the working directory)"),
    "keep_checkpoints": dict(
        type=int, default=DEFAULT_KEEP_CHECKPOINTS, metavar="N",
        help="checkpoints each trial keeps in the storage, the latest (default %(default)s)"),
    "register": dict(
        metavar="NAME",
        help="register the best trial's model (its personalized models) as a new version of NAME in the MLflow "
        "Model Registry, linked to its run (needs a database store or a server)"),
    "resume": dict(action="store_true", help="continue an interrupted sweep of the same --name"),
}
#: ``lcfed sweep``'s option flags, in its ``--help``'s order
SWEEP_FLAGS = tuple(_FLAGS)


def flag(option: str) -> str:
    """The flag of an option: ``max_concurrent`` -> ``--max-concurrent``."""
    return "--" + option.replace("_", "-")


def add_sweep_options(parser: argparse.ArgumentParser, options: Sequence[str] = SWEEP_FLAGS, *,
                      help: Mapping[str, str] | None = None, defaults: Mapping[str, Any] | None = None) -> None:
    """Declare the flags of ``options`` (:class:`SweepOptions` fields, in this order; default: all of
    ``lcfed sweep``'s). A command that gives an option another meaning or default says so: ``help`` and
    ``defaults`` map an option to its own (``lcfed compare``: ``--storage`` defaults to ``<out>/tune``)."""
    for option in options:
        spec = {**_FLAGS[option]}
        if help and option in help:
            spec["help"] = help[option]
        if defaults and option in defaults:
            spec["default"] = defaults[option]
        parser.add_argument(flag(option), **spec)


def sweep_options(args: argparse.Namespace, **fixed: Any) -> SweepOptions:
    """The options the parsed flags set (a :class:`SweepOptions` field without a flag keeps its default;
    ``fixed``: values the command sets itself). Not yet validated: :meth:`SweepOptions.validate`."""
    given = {f.name: getattr(args, f.name) for f in fields(SweepOptions) if f.name in _FLAGS and hasattr(args, f.name)}
    return SweepOptions(**{**given, **fixed})


# ---------------------------------------------------------------- how a sweep ends without a best trial

class SweepInterrupted(Stopped):
    """A signal (SIGTERM, SIGHUP, SIGINT) stopped the sweep; Tune saved its state for ``--resume``."""

    def __init__(self, reason: str, message: str) -> None:
        KeyboardInterrupt.__init__(self, message)
        self.reason, self.next_round, self.checkpointed = reason, 0, True

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, str(self)))


def error_line(text: str) -> str:
    """A trial's exception as ``module.Error: message``: the last line of ``text`` (a traceback) that names
    one, else its last line."""
    lines = [ln.strip() for ln in text.splitlines()]
    named = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)(\(\w+\))?: ", ln)]
    return named[-1] if named else (text.strip().splitlines() or ["trial failed"])[-1]
