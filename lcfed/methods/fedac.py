"""FedAC: LCFed's clustered training plus Cluster Number Tuning (CNT), so K changes during the run.

Zhang, Chen, Lin, Chen, Zhao, "FedAC: An Adaptive Clustered Federated Learning Framework for
Heterogeneous Data", arXiv:2403.16460, 2024.

Everything of Alg. 1 but line 13 is :class:`~lcfed.methods.lcfed.LCFed` (``docs/methods.md``): the local
objective of Eq. 3, Φ, the PCA projector M refit sparsely (Alg. 2; the paper's "e.g. every 100
rounds" is the default), the E-step argmax_k LrCos (Eq. 4 writes argmin, a typo) against the previous
round's centers, and the M-step of Eq. 5. After the M-step, CNT (Alg. 3) computes a gap ratio G_k
per cluster, merges k into its nearest cluster when G_k < a (``gap_low``) and splits k in two when
G_k > b (``gap_high``); the paper's range is (a, b) = (0.2, 0.8) (§5.5). LCFed's ``coverage`` (the first
clustering waits for a share of the devices to be seen) applies as is; CNT starts once it has clustered.

The gap ratio follows Alg. 3: squared L2 over the full models, each center the mean of all its
members' latest models (Eq. 5 over i in [m]). With R_ik = 1 when device i is in cluster k, n_k = Σ_i R_ik
and ω_i the latest model device i uploaded (a device not sampled this round keeps its last one):

    Ω_k            = (1/n_k) Σ_i R_ik ω_i
    Dist_intra^k   = (1/n_k) Σ_i R_ik ‖ω_i − Ω_k‖²
    Dist_inter^k   = 1/(K−1) Σ_{j≠k} ‖Ω_k − Ω_j‖²      (the mean over the other K−1 centers)
    G_k            = Dist_intra^k / Dist_inter^k.

The thresholds a, b belong to this scale. (Measured on the low-rank codes instead, G came out 1.4-3x
smaller: 0.18-0.54 against 0.41-0.77 on digits, 20 devices, K = 4, D = 5, so clusters merged where
Alg. 3 changes nothing.)

Where the paper is unclear, this module decides:

- Whose models: devices already upload their full ω_i (LCFed's message: ω_i and its code); the server
  keeps each device's latest upload (``FedACState.models``, references to the uploaded tensors, m
  models at most). Every assigned device has one: a device is assigned when it uploads. Ω_k of the
  gap ratio is this all-member mean, not LCFed's training center (the mean of the members that took
  part this round), which CNT leaves alone for clusters it does not change.
- Empty clusters: dropped before the G's (a merge with nobody to move), K permitting; one kept because
  K = ``min_clusters`` has G = NaN (no change). A lone device's cluster has Dist_intra = 0, so it merges;
  it can never be split. Coincident centers give G = inf (split) or NaN (no spread either).
- When: after the aggregation of round ``tune_start`` and every ``tune_every`` rounds after it
  (Alg. 1 runs CNT every round: ``tune_every = 1``; 0 turns CNT off). K stays in [``min_clusters``,
  ``max_clusters``]; ``min_clusters >= 2`` because Dist_inter needs a second cluster.
- Order: every G_k is computed first, then Alg. 3's loop runs over k in index order; a cluster takes
  part in at most one change per tuning (an absorbing or split cluster is not revisited), so merges
  do not cascade.
- Merge: k's devices join the cluster j with the nearest Ω_j (squared L2; ties: lower index; never one
  removed or split in this tuning); the merged center is the mean of the union's latest models
  ((n_j Ω_j + n_k Ω_k) / (n_j + n_k), Eq. 5).
- Split ("initializing two new centers and conducting one re-clustering iteration", §4.5): the two
  new centers start at the codes P(ω_i) of the two members farthest apart (squared L2 of the codes;
  ties: first pair). One E-step by LrCos follows (ties to the first seed), then one M-step: each half's
  center is the mean of its members' latest models. Half 0 keeps index k, half 1 is appended. A split
  whose E-step leaves a half empty (all codes parallel) is skipped.
- After a tuning the clusters are renumbered (survivors in order, then new ones) so that K = number
  of centers, which :class:`RoundStats` reports as ``num_clusters`` every round.
- Cost: the server holds up to m models (m dim floats, also in checkpoints); a tuning is O(m dim)
  plus K² dim for the center distances, with K float64 centers alive while it runs.
- Communication: as LCFed (``configure`` is inherited); CNT is server-side, and a device whose
  cluster changed simply downloads its new cluster's center next time it takes part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import assign_by_cosine
from lcfed.learning.similarity import Projector, sq_dist_matrix
from lcfed.methods.base import RoundPlan, RoundStats, ServerReads
from lcfed.methods.lcfed import LCFed, LCFedMessage, LCFedParams, LCFedState

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class FedACParams(LCFedParams):
    """LCFed's μ, λ, K (here the initial K), D, S_d and refit period, plus Cluster Number Tuning:
    thresholds a = ``gap_low`` < b = ``gap_high`` on G, bounds on K, and when tuning runs."""

    refit_every: int = 100  # the paper's example of a sparse refit of M (§4.3)
    gap_low: float = 0.2
    gap_high: float = 0.8
    min_clusters: int = 2
    max_clusters: int = 20
    tune_every: int = 1
    tune_start: int = 0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        super().validate(cfg, prefix)
        require(self.gap_low > 0, f"{prefix}.gap_low", self.gap_low, "must be > 0 (a, the merge threshold on G)")
        require(
            self.gap_high > self.gap_low,
            f"{prefix}.gap_high",
            self.gap_high,
            f"must be > gap_low = {self.gap_low} (b, the split threshold on G)",
        )
        require(
            self.min_clusters >= 2,
            f"{prefix}.min_clusters",
            self.min_clusters,
            "must be >= 2 (Dist_inter needs a second cluster)",
        )
        require(
            self.min_clusters <= self.num_clusters,
            f"{prefix}.min_clusters",
            self.min_clusters,
            f"must be <= num_clusters = {self.num_clusters} (the initial K)",
        )
        require(
            self.max_clusters >= self.num_clusters,
            f"{prefix}.max_clusters",
            self.max_clusters,
            f"must be >= num_clusters = {self.num_clusters} (the initial K)",
        )
        require(self.tune_every >= 0, f"{prefix}.tune_every", self.tune_every, "must be >= 0 (0 = never tune K)")
        require(
            self.tune_start >= 0, f"{prefix}.tune_start", self.tune_start, "must be >= 0 (first round that may tune K)"
        )


@dataclass(frozen=True)
class FedACState(LCFedState):
    # each device's latest uploaded full model ω_i (None before its first upload): Alg. 3's input
    models: tuple[torch.Tensor | None, ...]


# --- Cluster Number Tuning: pure functions over the members' latest models -------------------------


@dataclass(frozen=True)
class Gaps:
    """Alg. 3's quantities for K clusters (float64): Ω_k, Dist_intra^k, Dist_inter^k and G_k."""

    centers: torch.Tensor  # (K, dim) Ω_k, the mean of the members' models (the fallback where none)
    intra: np.ndarray  # (K,) Dist_intra^k
    inter: np.ndarray  # (K,) Dist_inter^k
    sq_dists: np.ndarray  # (K, K) ‖Ω_k − Ω_j‖²

    @property
    def ratios(self) -> np.ndarray:
        """G_k = Dist_intra^k / Dist_inter^k; NaN for a cluster without members."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.intra / self.inter  # coincident centers: inf (split) or, with no spread either, NaN


def gap_ratios(models: Sequence[torch.Tensor], labels: np.ndarray, fallback: torch.Tensor) -> Gaps:
    """Alg. 3's gap ratios over full models: ``models[i]`` (dim,) is the latest model of a member of
    cluster ``labels[i]``; ``fallback`` (K >= 2, dim) stands in as Ω_k of a cluster without members
    (whose Dist_intra is NaN).

    Ω_k = mean of k's members' models; Dist_intra^k = mean over k's members of ‖ω_i − Ω_k‖²;
    Dist_inter^k = Σ_{j≠k} ‖Ω_k − Ω_j‖² / (K − 1); all in float64.
    """
    k = fallback.shape[0]
    if k < 2:
        raise ValueError("gap ratios need at least two clusters (Dist_inter)")
    lab = np.asarray(labels, dtype=np.int64)
    if len(models) != len(lab):
        raise ValueError(f"{len(models)} models but {len(lab)} labels")
    counts = np.bincount(lab, minlength=k)
    centers = fallback.to(torch.float64, copy=True)
    centers[torch.from_numpy(counts > 0)] = 0
    for w, c in zip(models, lab, strict=True):
        centers[c] += w.double()
    filled = torch.from_numpy(counts > 0)
    centers[filled] /= torch.from_numpy(counts[counts > 0]).double()[:, None]
    intra = np.zeros(k)
    for w, c in zip(models, lab, strict=True):
        intra[c] += float((w.double() - centers[c]).pow(2).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        intra /= counts  # no members: NaN
    sq = sq_dist_matrix(centers).cpu().numpy()
    return Gaps(centers, intra, sq.sum(1) / (k - 1), sq)


def cnt_decisions(
    gaps: np.ndarray, sq_dists: np.ndarray, low: float, high: float, k_min: int, k_max: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """Alg. 3's loop: ``(k, into j)`` merges and the clusters to split, in index order.

    Each cluster takes part in at most one change; a merge target is the nearest center (``sq_dists``,
    lower index on ties) not removed or split here; K stays within [k_min, k_max].
    """
    k = len(gaps)
    count = k
    touched: set[int] = set()
    gone: set[int] = set()  # merged away or split: no longer a merge target
    merges: list[tuple[int, int]] = []
    splits: list[int] = []
    for c in range(k):
        if c in touched:
            continue
        if gaps[c] < low and count > k_min:
            targets = [j for j in range(k) if j != c and j not in gone]
            if not targets:
                continue
            j = min(targets, key=lambda t: (sq_dists[c, t], t))
            merges.append((c, j))
            touched |= {c, j}
            gone.add(c)
            count -= 1
        elif gaps[c] > high and count < k_max:
            splits.append(c)
            touched.add(c)
            gone.add(c)
            count += 1
    return merges, splits


def split_labels(codes: torch.Tensor) -> np.ndarray | None:
    """Halves 0/1 of one split: seeds = the farthest-apart pair, then one LrCos E-step.

    None when the codes cannot be split (fewer than two distinct codes, or a half comes out empty).
    """
    if codes.shape[0] < 2:
        return None
    d = torch.triu(sq_dist_matrix(codes), diagonal=1)
    i, j = divmod(int(d.argmax()), d.shape[1])  # first maximal pair in row-major order
    if d[i, j] <= 0:
        return None
    labels = assign_by_cosine(codes.double(), codes.double()[[i, j]])
    return labels if labels.min() != labels.max() else None


def _mean(models: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean of the models, summed in float64, in their dtype."""
    total = torch.zeros_like(models[0], dtype=torch.float64)
    for w in models:
        total += w.double()
    return (total / len(models)).to(models[0].dtype)


@dataclass(frozen=True)
class Tuning:
    """One CNT step: the new centers and assignment, and what it decided (indices before renumbering)."""

    centers: torch.Tensor
    assignment: np.ndarray
    gaps: Gaps  # Alg. 3's quantities for the clusters left after dropping empty ones
    dropped: tuple[int, ...]
    merges: tuple[tuple[int, int], ...]
    splits: tuple[int, ...]


def _renumber(centers: torch.Tensor, assignment: np.ndarray, keep: Sequence[int]) -> tuple[torch.Tensor, np.ndarray]:
    new_index = np.full(centers.shape[0], -1, dtype=np.int64)
    new_index[list(keep)] = np.arange(len(keep))
    out = assignment.copy()
    out[assignment >= 0] = new_index[assignment[assignment >= 0]]
    return centers[list(keep)].clone(), out


def tune_clusters(
    centers: torch.Tensor,
    assignment: np.ndarray,
    models: Sequence[torch.Tensor | None],
    projector: Projector,
    low: float,
    high: float,
    k_min: int,
    k_max: int,
) -> Tuning:
    """Cluster Number Tuning (Alg. 3): ``centers`` (K, dim) are the training centers, ``assignment``
    (m,) the clusters of all m devices (-1: none yet), ``models`` their latest models (one for every
    assigned device). Unchanged clusters keep their center; merged and split ones get Eq. 5's."""
    k = centers.shape[0]
    sizes = np.bincount(assignment[assignment >= 0], minlength=k)
    keep = list(range(k))
    for c in range(k):
        if sizes[c] == 0 and len(keep) > k_min:
            keep.remove(c)
    dropped = tuple(c for c in range(k) if c not in keep)
    centers, assignment = _renumber(centers, assignment, keep)
    members = np.flatnonzero(assignment >= 0)
    latest: list[torch.Tensor] = []
    for i in members:
        w = models[int(i)]
        if w is None:
            raise ValueError(f"device {i} is assigned to cluster {assignment[i]} but has no model")
        latest.append(w)
    gaps = gap_ratios(latest, assignment[members], centers)
    merges, splits = cnt_decisions(gaps.ratios, gaps.sq_dists, low, high, k_min, k_max)

    rows = list(centers.unbind(0))
    omega = list(gaps.centers.unbind(0))  # Ω_k, float64
    counts = np.bincount(assignment[members], minlength=len(rows)).astype(np.float64)
    for c, j in merges:
        omega[j] = (omega[j] * counts[j] + omega[c] * counts[c]) / (counts[j] + counts[c])
        rows[j] = omega[j].to(centers.dtype)
        assignment[assignment == c] = j
        counts[j] += counts[c]
    done_splits = []
    for c in splits:
        part = np.flatnonzero(assignment == c)
        part_models = [latest[int(t)] for t in np.searchsorted(members, part)]
        halves = split_labels(projector(torch.stack(part_models)))
        if halves is None:
            continue
        new_rows = [_mean([part_models[t] for t in np.flatnonzero(halves == h)]) for h in (0, 1)]
        rows[c] = new_rows[0].to(centers.dtype)
        rows.append(new_rows[1].to(centers.dtype))
        assignment[part[halves == 1]] = len(rows) - 1
        done_splits.append(c)
    removed = {c for c, _ in merges}
    survivors = [c for c in range(len(rows)) if c not in removed]
    new_centers, new_assignment = _renumber(torch.stack(rows), assignment, survivors)
    return Tuning(new_centers, new_assignment, gaps, dropped, tuple(merges), tuple(done_splits))


# --- the strategy --------------------------------------------------------------------------------


class FedAC(LCFed):
    name = "fedac"
    reads = ServerReads(sums=("models",), per_device=("models (gap ratios)", "codes"))
    params: FedACParams
    supports_async = False  # CNT splits and merges clusters per round: not defined over a buffer of late updates

    def init(self) -> FedACState:
        base = super().init()
        return FedACState(**_fields(base), models=(None,) * self.fed.num_devices)

    def tunes(self, rnd: int) -> bool:
        """Whether CNT runs after this round's aggregation."""
        p = self.params
        return p.tune_every > 0 and rnd >= p.tune_start and (rnd - p.tune_start) % p.tune_every == 0

    def aggregate(self, state: LCFedState, plan: RoundPlan, msgs: Sequence[LCFedMessage]) -> tuple[FedACState, RoundStats]:
        assert isinstance(state, FedACState)  # what init returns; LCFed's aggregate returns the LCFed fields
        new, stats = super().aggregate(state, plan, msgs)
        latest = list(state.models)
        for m in msgs:
            latest[m.device] = m.weights
        models = tuple(latest)
        projector = new.projector
        if projector is None:  # method.coverage: the first clustering has not happened yet
            return FedACState(**_fields(new), models=models), stats

        centers, assignment = new.centers, new.assignment
        if self.tunes(plan.rnd):
            p = self.params
            tuned = tune_clusters(
                centers, assignment, models, projector, p.gap_low, p.gap_high, p.min_clusters, p.max_clusters
            )
            centers, assignment = tuned.centers, tuned.assignment
        # tuned centers have no kept codes: LCFed projects them in the next round
        kept = new.center_codes if centers is new.centers else None
        out = FedACState(**{**_fields(new), "centers": centers, "assignment": assignment, "center_codes": kept},
                         models=models)
        return out, dataclasses.replace(stats, assignment=assignment, num_clusters=int(centers.shape[0]))


def _fields(state: LCFedState) -> dict:
    """The LCFed fields of a state, shallow (no tensor copies)."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(LCFedState)}
