"""What a round measures, around the loop: when it evaluates and which devices (a seeded sample of the trained
ones, every device at the last round), the round's metrics (accuracy, loss, traffic, clusters, their recovery of
known groups, the simulated clock and time to target), and the clock the server is handed at a round's start.
The loop (:mod:`lcfed.run.loop`) calls these; each is a function of the config, the federation and the round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lcfed.config import ExperimentConfig
from lcfed.devices.clock import SimClock
from lcfed.learning.local_update import EvalResult
from lcfed.learning.metrics import accuracy_metrics, label_homogeneity
from lcfed.learning.recovery import adjusted_rand_index, normalized_mutual_info
from lcfed.methods.round import Federation, RoundStats
from lcfed.run.contracts import (
    DevicePool,
    Server,
)

__all__ = ["FINAL_EVAL_AUTO", "TOTALS", "eval_sample", "eval_size", "evaluate_round", "round_metrics", "should_evaluate",
           "sim_clock", "simulated_seconds", "time_to_target"]


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


TOTALS = ("bytes_up_total", "bytes_down_total", "sim_seconds_total")


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


def round_metrics(
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


def time_to_target(cfg: ExperimentConfig, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
    """``sim_seconds_to_target`` into the round's ``metrics`` if its ``acc_mean`` is the first to reach
    ``devices.target_acc`` (the simulated clock then)."""
    target = cfg.devices.target_acc
    if (target > 0 and metrics.get("acc_mean", -1.0) >= target and "sim_clock_seconds" in metrics
            and not any("sim_seconds_to_target" in row for row in history)):
        metrics["sim_seconds_to_target"] = metrics["sim_clock_seconds"]
