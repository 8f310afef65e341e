"""How Tune proposes and stops trials: ``--search`` checked against the space (:func:`check_search`), and
the search algorithm and scheduler the Tuner gets (:func:`make_search`, :func:`make_scheduler`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter
from ray.tune.search.sample import Categorical, Domain

from lcfed.errors import ConfigError, require
from tune_jobs.sweep.objective import SEARCH_LIBRARIES, SEARCHES, Objective
from tune_jobs.sweep.space import describe_domain


def check_search(search: str, space: Mapping[str, Any]) -> dict[str, Any]:
    """The Tune ``param_space`` for ``--search`` (checked before anything is started or created).

    ``grid``: every swept field is ``grid`` or ``choice`` (a choice is enumerated too). ``optuna`` /
    ``hyperopt``: no ``grid`` field (they sample, they do not enumerate), at least one range or choice, and
    the library installed (``pip install 'lcfed[search]'``)."""
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
        return BasicVariantGenerator(max_concurrent=max_concurrent, random_state=seed)
    if search == "optuna":
        from ray.tune.search.optuna import OptunaSearch  # imports optuna: the optional lcfed[search] extra

        searcher: Any = OptunaSearch(seed=seed)
    elif search == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch  # imports hyperopt: the optional lcfed[search] extra

        searcher = HyperOptSearch(random_state_seed=seed)
    else:
        raise ValueError(f"unknown search {search!r}")
    return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent) if max_concurrent else searcher


def make_scheduler(obj: Objective) -> Any:
    """Tune's scheduler for the objective (metric and mode come from the TuneConfig)."""
    if obj.scheduler == "asha":
        assert obj.max_t is not None and obj.grace_period is not None  # resolve_objective fills both for asha
        return ASHAScheduler(time_attr="training_iteration", max_t=obj.max_t, grace_period=obj.grace_period)
    if obj.scheduler == "hyperband":
        assert obj.max_t is not None  # resolve_objective fills it for hyperband
        sched = HyperBandScheduler(time_attr="training_iteration", max_t=obj.max_t)
        # Tune's HyperBand has no grace period: its brackets' first rung is max_t / 3^s rounds; no earlier
        # than grace_period here, so no trial is paused or stopped before it
        first_rung = sched._get_r0
        grace = int(obj.grace_period or 1)  # a number, not the Objective: the pickled scheduler names no lcfed class
        sched._get_r0 = lambda s: max(grace, first_rung(s))
        return sched
    return FIFOScheduler()
