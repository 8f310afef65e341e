"""How well a clustering recovers known groups: the adjusted Rand index and normalized mutual information
of the devices' cluster assignment against their true groups (a testbed's ``Partition.groups``).

Both are invariant to how clusters are numbered, 1 for a perfect recovery; ARI is about 0 for a random
assignment (and may go negative), NMI is 0 for an independent one. Pure functions over arrays, no
state; scikit-learn computes both (imported on first use: it costs seconds).

The round loop would call :func:`recovery_scores` on each round's assignment
(``RoundStats.assignment``, -1 for devices never assigned) against ``Federation.groups`` where the
partition's ``group_kind`` says they are true clusters, and log ``ari`` / ``nmi`` as metrics.
"""

from __future__ import annotations

import numpy as np

__all__ = ["adjusted_rand_index", "normalized_mutual_info", "recovery_scores"]


def _pair(assignment: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, t = np.asarray(assignment), np.asarray(truth)
    if a.ndim != 1 or a.shape != t.shape:
        raise ValueError(f"assignment and truth must be 1-d arrays of one entry per device, got {a.shape} and {t.shape}")
    if len(a) == 0:
        raise ValueError("no devices to score")
    return a, t


def adjusted_rand_index(assignment: np.ndarray, truth: np.ndarray) -> float:
    """Adjusted Rand index (Hubert & Arabie, 1985) of ``assignment`` against ``truth``, one label per device:
    the Rand index (share of device pairs both put together or both apart) corrected for chance.

    scikit-learn's ``adjusted_rand_score`` to the bit (its pair confusion matrix in integers, then its one
    float expression), without importing ``sklearn.metrics`` on the driver: ~130 MB and a second there."""
    a, t = _pair(assignment, truth)
    _, ti = np.unique(t, return_inverse=True)
    _, ai = np.unique(a, return_inverse=True)
    n_c, n_k = np.bincount(ti).astype(np.int64), np.bincount(ai).astype(np.int64)
    cell = ti.astype(np.int64) * len(n_k) + ai
    counts = np.bincount(cell)
    used = np.flatnonzero(counts)  # the contingency table's nonzero cells
    c = counts[used].astype(np.int64)
    n = len(t)
    squares = int((c**2).sum())
    fp = int((c * n_k[used % len(n_k)]).sum()) - squares
    fn = int((c * n_c[used // len(n_k)]).sum()) - squares
    tp = squares - n
    tn = n * n - fp - fn - squares
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


def normalized_mutual_info(assignment: np.ndarray, truth: np.ndarray) -> float:
    """Mutual information of ``assignment`` and ``truth`` over the arithmetic mean of their entropies
    (scikit-learn's default normalization); 1 when either determines the other, 0 when independent."""
    from sklearn.metrics import normalized_mutual_info_score  # (the same)

    a, t = _pair(assignment, truth)
    return float(normalized_mutual_info_score(t, a))


def recovery_scores(assignment: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """``{"ari": ..., "nmi": ...}`` over the devices with an assignment (entries >= 0; -1 = never assigned,
    as methods report devices that have not trained yet); empty if no device is assigned."""
    a, t = _pair(assignment, truth)
    seen = a >= 0
    if not seen.any():
        return {}
    return {"ari": adjusted_rand_index(a[seen], t[seen]), "nmi": normalized_mutual_info(a[seen], t[seen])}
