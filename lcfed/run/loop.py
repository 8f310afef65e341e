"""The round loop, written once. It drives a server and a device pool, in-process or on Ray.

What it calls on them and on its observers is in :mod:`lcfed.run.contracts`; what it returns, in
:mod:`lcfed.run.result`; import those names from there (this module defines only the loop and its helpers).
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
from lcfed.learning.local_update import EvalResult
from lcfed.learning.metrics import accuracy_metrics, label_homogeneity
from lcfed.learning.recovery import adjusted_rand_index, normalized_mutual_info
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
from lcfed.run.result import FinalModels, RunResult, newcomer, newcomer_metrics
from lcfed.run.stop import STOP, Stopped

__all__ = [
    "DivergenceError", "HostFailure", "checkpoint_modules", "checkpoint_path", "eval_sample", "evaluate_round",
    "final_models", "load_resume", "run_rounds", "should_evaluate", "simulated_seconds",
]


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite; the run stops with this reason."""


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


def should_evaluate(cfg: ExperimentConfig, rnd: int) -> bool:
    last = rnd == cfg.train.rounds - 1
    return last or (rnd + 1) % cfg.train.eval_every == 0


#: the stream (with the seed and round) of ``train.eval_devices``' samples: no other draw uses it
_EVAL_STREAM = 0xE7A1

#: ``train.final_eval_devices: -1`` (auto): the last round scores every device of a federation up to this
#: size, a seeded sample of this many above it. The final evaluation is O(m) (about 1 ms a device on a CPU
#: core: 19 min at 10^6); a sample of 10^4 puts acc_mean within about +-0.4 points (95 %) at any m.
FINAL_EVAL_AUTO = 10_000


def eval_size(cfg: ExperimentConfig, rnd: int, devices: int) -> int:
    """How many devices an evaluation in round ``rnd`` scores in a federation of ``devices``: 0 = every one.
    Before the last round ``train.eval_devices``; in it ``train.final_eval_devices`` (-1: every device up to
    :data:`FINAL_EVAL_AUTO`, that many above)."""
    if rnd != cfg.train.rounds - 1:
        return cfg.train.eval_devices
    n = cfg.train.final_eval_devices
    if n == -1:
        return 0 if devices <= FINAL_EVAL_AUTO else FINAL_EVAL_AUTO
    return n


def eval_sample(cfg: ExperimentConfig, rnd: int, trained: np.ndarray) -> tuple[int, ...] | None:
    """The devices an evaluation in round ``rnd`` scores: None (every device) when :func:`eval_size` is 0;
    else that many of the devices that have trained (those the accuracy metrics count), sorted, drawn with
    the seed and round (all of them when fewer have trained)."""
    n = eval_size(cfg, rnd, len(trained))
    if n == 0:
        return None
    candidates = np.flatnonzero(trained)
    if len(candidates) <= n:
        return tuple(int(d) for d in candidates)
    rng = np.random.default_rng([cfg.seed, rnd, _EVAL_STREAM])
    return tuple(sorted(int(d) for d in rng.choice(candidates, size=n, replace=False)))


def evaluate_round(
    cfg: ExperimentConfig, rnd: int, server: Server[Any], pool: DevicePool[Any], trained: np.ndarray
) -> dict[int, EvalResult]:
    """The round's evaluation: every device, or :func:`eval_sample`'s."""
    sample = eval_sample(cfg, rnd, trained)
    payload = server.eval_payload()
    return pool.evaluate(payload) if sample is None else pool.evaluate(payload, sample)


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


TOTALS = ("bytes_up_total", "bytes_down_total", "sim_seconds_total")


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


def simulated_seconds(cfg: ExperimentConfig, fed: Federation, stats: RoundStats) -> tuple[float, float]:
    """(communication, computation) seconds of a round on the simulated deployment (``cfg.network``).

    Participants work in parallel, so a round costs one average participant's transfer over its
    link plus its local training: ``samples x 3 x forward FLOPs`` (forward and backward) at
    ``device_gflops``. Extra device-side passes a method makes (e.g. IFCA scoring K models) are
    not priced.
    """
    n = max(stats.participants, 1)
    comm = (stats.bytes_up + stats.bytes_down) / n * 8 / (cfg.network.bandwidth_mbps * 1e6)
    t = cfg.train
    if t.local_steps is not None:
        samples = float(t.local_steps * t.batch_size)
    else:
        samples = (t.local_epochs or 0) * float(np.mean(fed.train_sizes))
    compute = samples * 3 * fed.flops_per_sample / (cfg.network.device_gflops * 1e9) if stats.participants else 0.0
    return comm, compute


def _metrics(
    cfg: ExperimentConfig,
    rnd: int,
    stats: RoundStats,
    evaluation: dict[int, EvalResult] | None,
    fed: Federation,
    totals: dict[str, float],
    trained: np.ndarray,
) -> dict[str, float]:
    comm, compute = simulated_seconds(cfg, fed, stats)
    metrics: dict[str, float] = {
        "round": float(rnd),
        "train_loss": stats.train_loss,
        "bytes_up": float(stats.bytes_up),
        "bytes_down": float(stats.bytes_down),
        "bytes_up_total": totals["bytes_up_total"] + stats.bytes_up,
        "bytes_down_total": totals["bytes_down_total"] + stats.bytes_down,
        "sim_comm_seconds": comm,
        "sim_compute_seconds": compute,
        "sim_seconds_total": totals["sim_seconds_total"] + comm + compute,
    }
    for layer, nbytes in sorted(stats.layers_up.items()):
        metrics[f"bytes_up/{layer}"] = float(nbytes)
    for layer, nbytes in sorted(stats.layers_down.items()):
        metrics[f"bytes_down/{layer}"] = float(nbytes)
    if stats.assignment is not None:
        metrics["num_clusters"] = float(stats.num_clusters)
        assigned = stats.assignment >= 0
        if assigned.any():
            truth, found = fed.groups[assigned], stats.assignment[assigned]
            # against a testbed's true groups always (too few clusters is a score, not an excuse); against a
            # label-skew proxy only where K clusters can express it (pathological class sets outnumber any K)
            if fed.group_kind or len(np.unique(truth)) <= max(stats.num_clusters, len(np.unique(found))):
                metrics["ari"] = adjusted_rand_index(found, truth)
            if fed.group_kind:  # a testbed's true clusters: recovery also as normalized mutual information
                metrics["nmi"] = normalized_mutual_info(found, truth)
            if fed.label_dist is not None:
                metrics["label_homogeneity"] = label_homogeneity(fed.label_dist[assigned], found)
    # the share of the devices rounds can select that have trained (held-out ones never do)
    training = np.ones(fed.num_devices, dtype=bool)
    training[list(fed.held_out)] = False
    metrics["coverage"] = float(trained[training].mean())
    if evaluation is not None:
        metrics.update(accuracy_metrics(evaluation, trained))
    return metrics


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


def sim_clock(fed: Federation, last: dict[str, float]) -> SimClock | None:
    """The device model's clock at the start of the round after ``last`` (the previous round's metrics; {}
    before the first), and each device's transfer: the last round's mean per kept device, one model each way
    before the first round or after one that kept no one. None without the device model."""
    if fed.fleet is None:
        return None
    kept = last.get("devices_kept", 0.0)
    size = 4.0 * fed.spec.size
    down, up = (last["bytes_down"] / kept, last["bytes_up"] / kept) if kept else (size, size)
    return SimClock(float(last.get("sim_clock_seconds", 0.0)), down, up)


def _play(
    cfg: ExperimentConfig, fed: Federation, server: Server[PlanT], pool: DevicePool[PlanT], rnd: int,
    trained: np.ndarray, totals: dict[str, float], clock: SimClock | None,
) -> _Played:
    """Round ``rnd``: train its participants, aggregate, evaluate when due, and the round's metrics
    (the held-out devices join after the last round). ``clock``: the device model's (:func:`sim_clock`)."""
    t0 = time.perf_counter()
    plan = server.configure(rnd, clock)
    stats = server.aggregate(plan, pool.train(plan))
    now_trained = trained.copy()
    now_trained[list(plan.devices)] = True
    evaluation = evaluate_round(cfg, rnd, server, pool, now_trained) if should_evaluate(cfg, rnd) else None
    if plan.devices and not np.isfinite(stats.train_loss):
        raise DivergenceError(f"round {rnd}: training loss is {stats.train_loss}; lower train.lr or check the data")
    metrics = _metrics(cfg, rnd, stats, evaluation, fed, totals, now_trained)
    if plan.timing is not None:
        metrics.update(plan.timing.metrics())
    if fed.held_out and rnd == cfg.train.rounds - 1:
        metrics.update(newcomer_metrics(pool.join(fed.held_out, newcomer(server.get_state(), fed.spec))))
    metrics["round_seconds"] = time.perf_counter() - t0
    return _Played(stats, metrics, now_trained, evaluation)


def _time_to_target(cfg: ExperimentConfig, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
    """``sim_seconds_to_target`` into the round's ``metrics`` if its ``acc_mean`` is the first to reach
    ``devices.target_acc`` (the simulated clock then)."""
    target = cfg.devices.target_acc
    if (target > 0 and metrics.get("acc_mean", -1.0) >= target and "sim_clock_seconds" in metrics
            and not any("sim_seconds_to_target" in row for row in history)):
        metrics["sim_seconds_to_target"] = metrics["sim_clock_seconds"]


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
            played = _play(cfg, fed, server, pool, rnd, trained, totals, clock)
            _time_to_target(cfg, played.metrics, result.history)
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
