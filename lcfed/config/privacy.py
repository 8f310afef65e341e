"""The ``privacy`` section: client-level differential privacy (DP-FedAvg, McMahan et al. 2018) and its
accounting, with the rules of its fields (:meth:`PrivacyConfig.validate`; those that need the population, in
:func:`check_privacy`)."""

from __future__ import annotations

from dataclasses import dataclass

from lcfed.errors import require

__all__ = ["PRIVACY_MODES", "PrivacyConfig", "check_count_noise", "check_privacy", "count_noise"]

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
    clip_quantile: float | None = None
    clip_lr: float = 0.2
    count_noise: float | None = None
    sample_noise: float | None = None
    sample_clip: float = 1.0
    sample_delta: float | None = None

    @property
    def sample_on(self) -> bool:
        """Whether each device trains with sample-level DP-SGD (per-sample clipping and noise), central mode or not."""
        return self.sample_noise is not None

    @property
    def adaptive(self) -> bool:
        """Whether the clip tracks a quantile of the update norms (Andrew et al. 2021) instead of staying fixed."""
        return self.on and self.clip_quantile is not None

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def validate(self, prefix: str = "privacy") -> None:
        require(self.mode in PRIVACY_MODES, f"{prefix}.mode", self.mode, f"must be one of {list(PRIVACY_MODES)}")
        if self.sample_noise is not None:
            require(0 < self.sample_noise <= 1e4, f"{prefix}.sample_noise", self.sample_noise,
                    "must be in (0, 1e4] (DP-SGD's noise std in units of privacy.sample_clip), or null for no "
                    "sample-level DP")
            require(self.sample_clip > 0, f"{prefix}.sample_clip", self.sample_clip,
                    "must be > 0 (the L2 norm each sample's gradient is clipped to)")
            if self.sample_delta is not None:
                require(0 < self.sample_delta < 1, f"{prefix}.sample_delta", self.sample_delta,
                        "must be in (0, 1), below 1/n of the smallest device's n samples (null: that n^-1.1)")
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
        if self.clip_quantile is not None:
            require(0 < self.clip_quantile < 1, f"{prefix}.clip_quantile", self.clip_quantile,
                    "must be in (0, 1) (the quantile of update norms the clip tracks), or null for a fixed clip")
            require(0 < self.clip_lr <= 10, f"{prefix}.clip_lr", self.clip_lr,
                    "must be in (0, 10] (the clip's geometric step: C <- C exp(-clip_lr (fraction within C - quantile)))")
            if self.count_noise is not None:
                require(0 < self.count_noise <= 1e9, f"{prefix}.count_noise", self.count_noise,
                        "must be in (0, 1e9] (the std of the noise on the count of updates within the clip), or null "
                        "for the cohort / 20")


def count_noise(privacy: PrivacyConfig, cohort: int) -> float:
    """σ_b, the std of the noise on a round's count of updates within the clip: ``privacy.count_noise``, or the
    cohort over 20 (Andrew et al. 2021's choice), the noise cohort's where one is simulated."""
    if privacy.count_noise is not None:
        return float(privacy.count_noise)
    return (privacy.noise_cohort or cohort) / 20


def check_count_noise(privacy: PrivacyConfig, sigma: float, sums: int, cohort: int, prefix: str = "privacy") -> None:
    """σ_b must leave the sums a finite noise multiplier: the count spends a share of the round's σ, so
    ``2 σ_b sqrt(sums) > σ`` (:func:`lcfed.methods.privacy.update_multiplier`)."""
    if not privacy.adaptive or not sums:
        return
    sigma_b = count_noise(privacy, cohort)
    require(2 * sigma_b * sums ** 0.5 > sigma, f"{prefix}.count_noise", sigma_b,
            f"must be > {sigma / (2 * sums ** 0.5):.4g} for a noise multiplier of {sigma:.4g} over {sums} sum(s): "
            "the noised count would spend all of it (null: the cohort / 20)")


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
