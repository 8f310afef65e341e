"""Run metrics: personalized accuracy over devices, clustering quality, communication."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lcfed.learning.local_update import EvalResult

#: the standard normal quantile of a two-sided 95 % interval
Z95 = 1.959963984540054


def sampled_mean_ci95(acc: np.ndarray, population: int) -> float:
    """Half-width of the 95 % interval of the mean of ``population`` values estimated from ``acc``, a simple
    random sample of them drawn without replacement: ``Z95 * s / sqrt(n) * sqrt((N - n) / (N - 1))`` (the
    sample's standard deviation, the finite-population correction, the normal approximation); 0 when the
    sample is the whole population."""
    n = len(acc)
    if n < 2 or n >= population:
        return 0.0
    return float(Z95 * np.std(acc, ddof=1) / np.sqrt(n) * np.sqrt((population - n) / (population - 1)))


def accuracy_metrics(results: Mapping[int, EvalResult], trained: np.ndarray | None = None) -> dict[str, float]:
    """Mean (unweighted and sample-weighted) and 10th/90th percentile of per-device test accuracy,
    and with a validation split the means and loss on it (``val_acc_mean``, ``val_acc_weighted``,
    ``val_loss``).

    Only devices that have trained at least once (``trained[d]``; all if None) count: under partial
    participation the others would be scored with fallback models they never shaped. Devices without
    test samples are left out. The weighted mean is steadier: devices with a dozen samples make the
    unweighted mean jump between evaluations. When ``results`` hold a sample of the trained devices (not
    every one), ``acc_mean_ci95`` is the half-width of ``acc_mean``'s 95 % interval
    (:func:`sampled_mean_ci95`).
    """
    rows = [r for d, r in results.items() if r.total > 0 and (trained is None or trained[d])]
    if not rows:
        return {}
    acc = np.array([r.correct / r.total for r in rows])
    correct = sum(r.correct for r in rows)
    total = sum(r.total for r in rows)
    out = {
        "acc_mean": float(acc.mean()),
        "acc_weighted": correct / total,
        "acc_std": float(acc.std()),
        "acc_p10": float(np.percentile(acc, 10)),
        "acc_p90": float(np.percentile(acc, 90)),
        "test_loss": sum(r.loss_sum for r in rows) / total,
    }
    population = len(results) if trained is None else int(np.count_nonzero(trained))
    scored = sum(1 for d in results if trained is None or trained[d])
    if scored < population:  # a sample of the devices the metrics count
        out["acc_mean_ci95"] = sampled_mean_ci95(acc, population)
    # the same devices on their validation sets (every device keeps one when the split is on)
    val = [r.val for r in rows if r.val is not None and r.val.total > 0]
    if val:
        val_total = sum(v.total for v in val)
        out.update({
            "val_acc_mean": float(np.mean([v.correct / v.total for v in val])),
            "val_acc_weighted": sum(v.correct for v in val) / val_total,
            "val_loss": sum(v.loss_sum for v in val) / val_total,
        })
    return out


def label_homogeneity(label_dist: np.ndarray, labels: np.ndarray) -> float:
    """How much of the spread of the devices' label distributions the clustering explains.

    ``1 - W / T`` with ``T = sum_i ||p_i - mean p||^2`` over devices and ``W`` the same sum around
    each device's cluster mean (an R^2 of the label distributions ``p_i``): 1 when every cluster
    holds devices with identical label distributions, 0 when the clusters are no better than one.
    Unlike ARI it needs no ground-truth group ids, so it means the same under every partition
    (pathological class sets outnumber any K); like any R^2 it rises with K, so compare at equal K.
    A federation whose devices all share one distribution (T = 0) scores 1.
    """
    p = np.asarray(label_dist, dtype=np.float64)
    total = float(((p - p.mean(axis=0)) ** 2).sum())
    within = 0.0
    for c in np.unique(labels):
        members = p[labels == c]
        within += float(((members - members.mean(axis=0)) ** 2).sum())
    return 1.0 if total <= 1e-12 else max(0.0, 1.0 - within / total)


def cluster_sizes(assignment: np.ndarray, k: int) -> np.ndarray:
    """Devices per cluster (unassigned devices, -1, are not counted)."""
    return np.bincount(assignment[assignment >= 0], minlength=k)
