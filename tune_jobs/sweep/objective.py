"""What a sweep optimises and how it searches: the names ``--metric``, ``--scheduler`` and ``--search``
take, and :func:`resolve_objective`, which checks the objective flags against ``train.rounds``.

No Ray here: the ``lcfed sweep`` parser, built for every ``lcfed`` command, offers these names.
"""

from __future__ import annotations

from dataclasses import dataclass

from lcfed.errors import require
from lcfed.run.metric_catalog import objectives

METRIC = "acc_mean"  # the default --metric

SCHEDULERS = ("asha", "hyperband", "fifo")

#: ``--search``: Tune's BasicVariantGenerator (random samples, grid points expanded), the same with every
#: swept field enumerated, or a model-based searcher from the ``lcfed[search]`` extra
SEARCHES = ("random", "grid", "optuna", "hyperopt")
SEARCH_LIBRARIES = {"optuna": "optuna", "hyperopt": "hyperopt"}


@dataclass(frozen=True)
class Objective:
    """What the sweep optimises and how trials are stopped early: the scheduler, the best trial and the
    parent run's summary all use this one ``metric`` / ``mode``.

    A HyperBand sweep's Tune state (``tuner.pkl``) holds one, by this module's path: the scheduler's first-rung
    rule (:func:`tune_jobs.sweep.search.make_scheduler`) closes over it. It stays here, so that such a
    sweep resumes."""

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
    metrics = objectives()
    require(metric in metrics, "--metric", metric, f"a per-round metric the trials report: one of {sorted(metrics)}")
    require(mode in (None, "max", "min"), "--mode", mode, "max or min")
    mode = mode or metrics[metric]
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


def check_finishes(obj: Objective, rounds: int, register: str | None) -> None:
    """``--register`` needs the best trial to run every round: only then does it hand over its final models."""
    require(register is None or obj.max_t in (None, rounds), "--max-t", obj.max_t,
            f"must be train.rounds ({rounds}) with --register: only a trial that ran every round has final models")
