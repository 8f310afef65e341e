"""Central client-level DP on the server's aggregates (DP-FedAvg, McMahan et al. 2018), once for every method:
:class:`CentralDP` is what :meth:`Strategy.private_mean` and :meth:`Strategy.private_means` call under
``privacy.mode: central``; :func:`noise_multiplier` is σ, given or solved for ``train.rounds``;
:func:`planned_rate` the sampling rate σ is solved at (docs/privacy.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import ConfigError
from lcfed.learning.privacy import count_within, noised_fraction, private_means
from lcfed.methods.round import Federation, ServerReads

if TYPE_CHECKING:  # annotations only: the config is read, never built, here
    from lcfed.config import ExperimentConfig

__all__ = ["CentralDP", "ClipTally", "delta", "joint", "noise_multiplier", "planned_rate"]


def _cohort(cfg: ExperimentConfig) -> int:
    from lcfed.config import devices_per_round

    return devices_per_round(cfg)


def planned_rate(cfg: ExperimentConfig) -> float:
    """The sampling rate a target ε is solved at: the cohort over the training devices; with the device model, over
    those online (``devices.online_fraction``) and with over-commitment's extra selections."""
    rate = _cohort(cfg) / cfg.data.training_devices
    if cfg.devices.simulate:
        rate *= (1 + cfg.devices.overcommit) / cfg.devices.online_fraction
    return min(1.0, rate)


def delta(cfg: ExperimentConfig) -> float:
    """``privacy.delta``, or population^-1.1 (below 1/population, as δ must be)."""
    return cfg.privacy.delta if cfg.privacy.delta is not None else float(cfg.data.training_devices) ** -1.1


def joint(cfg: ExperimentConfig, sigma: float, reads: ServerReads) -> float:
    """The noise multiplier of a round's releases of one device taken together: one Gaussian of σ per sum it
    takes part in, and its locally noised code (``privacy.code_noise``) where the server reads codes."""
    from lcfed.learning.accounting import joint_multiplier

    parts = [sigma] * len(reads.sums) + ([cfg.privacy.code_noise] if "codes" in reads.per_device else [])
    return joint_multiplier(parts)


def noise_multiplier(cfg: ExperimentConfig, reads: ServerReads) -> float:
    """σ of every sum: ``privacy.noise_multiplier``, or the smallest σ whose ``train.rounds`` rounds at
    :func:`planned_rate` reach ``privacy.target_epsilon`` (for the joint release of :func:`joint`)."""
    p = cfg.privacy
    if p.noise_multiplier is not None:
        return float(p.noise_multiplier)
    assert p.target_epsilon is not None
    from lcfed.learning.accounting import solve_multiplier

    target = solve_multiplier(p.target_epsilon, delta(cfg), planned_rate(cfg), cfg.train.rounds)
    if not reads.sums:
        return target
    # joint = target: the sums' σ with the code's share taken out
    code = p.code_noise if "codes" in reads.per_device else float("inf")
    inv = target ** -2 - code ** -2
    if inv <= 0:
        raise ConfigError("privacy.code_noise", code, f"must be larger: the codes' noise alone spends more than "
                          f"privacy.target_epsilon = {p.target_epsilon} (it needs a joint multiplier of {target:.3g})")
    return float((len(reads.sums) / inv) ** 0.5)


class ClipTally:
    """Adaptive clipping's count in one aggregation: the updates within the clip in the round's stream-0 sum
    (None: no such sum). Made by the server for one ``aggregate`` call and dropped after it, never kept on a
    strategy."""

    def __init__(self) -> None:
        self.within: int | None = None

    def add(self, within: int) -> None:
        self.within = (self.within or 0) + within


@dataclass(frozen=True)
class CentralDP:
    """The server's private aggregation: clip each update to ``clip`` (per layer with ``layers``), add
    N(0, (σ·clip·cohort/noise_cohort)²) to each sum, divide by the expected cohort. Under adaptive clipping
    (``privacy.clip_quantile``) the server sets each round's clip with :meth:`at`: ``multiplier`` is then the sums'
    std per unit of clip (σ_Δ, scaled), ``count_std`` the std of the noise on the count."""

    clip: float
    sum_std: float
    cohort: int
    seed: int
    layers: tuple[slice, ...] = ()
    multiplier: float = 0.0
    count_std: float = 0.0
    tally: ClipTally | None = None

    @classmethod
    def of(cls, cfg: ExperimentConfig, fed: Federation, reads: ServerReads) -> CentralDP | None:
        """The run's, or None with ``privacy.mode: off``."""
        p = cfg.privacy
        if not p.on:
            return None
        cohort = _cohort(cfg)
        sigma = noise_multiplier(cfg, reads)
        # a noise cohort N' simulates a deployment of N' devices: the mean's noise shrinks by cohort / N'
        scale = cohort / p.noise_cohort if p.noise_cohort else 1.0
        layers = tuple(fed.spec.layers().values()) if p.per_layer else ()
        if not (p.adaptive and reads.sums):
            return cls(p.clip, sigma * p.clip * scale, cohort, cfg.seed, layers)
        from lcfed.config.privacy import check_count_noise, count_noise
        from lcfed.learning.accounting import update_multiplier

        check_count_noise(p, sigma, len(reads.sums), cohort)  # a solved σ is known only now
        sigma_b = count_noise(p, cohort)
        # the count spends a share of σ: each sum is noised at σ_Δ > σ, so the round's release stays σ's
        sigma_d = update_multiplier(sigma, sigma_b, len(reads.sums))
        return cls(p.clip, sigma_d * p.clip * scale, cohort, cfg.seed, layers, sigma_d * scale, sigma_b * scale)

    def at(self, clip: float, tally: ClipTally) -> CentralDP:
        """This aggregation at adaptive clipping's round clip ``clip``, counting into ``tally``."""
        return replace(self, clip=clip, sum_std=self.multiplier * clip, tally=tally)

    def fraction(self, rnd: int, within: int) -> float:
        """b̄, the noised fraction of the round's updates within the clip, over the expected cohort."""
        return noised_fraction(within, self.count_std, self.cohort, self.seed, rnd)

    def _count(self, stream: int, models: torch.Tensor, labels: np.ndarray, previous: torch.Tensor) -> None:
        if self.tally is not None and stream == 0:  # one count per round: the stream-0 sum's devices
            self.tally.add(count_within(models, labels, previous, self.clip))

    def means(self, rnd: int, models: torch.Tensor, labels: np.ndarray, previous: torch.Tensor,
              public_labels: bool = False, stream: int = 0) -> torch.Tensor:
        """Each cluster's private mean. The denominators: each cluster's count among the round's devices where
        the labels are public (a function of locally noised codes), else the expected cohort over K, which no
        device's choice changes."""
        k = previous.shape[0]
        self._count(stream, models, labels, previous)
        if not public_labels:
            den = torch.full((k,), max(self.cohort / k, 1.0), dtype=torch.float64)
            return private_means(models, labels, previous, self.clip, self.sum_std, den, self.seed, rnd, stream,
                                 self.layers)
        counts = np.bincount(labels, minlength=k).astype(np.float64)
        den = torch.from_numpy(np.maximum(counts * self.cohort / max(len(labels), 1), 1.0))
        out = private_means(models, labels, previous, self.clip, self.sum_std, den, self.seed, rnd, stream, self.layers)
        # a cluster no one joined is known to be empty from the public labels: it keeps its model, unnoised
        empty = torch.from_numpy(counts == 0)
        out[empty] = previous[empty]
        return out

    def mean(self, rnd: int, models: torch.Tensor, previous: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """The private mean of one global model (``previous``: the model the round started from)."""
        labels = np.zeros(models.shape[0], dtype=np.int64)
        self._count(stream, models, labels, previous[None])
        layers = tuple(sl for sl in self.layers if sl.stop <= models.shape[1])  # the embedding's, for φ alone
        den = torch.tensor([float(self.cohort)], dtype=torch.float64)
        return private_means(models, labels, previous[None], self.clip, self.sum_std, den, self.seed, rnd, stream,
                             layers)[0]
