"""DC-PFL's constants and pure steps (:mod:`lcfed.methods.dcpfl`): :class:`DCPFLParams` (the paper's
values as defaults, and their validation), the model discrepancy (Eq. 3) and its layer-wise form (Eq. 5),
layers' aggregation intervals (Eq. 6), the average-linkage dendrogram and its cut, and the rapid-decrease
period's end (Sec. III-C). Each step is a function of arrays, tested by hand in tests/test_dcpfl.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class DCPFLParams:
    """Warm-up rounds averaging the discrepancy (T_start), smoothing window (s), rounds the knee must
    lie behind the latest round (t_obv), rounds before a rejected split is retried (t_sp), gamma~ step
    (λ_γ), base aggregation interval (τ), interval factor of low-discrepancy layers (α), low-layer
    ratio; the rapid-decrease detector's smallest drop (relative, and in noise standard deviations)
    and smallest bend (not in the paper: see :func:`rdp_end`)."""

    t_start: int = 5
    window: int = 5
    t_obv: int = 3
    t_sp: int = 6
    gamma_step: float = 0.2
    tau: int = 5
    alpha: int = 3
    low_ratio: float = 0.1
    min_drop: float = 0.05
    min_snr: float = 8.0
    min_bend: float = 0.25

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.t_start >= 1, f"{prefix}.t_start", self.t_start, "must be >= 1 (rounds averaging the discrepancy)")
        require(self.window >= 1, f"{prefix}.window", self.window, "must be >= 1")
        require(self.t_obv >= 1, f"{prefix}.t_obv", self.t_obv, "must be >= 1")
        require(self.t_sp >= 1, f"{prefix}.t_sp", self.t_sp, "must be >= 1")
        require(0 < self.gamma_step <= 1, f"{prefix}.gamma_step", self.gamma_step, "must be in (0, 1]")
        require(self.tau >= 1, f"{prefix}.tau", self.tau, "must be >= 1 (rounds)")
        require(self.alpha >= 1, f"{prefix}.alpha", self.alpha, "must be >= 1 (1 = no layer-wise aggregation)")
        require(self.low_ratio >= 0, f"{prefix}.low_ratio", self.low_ratio, "must be >= 0")
        require(0 <= self.min_drop < 1, f"{prefix}.min_drop", self.min_drop, "must be in [0, 1) (fraction of the loss)")
        require(self.min_snr >= 0, f"{prefix}.min_snr", self.min_snr, "must be >= 0 (noise standard deviations)")
        require(0 < self.min_bend < 1, f"{prefix}.min_bend", self.min_bend, "must be in (0, 1) (gap below the chord)")
        require(
            cfg.train.participation == 1,
            "train.participation",
            cfg.train.participation,
            "must be 1 for dcpfl (its loss curve and discrepancy matrix average over every device each round)",
        )
        require(
            cfg.data.holdout_fraction == 0,
            "data.holdout_fraction",
            cfg.data.holdout_fraction,
            "must be 0 for dcpfl (its discrepancy matrix and groups cover every device from the first round)",
        )



def minmax_scale(w: torch.Tensor) -> torch.Tensor:
    """S(w) = (w - min w) / (max w - min w) along the last axis, in float64; a constant row maps to 0."""
    x = w.double()
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    span = hi - lo
    return torch.where(span > 0, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(x))


def discrepancy_matrix(models: torch.Tensor) -> torch.Tensor:
    """Eq. 3 for every pair of rows of ``models`` (n, dim): ``|S(w_i) - S(w_j)|_1 / dim``."""
    s = minmax_scale(models)
    d = torch.cdist(s, s, p=1) / models.shape[1]
    d = (d + d.T) / 2  # exact symmetry and a zero diagonal for the condensed form
    return d.fill_diagonal_(0.0)


def layer_discrepancy(models: torch.Tensor, center: torch.Tensor, layers: Mapping[str, slice]) -> torch.Tensor:
    """Eq. 5: per layer, the mean over the rows of ``|S(w_l,i) - S(w_l^g)|_1 / dim_l`` (float64, (L,))."""
    out = []
    for sl in layers.values():
        dim = sl.stop - sl.start
        out.append((minmax_scale(models[:, sl]) - minmax_scale(center[sl])).abs().sum(1).mean() / dim)
    return torch.stack(out)


def layer_intervals(disc: np.ndarray, tau: int, alpha: int, low_ratio: float) -> np.ndarray:
    """Eq. 6 per group (rows) and layer (columns): ``alpha*tau`` where ``D_gl < low_ratio * mean_l D_gl``, else ``tau``."""
    d = np.asarray(disc, dtype=np.float64)
    low = d < low_ratio * d.mean(axis=1, keepdims=True)
    return np.where(low, alpha * tau, tau).astype(np.int64)


def due_layers(intervals: np.ndarray, since: int) -> np.ndarray:
    """Which (group, layer) pairs are aggregated in the ``since``-th round after a full synchronization."""
    return (since % intervals) == 0


def average_linkage(disc: torch.Tensor | np.ndarray) -> np.ndarray:
    """The hierarchical group graph: agglomerative clustering of a distance matrix, group distance =
    mean pairwise distance (scipy's linkage matrix, (n-1, 4))."""
    # imported here: scipy.cluster costs 0.4 s, paid by every host process that imports the methods
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform  # (the same)

    d = np.asarray(disc, dtype=np.float64)
    if d.shape[0] < 2:
        return np.zeros((0, 4))
    return linkage(squareform(d, checks=False), method="average")


def threshold_groups(tree: np.ndarray, gamma_tilde: float) -> np.ndarray:
    """Groups at normalized threshold gamma~: devices merged while their group distance is
    <= gamma~ * gamma_global; labels numbered in order of first appearance."""
    n = tree.shape[0] + 1
    top = float(tree[:, 2].max()) if tree.shape[0] else 0.0
    if n == 1 or top <= 0:
        return np.zeros(n, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster  # here, as in average_linkage: only the server pays for scipy

    raw = fcluster(tree, gamma_tilde * top, criterion="distance")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse].astype(np.int64)


def gamma_at(level: int, step: float) -> float:
    """gamma~ after ``level`` steps down from 1 (an integer level keeps the values exact)."""
    return max(0.0, 1.0 - level * step)


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal groupings up to renaming (both canonically numbered, so plain equality suffices)."""
    return bool(np.array_equal(a, b))


def next_split(tree: np.ndarray, groups: np.ndarray, level: int, step: float) -> tuple[int, np.ndarray] | None:
    """The first lower gamma~ level whose cut differs from ``groups``, or ``None`` if none does."""
    k = level + 1
    while 1.0 - k * step > -1e-9:
        labels = threshold_groups(tree, gamma_at(k, step))
        if not same_partition(labels, groups):
            return k, labels
        k += 1
    return None


def smoothed_losses(losses: Sequence[float], window: int) -> np.ndarray:
    """The paper's l_w: the mean of the last ``window`` losses, from the first full window on
    (entry j is l_w at round ``j + window - 1``)."""
    loss = np.asarray(losses, dtype=np.float64)
    if len(loss) < window:
        return np.zeros(0)
    return np.convolve(loss, np.ones(window) / window, mode="valid")


def noise_level(losses: Sequence[float]) -> float:
    """Round-to-round noise of a loss curve, robust to its trend: the standard deviation a Gaussian
    noise would have given the median absolute deviation of successive differences
    (``1.4826 * MAD(diff) / sqrt(2)``); 0 with fewer than 3 losses."""
    d = np.diff(np.asarray(losses, dtype=np.float64))
    if len(d) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def knee(curve: Sequence[float] | np.ndarray) -> tuple[int, float]:
    """The knee of a decreasing curve and its bend, with both axes normalized to [0, 1] over the
    given points: x_j = j / (n - 1), y_j = (c_j - min c) / (max c - min c). The knee is the point
    farthest below the chord from (0, 1) to (1, 0), the argmax of ``1 - x - y`` (Kneedle: where the
    normalized slope is -1, the turn from steep to flat); the bend is that largest gap: 0 for a
    straight line, towards 1 for a sharp L. Fewer than 3 points or a constant curve: ``(0, 0.0)``."""
    c = np.asarray(curve, dtype=np.float64)
    n = len(c)
    span = float(c.max() - c.min()) if n else 0.0
    if n < 3 or span <= 0:
        return 0, 0.0
    gap = (1 - np.arange(n) / (n - 1)) - (c - c.min()) / span
    j = int(np.argmax(gap))
    return j, float(gap[j])


def rdp_end(losses: Sequence[float], p: DCPFLParams) -> int | None:
    """Whether the rapid-decrease period that began with ``losses[0]`` has ended by the latest loss,
    and where: the round (index into ``losses``) of its knee, or ``None`` while it goes on.

    The smoothed loss l_w (window ``p.window``) is taken from its highest value (the decrease starts
    there) to the latest round; :func:`knee` normalizes that observed window, both axes to [0, 1].
    The period has ended when
    (1) the decrease is real: l_w fell from that peak by at least ``p.min_drop`` of the peak and by
    at least ``p.min_snr`` standard deviations of the smoothed noise (``noise_level / sqrt(window)``),
    so that a flat or noisy curve never ends a period;
    (2) the curve has flattened: it lies ``p.min_bend`` or more below its chord (a decrease still
    going at one pace is a straight line in these units, bend 0);
    (3) the knee is at least ``p.t_obv`` rounds old.
    For l = a exp(-t/s) + c, (2) holds once l_w spans about 2.1 s rounds (bend 0.25), with the knee
    near 0.87 s into it: both scale with s."""
    smooth = smoothed_losses(losses, p.window)
    if len(smooth) < 3:
        return None
    start = int(np.argmax(smooth))
    seg = smooth[start:]
    drop = float(seg[0] - seg.min())
    if drop < p.min_drop * abs(seg[0]) or drop < p.min_snr * noise_level(losses) / np.sqrt(p.window):
        return None
    j, bend = knee(seg)
    if bend < p.min_bend or j > len(seg) - 1 - p.t_obv:
        return None
    return start + j + p.window - 1
