"""A round's privacy metrics (``dp_*``, :mod:`lcfed.run.metric_catalog`): the round's real sampling rate and the
(ε, δ) spent so far, and under adaptive clipping the round's clip and noised fraction within it. The accountant is
rebuilt from the history's rates, and the adaptive clip from its last clip and fraction (:func:`round_clip`):
checkpoints keep the history, so a resumed or replayed run continues both; dp-accounting is imported only with
``privacy.mode: central``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lcfed import registry
from lcfed.config import ExperimentConfig
from lcfed.devices.clock import RoundTiming
from lcfed.learning.local_update import LocalWork
from lcfed.learning.privacy import next_clip
from lcfed.methods.privacy import delta, joint, noise_multiplier
from lcfed.methods.round import Federation

__all__ = ["privacy_metrics", "round_clip", "sample_metrics", "sampling_rate"]


def sampling_rate(cfg: ExperimentConfig, participants: int, timing: RoundTiming | None) -> float:
    """The chance a device was in the round: the participants over the training devices, or with the device model
    the selected over those online (an online device's chance; over-commitment raises it)."""
    if timing is not None:
        return min(1.0, timing.selected / timing.online) if timing.online else 0.0
    return min(1.0, participants / cfg.data.training_devices)


def round_clip(cfg: ExperimentConfig, history: Sequence[dict[str, float]]) -> float | None:
    """The clip of the round after ``history`` under adaptive clipping (None without it): ``privacy.clip`` first,
    then the last round's ``dp_clip`` moved by its noised fraction ``dp_clip_fraction`` (:func:`next_clip`); a round
    that released no fraction (no device kept) leaves it."""
    p = cfg.privacy
    if not p.adaptive:
        return None
    assert p.clip_quantile is not None
    for row in reversed(history):
        if "dp_clip" in row:
            fraction = row.get("dp_clip_fraction")
            return row["dp_clip"] if fraction is None else next_clip(row["dp_clip"], fraction, p.clip_quantile, p.clip_lr)
    return float(p.clip)


def privacy_metrics(cfg: ExperimentConfig, participants: int, timing: RoundTiming | None,
                    history: Sequence[dict[str, float]], clip: float | None = None,
                    fraction: float | None = None) -> dict[str, float]:
    """The round's ``dp_*`` metrics; none with ``privacy.mode: off``. ``clip``, ``fraction``: adaptive clipping's
    clip this round and its noised fraction of updates within it (:class:`RoundStats.clip_fraction`)."""
    if not cfg.privacy.on:
        return {}
    from lcfed.learning.accounting import epsilon

    reads = registry.method(cfg.method.name).strategy.reads
    sigma = noise_multiplier(cfg, reads)
    q = sampling_rate(cfg, participants, timing)
    rates = [row["dp_sampling_rate"] for row in history if row.get("dp_sampling_rate", 0.0) > 0] + ([q] if q > 0 else [])
    released = bool(reads.sums) or "codes" in reads.per_device
    eps = epsilon(rates, joint(cfg, sigma, reads), delta(cfg)) if released else 0.0
    out = {"dp_epsilon": eps if math.isfinite(eps) else float("inf"), "dp_delta": delta(cfg),
           "dp_sampling_rate": q, "dp_noise_multiplier": sigma}
    if clip is not None:
        out["dp_clip"] = clip
        if fraction is not None:
            out["dp_clip_fraction"] = fraction
    return out


def sample_metrics(cfg: ExperimentConfig, fed: Federation, rnd: int) -> dict[str, float]:
    """Sample-level DP-SGD's ``dp_sample_*`` after round ``rnd`` (none without ``privacy.sample_noise``): the worst
    training device's ε, counting every round so far for every device (exact when all take part in every round,
    cross-silo's usual setting; an upper bound otherwise), at ``privacy.sample_delta`` or n_min^-1.1."""
    p = cfg.privacy
    if p.sample_noise is None:
        return {}
    from lcfed.learning.accounting import sample_epsilon

    held = set(fed.held_out)
    sizes = sorted({int(n) for d, n in enumerate(fed.train_sizes) if d not in held and n > 0})
    if not sizes:
        return {}
    work = LocalWork(cfg.train.lr, cfg.train.batch_size, cfg.train.local_steps, cfg.train.local_epochs)
    delta = p.sample_delta if p.sample_delta is not None else float(sizes[0]) ** -1.1
    steps = [(min(1.0, cfg.train.batch_size / n), work.steps_for(n) * (rnd + 1)) for n in sizes]
    return {"dp_sample_epsilon": sample_epsilon(steps, p.sample_noise, delta), "dp_sample_delta": delta}
