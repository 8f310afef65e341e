"""Statistics for comparing methods over seeds: means with Student-t confidence intervals and paired
tests (SciPy's), so a reported difference says whether it is larger than the spread between seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """``mean ± half`` at ``level`` over ``n`` values (``half`` is nan for n < 2: no spread to measure)."""

    mean: float
    half: float
    n: int
    level: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    def format(self, scale: float = 1.0, digits: int = 2) -> str:
        """``96.31 ± 0.42`` (``scale=100`` for accuracies as percentages); ``96.31`` when n < 2."""
        if math.isnan(self.half):
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.half * scale:.{digits}f}"


def mean_ci(values: Sequence[float], level: float = 0.95) -> Interval:
    """The mean and the half-width of its Student-t confidence interval: t_{(1+level)/2, n-1} · s / √n."""
    from scipy import stats  # scipy (0.3 s to import) only for the reports that test

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level {level}: must be in (0, 1)")
    if x.size < 2:
        return Interval(float(x.mean()), math.nan, int(x.size), level)
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Interval(float(x.mean()), half, int(x.size), level)


@dataclass(frozen=True)
class PairedTest:
    """``a - b`` paired by seed (or device): the mean difference with its interval, the paired t-test's
    two-sided p-value, and the Wilcoxon signed-rank test's (nan where it cannot be computed: fewer
    than 2 pairs, or every difference 0)."""

    diff: Interval
    t_p: float
    wilcoxon_p: float

    @property
    def n(self) -> int:
        return self.diff.n


def paired_test(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedTest:
    """Compare two methods measured on the same seeds (``a[i]`` and ``b[i]`` share seed ``i``)."""
    from scipy import stats  # scipy (0.3 s to import) only for the reports that test

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_test needs two equal-length sequences, got {x.shape} and {y.shape}")
    d = x - y
    diff = mean_ci(d.tolist(), level)
    # differences equal up to rounding (0.6 - 0.5 vs 0.7 - 0.6) have no spread to test against
    tiny = 1e-12 * max(1.0, float(np.abs(d).max(initial=0.0)))
    if d.size < 2 or float(np.abs(d).max()) <= tiny:
        return PairedTest(diff, math.nan, math.nan)
    if float(d.std(ddof=1)) <= tiny:  # the same nonzero difference on every pair: t is infinite
        return PairedTest(diff, 0.0, float(stats.wilcoxon(d).pvalue))
    return PairedTest(diff, float(stats.ttest_rel(x, y).pvalue), float(stats.wilcoxon(d).pvalue))
