"""The round loop, written once. It drives a server and a device pool, in-process or on Ray.

What it calls on them and on its observers is in :mod:`lcfed.run.contracts`; what it returns, in
:mod:`lcfed.run.result`; what a round measures (the evaluation schedule, the round's metrics), in
:mod:`lcfed.run.rounds`; import those names from there (this module defines only the loop and its resume).
It checks the stop flag (:mod:`lcfed.run.stop`) after every round.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lcfed import registry
from lcfed.config import ExperimentConfig
from lcfed.devices.clock import SimClock
from lcfed.errors import DivergenceError
from lcfed.learning.local_update import EvalResult
from lcfed.methods.round import Federation, RoundStats
from lcfed.run import checkpoint
from lcfed.run.contracts import (
    DevicePool,
    ErrorObserver,
    LocatingObserver,
    ModelsObserver,
    Observer,
    PersonalLimit,
    PlanT,
    Server,
)
from lcfed.run.faults import ClusterLost
from lcfed.run.privacy import privacy_metrics, round_clip, sample_metrics
from lcfed.run.result import FinalModels, RunResult, newcomer, newcomer_metrics
from lcfed.run.rounds import TOTALS, evaluate_round, round_metrics, should_evaluate, sim_clock, time_to_target
from lcfed.run.stop import STOP, Stopped

__all__ = ["DivergenceError", "HostFailure", "checkpoint_modules", "checkpoint_path", "final_models", "load_resume",
           "run_rounds"]


class HostFailure(RuntimeError):
    """A process hosting devices or the server was lost; the engine restarts it and replays."""


def final_models(server: Server[Any], pool: DevicePool[Any], personal: bool = True) -> FinalModels:
    """The server's state and, if ``personal``, every device's personalized model."""
    return FinalModels(server.get_state(), pool.personalized(server.eval_payload()) if personal else {})


def _final_models_for(observers: Sequence[Observer], fed: Federation, server: Server[Any],
                      pool: DevicePool[Any]) -> FinalModels | None:
    """The final models if an observer wants them; the personal ones only within every wanting observer's
    :class:`PersonalLimit` (the largest), so that none is built that no one would use."""
    wanting = [obs for obs in observers if isinstance(obs, ModelsObserver) and obs.wants_models]
    if not wanting:
        return None
    limit = max(obs.max_personal_bytes if isinstance(obs, PersonalLimit) else math.inf for obs in wanting)
    return final_models(server, pool, personal=fed.num_devices * fed.spec.size * 4 <= limit)


def checkpoint_path(cfg: ExperimentConfig) -> Path | None:
    return checkpoint.path(cfg.checkpoint.dir)


def checkpoint_modules(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The module, beyond lcfed's, whose state dataclasses the run's checkpoint may name: that of the strategy
    ``method.name`` names (a built-in's, a ``module:Attr`` path's, an entry point's), where a plugin keeps
    its own server and device states (:func:`lcfed.run.checkpoint.load`); the strategy's base classes' modules
    are not added."""
    return (registry.method(cfg.method.name).strategy.__module__,)


def load_resume(cfg: ExperimentConfig) -> checkpoint.Snapshot | None:
    """The run's latest checkpoint if ``checkpoint.dir`` has one, checked against this config; its dataclasses
    from lcfed's modules and the method's (:func:`checkpoint_modules`)."""
    path = checkpoint_path(cfg)
    if path is None or not path.exists():
        return None
    snap = checkpoint.load(path, allowed=checkpoint_modules(cfg))
    if snap.config_digest != cfg.digest():
        raise checkpoint.CheckpointError(
            f"checkpoint {path} was written by a different config (digest {snap.config_digest}, "
            f"this config {cfg.digest()}); use another checkpoint.dir"
        )
    return snap


def run_rounds(
    cfg: ExperimentConfig,
    fed: Federation,
    server: Server[PlanT],
    pool: DevicePool[PlanT],
    observers: Sequence[Observer] = (),
    resume: checkpoint.Snapshot | None = None,
    provenance: dict[str, str] | None = None,
) -> RunResult:
    """Run the remaining rounds (all, or those after ``resume``); return metrics and history.

    ``provenance``: the engine's record of what produces the numbers (:mod:`lcfed.numerics`), on the
    result before the observers' ``on_end``.

    With ``checkpoint.dir`` set the full state is saved every ``checkpoint.every`` rounds and at
    the end. If a round fails, observers that define ``on_error`` (:class:`ErrorObserver`) hear
    about it (MLflow marks the run FAILED with the reason) and the exception propagates.
    """
    if resume is not None:
        server.set_state(resume.server_state)
        server.set_pending(resume.pending)
        pool.set_states(resume.device_states)
    for obs in observers:
        obs.on_start(cfg, fed)
    try:
        return _loop(cfg, fed, server, pool, observers, resume, provenance or {})
    except BaseException as exc:
        for obs in observers:
            if isinstance(obs, ErrorObserver):
                try:
                    obs.on_error(exc)
                except Exception as inner:  # e.g. the tracking store is down too: keep the original error
                    warnings.warn(f"{type(obs).__name__}.on_error failed: {inner}", stacklevel=2)
        raise


def _restore(
    result: RunResult, snap: checkpoint.Snapshot | None, trained: np.ndarray
) -> tuple[int, dict[str, float]]:
    """Reset ``result`` and ``trained`` to ``snap`` (or to nothing); return (next round, running totals)."""
    trained[:] = False
    if snap is not None:
        trained[list(snap.trained)] = True
    result.history = list(snap.history) if snap is not None else []
    evaluated = [row for row in result.history if "acc_mean" in row]
    result.final = dict(evaluated[-1]) if evaluated else {}
    result.assignment = getattr(snap.server_state, "assignment", None) if snap is not None else None
    last = result.history[-1] if result.history else {}
    return (snap.next_round if snap is not None else 0), {k: float(last.get(k, 0.0)) for k in TOTALS}


def _save(
    path: Path,
    cfg: ExperimentConfig,
    next_round: int,
    server: Server[Any],
    pool: DevicePool[Any],
    history: list[dict[str, float]],
    observers: Sequence[Observer],
    trained: np.ndarray,
) -> checkpoint.Snapshot:
    """Checkpoint the state before ``next_round``, with where the observers log the run; the device
    states are written as the pool hands them over, and the snapshot returned reads them back from disk."""
    tracking: dict[str, str] = {}
    for obs in observers:
        if isinstance(obs, LocatingObserver):
            tracking.update(obs.location())
    snap = checkpoint.Snapshot(next_round=next_round, server_state=server.get_state(), device_states={},
                               history=history, config_digest=cfg.digest(), tracking=tracking,
                               trained=tuple(int(d) for d in np.flatnonzero(trained)), pending=server.get_pending())
    return checkpoint.write(path, snap, pool.iter_states(), checkpoint_modules(cfg))


@dataclass
class _Played:
    """One round played, not yet taken into the result: its metrics, what trained, what it scored."""

    stats: RoundStats
    metrics: dict[str, float]
    trained: np.ndarray
    evaluation: dict[int, EvalResult] | None


def _play(
    cfg: ExperimentConfig, fed: Federation, server: Server[PlanT], pool: DevicePool[PlanT], rnd: int,
    trained: np.ndarray, totals: dict[str, float], clock: SimClock | None, history: Sequence[dict[str, float]] = (),
) -> _Played:
    """Round ``rnd``: train its participants, aggregate, evaluate when due, and the round's metrics
    (the held-out devices join after the last round). ``clock``: the device model's (:func:`sim_clock`)."""
    t0 = time.perf_counter()
    clip = round_clip(cfg, history)
    plan = server.configure(rnd, clock, clip)
    stats = server.aggregate(plan, pool.train(plan))
    now_trained = trained.copy()
    now_trained[list(plan.devices)] = True
    evaluation = evaluate_round(cfg, rnd, server, pool, now_trained) if should_evaluate(cfg, rnd) else None
    if plan.devices and not np.isfinite(stats.train_loss):
        raise DivergenceError(f"round {rnd}: training loss is {stats.train_loss}; lower train.lr or check the data")
    metrics = round_metrics(cfg, rnd, stats, evaluation, fed, totals, now_trained)
    if plan.timing is not None:
        metrics.update(plan.timing.metrics())
    metrics.update(privacy_metrics(cfg, len(plan.devices), plan.timing, history, clip, stats.clip_fraction))
    metrics.update(sample_metrics(cfg, fed, rnd))
    if fed.held_out and rnd == cfg.train.rounds - 1:
        metrics.update(newcomer_metrics(pool.join(fed.held_out, newcomer(server.get_state(), fed.spec))))
    metrics["round_seconds"] = time.perf_counter() - t0
    return _Played(stats, metrics, now_trained, evaluation)


def _take(result: RunResult, rnd: int, played: _Played, history: list[dict[str, float]]) -> None:
    """Round ``rnd``'s outcome into ``result``: its history, assignment and, if it evaluated, the final scores."""
    result.history = history
    if played.stats.assignment is not None:
        result.assignment = played.stats.assignment
    if played.evaluation is not None:
        result.final = dict(played.metrics)
        result.evaluation, result.trained = played.evaluation, played.trained


def _loop(
    cfg: ExperimentConfig,
    fed: Federation,
    server: Server[PlanT],
    pool: DevicePool[PlanT],
    observers: Sequence[Observer],
    resume: checkpoint.Snapshot | None,
    provenance: dict[str, str],
) -> RunResult:
    t_start = time.perf_counter()
    result = RunResult(final={}, provenance=provenance)
    trained = np.zeros(fed.num_devices, dtype=bool)
    rnd, totals = _restore(result, resume, trained)
    ckpt = checkpoint_path(cfg)
    last_snap = resume  # the state to fall back to when a host is lost: the last checkpoint, else the start
    reported = rnd  # rounds below this were already passed to the observers
    failures = 0
    round_times = []  # the rounds this call played (not a resumed run's earlier ones)
    while rnd < cfg.train.rounds:
        try:
            clock = sim_clock(fed, result.history[-1] if result.history else {})
            played = _play(cfg, fed, server, pool, rnd, trained, totals, clock, result.history)
            time_to_target(cfg, played.metrics, result.history)
            history = [*result.history, played.metrics]
            if ckpt is not None and checkpoint.due(rnd, cfg.checkpoint.every, cfg.train.rounds):
                last_snap = _save(ckpt, cfg, rnd + 1, server, pool, history, observers, played.trained)
        except ClusterLost as exc:  # nothing to restart hosts on: stop, saying where the run can go on from
            exc.during(rnd, last_snap.next_round if last_snap is not None else 0, ckpt)
            raise
        except HostFailure as exc:
            failures += 1
            if failures > cfg.engine.max_failures:
                raise
            back_to = last_snap.next_round if last_snap is not None else 0
            warnings.warn(f"round {rnd}: {exc}; restarting lost hosts and replaying from round {back_to}", stacklevel=2)
            server.recover(last_snap.server_state if last_snap is not None else None,
                           last_snap.pending if last_snap is not None else None)
            pool.recover(last_snap.device_states if last_snap is not None else None)
            result.failures.append({"round": rnd, "replayed_from": back_to, "error": str(exc)})
            rnd, totals = _restore(result, last_snap, trained)
            continue
        totals = {k: played.metrics[k] for k in TOTALS}
        trained = played.trained
        round_times.append(played.metrics["round_seconds"])
        _take(result, rnd, played, history)
        if rnd >= reported:  # a replayed round reproduces what observers already have
            for obs in observers:
                obs.on_round(rnd, played.metrics, played.stats)
            reported = rnd + 1
        rnd += 1
        if STOP.reason is not None and rnd < cfg.train.rounds:
            saved = last_snap is not None and last_snap.next_round == rnd
            if ckpt is not None and not saved:
                _save(ckpt, cfg, rnd, server, pool, result.history, observers, trained)
            raise Stopped(STOP.reason, rnd, ckpt is not None)
    result.wall_seconds = time.perf_counter() - t_start
    result.round_seconds = float(np.mean(round_times)) if round_times else 0.0
    result.models = _final_models_for(observers, fed, server, pool)
    for obs in observers:
        obs.on_end(result)
    return result
