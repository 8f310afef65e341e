"""Where a trial's federation runs (``--trial-engine``) and how it is laid out: device actors and what each
holds on the Ray engine, training threads on the local one.

No Ray here: the ``lcfed sweep`` parser, built for every ``lcfed`` command, offers the engines; the Tune
resources a trial asks for are :func:`tune_jobs.sweep.trial.trial_resources`.
"""

from __future__ import annotations

from lcfed.config import ExperimentConfig
from lcfed.engines import ENGINES
from lcfed.errors import require


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
