"""Privacy accounting with Google's ``dp-accounting`` (imported only here, and only when privacy is on): each
round is a Poisson-sampled Gaussian mechanism at the round's sampling rate, composed over the rounds; the noise
multiplier that reaches a target ε; the multiplier of several Gaussian releases of one device taken together.

Never a hand-written accountant: RDP (the default) and PLD are the library's.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

__all__ = ["ACCOUNTANTS", "epsilon", "joint_multiplier", "sample_epsilon", "solve_multiplier", "update_multiplier"]

#: ``accountant`` names: Rényi DP (Mironov 2017; what TF-privacy's tables use) or privacy loss distributions
ACCOUNTANTS = ("rdp", "pld")


def joint_multiplier(multipliers: Iterable[float]) -> float:
    """One Gaussian mechanism equal to several on the same device's data, each of sensitivity 1 at its noise
    multiplier: ``(Σ 1/σ_j²)^(-1/2)`` (their concatenation has sensitivity √n at per-coordinate std σ_j)."""
    inv = sum(1.0 / (s * s) for s in multipliers)
    return math.inf if inv == 0 else 1.0 / math.sqrt(inv)


def update_multiplier(sigma: float, count_std: float, sums: int = 1) -> float:
    """The noise multiplier σ_Δ of each of ``sums`` sums when a noised count of std ``count_std`` (sensitivity 1/2)
    is released beside them, such that the round's joint release stays that of ``sums`` sums at ``sigma``:
    ``(σ^-2 − (2 σ_b)^-2 / sums)^(-1/2)``; for one sum Andrew et al. 2021's Theorem 1. Raises ValueError when the
    count alone would spend it all (``2 σ_b sqrt(sums) <= σ``)."""
    inv = sigma ** -2 - (2.0 * count_std) ** -2 / sums
    if inv <= 0:
        raise ValueError(f"a count noise of {count_std:.4g} spends all of σ = {sigma:.4g} over {sums} sum(s)")
    return 1.0 / math.sqrt(inv)


def _accountant(kind: str) -> Any:
    import dp_accounting  # lazy: only runs with privacy on import it

    if kind == "pld":
        return dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    return dp_accounting.rdp.RdpAccountant()


def _event(rates: Sequence[float], multiplier: float) -> Any:
    import dp_accounting

    events = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), n)
        for q, n in sorted(Counter(rates).items())]
    return dp_accounting.ComposedDpEvent(events)


def epsilon(rates: Sequence[float], multiplier: float, delta: float, kind: str = "rdp") -> float:
    """ε after the rounds whose sampling rates are ``rates`` (one per round, each a Poisson-sampled Gaussian of
    noise multiplier ``multiplier``), at ``delta``. 0 for no rounds, inf for no noise."""
    if not rates:
        return 0.0
    if math.isinf(multiplier):
        return 0.0
    return _epsilon(tuple(float(q) for q in rates), float(multiplier), float(delta), kind)


@contextmanager
def _quiet() -> Iterator[None]:
    """dp-accounting logs a warning for each fractional RDP order it drops at large sampling rates (harmless: the
    other orders bound ε), every round: keep them off the run's console."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@lru_cache(maxsize=256)
def _epsilon(rates: tuple[float, ...], multiplier: float, delta: float, kind: str) -> float:
    with _quiet():
        acc = _accountant(kind)
        acc.compose(_event(rates, multiplier))
        return float(acc.get_epsilon(delta))


@lru_cache(maxsize=64)
def solve_multiplier(target_epsilon: float, delta: float, rate: float, rounds: int, kind: str = "rdp") -> float:
    """The smallest noise multiplier whose ``rounds`` rounds at sampling rate ``rate`` stay within
    ``target_epsilon`` at ``delta`` (dp-accounting's calibration, to 1e-4 of the multiplier)."""
    import dp_accounting

    with _quiet():
        return float(dp_accounting.calibrate_dp_mechanism(
            lambda: _accountant(kind), lambda s: _event([rate] * rounds, s), target_epsilon, delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))


def sample_epsilon(steps: Iterable[tuple[float, int]], multiplier: float, delta: float) -> float:
    """Sample-level DP-SGD: the largest ε over devices, each given as (its sampling rate b/n, the DP-SGD steps it
    took), each step a Poisson-sampled Gaussian of noise multiplier ``multiplier``. Only devices no other device
    dominates (a higher rate and more steps) are computed: ε grows with both."""
    front: list[tuple[float, int]] = []
    for q, count in sorted(set(steps), key=lambda p: (-p[0], -p[1])):
        if count > 0 and (not front or count > front[-1][1]):
            front.append((q, count))
    return max((_sampled(q, count, float(multiplier), float(delta)) for q, count in front), default=0.0)


@lru_cache(maxsize=1024)
def _sampled(q: float, count: int, multiplier: float, delta: float) -> float:
    import dp_accounting

    with _quiet():
        acc = _accountant("rdp")
        acc.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), count))
        return float(acc.get_epsilon(delta))
