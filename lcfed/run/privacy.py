"""A round's privacy metrics (``dp_*``, :mod:`lcfed.run.metric_catalog`): the round's real sampling rate and the
(ε, δ) spent so far. The accountant is rebuilt from the history's rates, which checkpoints keep, so a resumed
run continues it; dp-accounting is imported only with ``privacy.mode: central``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lcfed import registry
from lcfed.config import ExperimentConfig
from lcfed.devices.clock import RoundTiming
from lcfed.methods.privacy import delta, joint, noise_multiplier

__all__ = ["privacy_metrics", "sampling_rate"]


def sampling_rate(cfg: ExperimentConfig, participants: int, timing: RoundTiming | None) -> float:
    """The chance a device was in the round: the participants over the training devices, or with the device model
    the selected over those online (an online device's chance; over-commitment raises it)."""
    if timing is not None:
        return min(1.0, timing.selected / timing.online) if timing.online else 0.0
    return min(1.0, participants / cfg.data.training_devices)


def privacy_metrics(cfg: ExperimentConfig, participants: int, timing: RoundTiming | None,
                    history: Sequence[dict[str, float]]) -> dict[str, float]:
    """The round's ``dp_*`` metrics; none with ``privacy.mode: off``."""
    if not cfg.privacy.on:
        return {}
    from lcfed.learning.accounting import epsilon

    reads = registry.method(cfg.method.name).strategy.reads
    sigma = noise_multiplier(cfg, reads)
    q = sampling_rate(cfg, participants, timing)
    rates = [row["dp_sampling_rate"] for row in history if row.get("dp_sampling_rate", 0.0) > 0] + ([q] if q > 0 else [])
    released = bool(reads.sums) or "codes" in reads.per_device
    eps = epsilon(rates, joint(cfg, sigma, reads), delta(cfg)) if released else 0.0
    return {"dp_epsilon": eps if math.isfinite(eps) else float("inf"), "dp_delta": delta(cfg),
            "dp_sampling_rate": q, "dp_noise_multiplier": sigma}
