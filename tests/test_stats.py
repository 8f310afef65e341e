"""Confidence intervals and paired tests on fixed numbers: by hand, and against SciPy."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from lcfed.learning.stats import mean_ci, paired_test


def test_mean_ci_by_hand():
    # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302652729749464 -> half = 4.3027 / sqrt(3)
    ci = mean_ci([1.0, 2.0, 3.0])
    assert ci.mean == 2.0 and ci.n == 3
    assert ci.half == pytest.approx(4.302652729749464 / math.sqrt(3), rel=1e-12)
    assert (ci.low, ci.high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    assert ci.half == pytest.approx(stats.t.ppf(0.975, 2) / math.sqrt(3), rel=1e-12)
    assert ci.format() == "2.00 ± 2.48"
    assert mean_ci([0.9631, 0.9612], 0.9).format(scale=100) == "96.22 ± 0.60"  # t_{0.95,1} = 6.3138, s = 0.00134
    one = mean_ci([0.5])
    assert one.mean == 0.5 and math.isnan(one.half) and one.format(100) == "50.00"


def test_mean_ci_matches_scipy_interval():
    x = [0.91, 0.935, 0.902, 0.948, 0.921]
    ci = mean_ci(x, 0.99)
    low, high = stats.t.interval(0.99, len(x) - 1, loc=sum(x) / len(x), scale=stats.sem(x))
    assert (ci.low, ci.high) == pytest.approx((low, high), rel=1e-12)


def test_paired_test_by_hand_and_against_scipy():
    a, b = [1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 1.0, 2.0]
    # differences 1, 0, 2, 2: mean 1.25, s = sqrt(2.75 / 3), t = 1.25 / (s / 2) = 2.6112, df 3
    res = paired_test(a, b)
    s = math.sqrt(2.75 / 3)
    assert res.diff.mean == 1.25 and res.n == 4
    assert res.diff.half == pytest.approx(stats.t.ppf(0.975, 3) * s / 2, rel=1e-12)
    assert res.t_p == pytest.approx(2 * stats.t.sf(1.25 / (s / 2), 3), rel=1e-12)
    assert res.t_p == pytest.approx(0.07955, abs=1e-4)
    assert res.wilcoxon_p == pytest.approx(stats.wilcoxon(a, b).pvalue, rel=1e-12)
    swapped = paired_test(b, a)
    assert swapped.diff.mean == -1.25 and swapped.t_p == pytest.approx(res.t_p, rel=1e-12)


def test_paired_test_edge_cases():
    same = paired_test([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert same.diff.mean == 0.0 and math.isnan(same.t_p) and math.isnan(same.wilcoxon_p)
    shift = paired_test([0.6, 0.7, 0.8], [0.5, 0.6, 0.7])  # the same difference on every seed
    assert shift.diff.mean == pytest.approx(0.1) and shift.t_p == 0.0
    single = paired_test([0.6], [0.5])
    assert single.n == 1 and math.isnan(single.t_p) and math.isnan(single.diff.half)
    with pytest.raises(ValueError, match="equal-length"):
        paired_test([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="at least one"):
        mean_ci([])
