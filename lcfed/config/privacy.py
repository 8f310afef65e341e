"""The ``privacy`` section: client-level differential privacy (DP-FedAvg, McMahan et al. 2018) and its
accounting, with the rules of its fields (:meth:`PrivacyConfig.validate`; those that need the population, in
:func:`check_privacy`)."""

from __future__ import annotations

from dataclasses import dataclass

from lcfed.errors import require

__all__ = ["PRIVACY_MODES", "PrivacyConfig", "check_privacy"]

#: ``privacy.mode``: off (no clipping, no noise: runs as without the section) or central (the server's
#: aggregates are clipped and noised; docs/privacy.md)
PRIVACY_MODES = ("off", "central")


@dataclass(frozen=True)
class PrivacyConfig:
    """Client-level DP: each device's update clipped to ``clip``, Gaussian noise of ``noise_multiplier`` · clip
    on every aggregate sum, (ε, δ) accounted every round."""

    mode: str = "off"
    clip: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float | None = None
    per_layer: bool = False
    noise_cohort: int = 0
    code_noise: float = 1.0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def validate(self, prefix: str = "privacy") -> None:
        require(self.mode in PRIVACY_MODES, f"{prefix}.mode", self.mode, f"must be one of {list(PRIVACY_MODES)}")
        if not self.on:
            return
        require(self.clip > 0, f"{prefix}.clip", self.clip, "must be > 0 (the L2 norm C each device's update is clipped to)")
        require((self.noise_multiplier is None) != (self.target_epsilon is None), f"{prefix}.noise_multiplier",
                self.noise_multiplier, "set exactly one of privacy.noise_multiplier (σ) and privacy.target_epsilon "
                "(σ solved for train.rounds)")
        if self.noise_multiplier is not None:
            require(0 < self.noise_multiplier <= 1e4, f"{prefix}.noise_multiplier", self.noise_multiplier,
                    "must be in (0, 1e4] (the noise's std in units of privacy.clip)")
        if self.target_epsilon is not None:
            require(0 < self.target_epsilon <= 1e3, f"{prefix}.target_epsilon", self.target_epsilon,
                    "must be in (0, 1000] (the ε to reach after train.rounds)")
        require(0 < self.code_noise <= 1e4, f"{prefix}.code_noise", self.code_noise,
                "must be in (0, 1e4] (local noise on a unit-norm code, in units of its sensitivity 2)")
        require(self.noise_cohort >= 0, f"{prefix}.noise_cohort", self.noise_cohort, "must be 0 (the real cohort) or >= 1")


def check_privacy(privacy: PrivacyConfig, population: int, cohort: int, prefix: str = "privacy") -> None:
    """The rules that need the run's population (training devices) and cohort (devices per round)."""
    if not privacy.on:
        return
    if privacy.delta is not None:
        require(0 < privacy.delta < 1 / population, f"{prefix}.delta", privacy.delta,
                f"must be in (0, 1/population) = (0, {1 / population:.3g}) for a population of {population} training "
                "devices (null: population^-1.1)")
    if privacy.noise_cohort:
        require(privacy.noise_cohort >= cohort, f"{prefix}.noise_cohort", privacy.noise_cohort,
                f"must be 0 or >= the real cohort ({cohort} devices per round): it simulates a larger deployment's noise")
