"""FedAC: LCFed's clustered training plus Cluster Number Tuning (CNT), so K changes during the run.

Zhang, Chen, Lin, Chen, Zhao, "FedAC: An Adaptive Clustered Federated Learning Framework for
Heterogeneous Data", arXiv:2403.16460, 2024.

Everything of Alg. 1 but line 13 is :class:`~lcfed.methods.lcfed.LCFed` (``docs/methods.md``): the local
objective of Eq. 3, Φ, the PCA projector M refit sparsely (Alg. 2; the paper's "e.g. every 100
rounds" is the default), the E-step argmax_k LrCos (Eq. 4 writes argmin, a typo) against the previous
round's centers, and the M-step of Eq. 5. After the M-step, CNT (Alg. 3) computes per cluster

    G_k = Dist_intra^k / Dist_inter^k,

merges k into its nearest cluster when G_k < a (``gap_low``) and splits k in two when G_k > b
(``gap_high``); the paper's range is (a, b) = (0.2, 0.8) (§5.5).

Where the paper is unclear, this module decides:

- Distance: Alg. 3's squared L2, on the low-rank codes P(w) = M(w − mean) that LrCos also uses, so
  ‖P(ω_i) − P(Ω_k)‖² is the squared L2 of ω_i − Ω_k within the PCA subspace (D numbers, not dim(ω)).
  Dist_intra^k = mean over k's measured members of ‖P(ω_i) − P(Ω_k)‖²;
  Dist_inter^k = 1/(K−1) Σ_{j≠k} ‖P(Ω_k) − P(Ω_j)‖².
- Whose codes: the server keeps each device's latest code (D numbers). A personal model changes only
  when its device trains, so that code stays exact until M is refit; a refit keeps only the codes of
  that round's participants (re-projected by the server). A device is "measured" while its code is valid.
- Unmeasurable clusters: G_k is NaN (no change) when fewer than min(2, size) members are measured. A
  lone device's cluster gets the plain formula: its center is its own model whenever it trained last
  (Dist_intra = 0), so it merges; it can never be split.
- When: after the aggregation of round ``tune_start`` and every ``tune_every`` rounds after it
  (Alg. 1 runs CNT every round: ``tune_every = 1``; 0 turns CNT off). Before the G's, clusters with
  no device are dropped (a merge with nobody to move). K stays in [``min_clusters``,
  ``max_clusters``]; ``min_clusters >= 2`` because Dist_inter needs a second cluster.
- Order: every G_k is computed first, then Alg. 3's loop runs over k in index order; a cluster takes
  part in at most one change per tuning (an absorbing or split cluster is not revisited), so merges
  do not cascade.
- Merge: k's devices join the cluster j with the nearest center code (ties: lower index; never one
  removed or split in this tuning); Ω_j becomes the device-count-weighted mean of Ω_j and Ω_k, what
  Eq. 5 gives when each center is its members' mean.
- Split ("initializing two new centers and conducting one re-clustering iteration", §4.5): the two
  new centers start at the codes of the two measured members farthest apart (squared L2; ties: first
  pair). One E-step by LrCos follows (ties to the first seed), then one M-step in code space: each
  half's center is Ω_k + Mᵀ(mean code of the half − P(Ω_k)), i.e. Ω_k moved within the PCA subspace
  to its half's mean (the server holds no full model of members that did not train this round). Half
  0 keeps index k, half 1 is appended; unmeasured members stay in half 0 until their next E-step. A
  split whose E-step leaves a half empty (all codes parallel) is skipped.
- After a tuning the clusters are renumbered (survivors in order, then new ones) so that K = number
  of centers, which :class:`RoundStats` reports as ``num_clusters`` every round.
- Communication: as LCFed (``configure`` is inherited); CNT is server-side, and a device whose
  cluster changed simply downloads its new cluster's center next time it takes part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lcfed.clustering import assign_by_cosine
from lcfed.config import ExperimentConfig, require
from lcfed.methods.base import Message, RoundPlan, RoundStats
from lcfed.methods.lcfed import LCFed, LCFedMessage, LCFedParams, LCFedState
from lcfed.similarity import Projector


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
    codes: torch.Tensor  # (m, D): each device's latest code P(ω_i) under the current projector
    coded: np.ndarray  # (m,) bool: codes[i] is valid (uploaded or projected since the last refit)


# --- Cluster Number Tuning: pure functions over codes ----------------------------------------------


def _sq_dists(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact squared L2 between every row of ``a`` and of ``b`` (float64)."""
    return (a.double()[:, None, :] - b.double()[None, :, :]).pow(2).sum(-1)


def gap_ratios(
    codes: torch.Tensor, labels: np.ndarray, centers: torch.Tensor, sizes: np.ndarray | None = None
) -> np.ndarray:
    """G_k = Dist_intra^k / Dist_inter^k of Alg. 3, squared L2 on codes, for each of the K centers.

    ``codes`` (n, D) are the measured members with clusters ``labels``; ``centers`` (K >= 2, D) the
    center codes; ``sizes`` the devices per cluster (default: the measured counts). NaN where fewer
    than min(2, size) members are measured.
    """
    k = centers.shape[0]
    if k < 2:
        raise ValueError("gap ratios need at least two clusters (Dist_inter)")
    lab = np.asarray(labels, dtype=np.int64)
    measured = np.bincount(lab, minlength=k)
    sizes = measured if sizes is None else np.asarray(sizes)
    to_own = (codes.double() - centers.double()[torch.from_numpy(lab)]).pow(2).sum(1).numpy()
    intra = np.bincount(lab, weights=to_own, minlength=k) / np.maximum(measured, 1)
    inter = _sq_dists(centers, centers).sum(1).numpy() / (k - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        gaps = intra / inter  # coincident centers: inf (split) or, with no spread either, NaN
    gaps[measured < np.minimum(2, sizes)] = np.nan
    return gaps


def cnt_decisions(
    gaps: np.ndarray, centers: torch.Tensor, low: float, high: float, k_min: int, k_max: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """Alg. 3's loop: ``(k, into j)`` merges and the clusters to split, in index order.

    Each cluster takes part in at most one change; a merge target is the nearest center (squared L2
    of codes, lower index on ties) not removed or split here; K stays within [k_min, k_max].
    """
    k = len(gaps)
    dist = _sq_dists(centers, centers).numpy()
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
            j = min(targets, key=lambda t: (dist[c, t], t))
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
    d = torch.triu(_sq_dists(codes, codes), diagonal=1)
    i, j = divmod(int(d.argmax()), d.shape[1])  # first maximal pair in row-major order
    if d[i, j] <= 0:
        return None
    labels = assign_by_cosine(codes.double(), codes.double()[[i, j]])
    return labels if labels.min() != labels.max() else None


def lift(center: torch.Tensor, code: torch.Tensor, projector: Projector) -> torch.Tensor:
    """``center`` moved within the PCA subspace so that its code becomes ``code``: Ω + Mᵀ(code − P(Ω))."""
    shift = (code.double() - projector(center).double()) @ projector.components.double()
    return (center.double() + shift).to(center.dtype)


@dataclass(frozen=True)
class Tuning:
    """One CNT step: the new centers and assignment, and what it decided (indices before renumbering)."""

    centers: torch.Tensor
    assignment: np.ndarray
    gaps: np.ndarray  # G_k of the clusters left after dropping empty ones
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
    codes: torch.Tensor,
    coded: np.ndarray,
    projector: Projector,
    low: float,
    high: float,
    k_min: int,
    k_max: int,
) -> Tuning:
    """Cluster Number Tuning (Alg. 3) on full centers (K, dim) and the assignment of all m devices."""
    k = centers.shape[0]
    sizes = np.bincount(assignment[assignment >= 0], minlength=k)
    keep = list(range(k))
    for c in range(k):
        if sizes[c] == 0 and len(keep) > k_min:
            keep.remove(c)
    dropped = tuple(c for c in range(k) if c not in keep)
    centers, assignment = _renumber(centers, assignment, keep)
    sizes = sizes[keep]
    center_codes = projector(centers)
    measured = coded & (assignment >= 0)
    gaps = gap_ratios(codes[torch.from_numpy(measured)], assignment[measured], center_codes, sizes)
    merges, splits = cnt_decisions(gaps, center_codes, low, high, k_min, k_max)

    rows = list(centers.unbind(0))
    sizes = sizes.astype(np.int64)
    for c, j in merges:
        rows[j] = (rows[j].double() * sizes[j] + rows[c].double() * sizes[c]).div(sizes[j] + sizes[c]).to(rows[j].dtype)
        assignment[assignment == c] = j
        sizes[j] += sizes[c]
    done_splits = []
    for c in splits:
        members = np.flatnonzero((assignment == c) & coded)
        halves = split_labels(codes[torch.from_numpy(members)])
        if halves is None:
            continue
        member_codes = codes[torch.from_numpy(members)].double()
        new_rows = [lift(rows[c], member_codes[torch.from_numpy(halves == h)].mean(0), projector) for h in (0, 1)]
        rows[c] = new_rows[0]
        rows.append(new_rows[1])
        assignment[members[halves == 1]] = len(rows) - 1
        done_splits.append(c)
    removed = {c for c, _ in merges}
    survivors = [c for c in range(len(rows)) if c not in removed]
    new_centers, new_assignment = _renumber(torch.stack(rows), assignment, survivors)
    return Tuning(new_centers, new_assignment, gaps, dropped, tuple(merges), tuple(done_splits))


# --- the strategy --------------------------------------------------------------------------------


class FedAC(LCFed):
    name = "fedac"
    params: FedACParams

    def init(self) -> FedACState:
        base = super().init()
        m, d = self.fed.num_devices, self.params.rank
        return FedACState(**_fields(base), codes=torch.zeros(m, d), coded=np.zeros(m, dtype=bool))

    def tunes(self, rnd: int) -> bool:
        """Whether CNT runs after this round's aggregation."""
        p = self.params
        return p.tune_every > 0 and rnd >= p.tune_start and (rnd - p.tune_start) % p.tune_every == 0

    def aggregate(self, state: LCFedState, plan: RoundPlan, msgs: Sequence[Message]) -> tuple[FedACState, RoundStats]:
        assert isinstance(state, FedACState)
        new, stats = super().aggregate(state, plan, msgs)
        projector = new.projector
        assert projector is not None  # LCFed fits M in the first aggregation
        devices = torch.tensor([m.device for m in msgs], dtype=torch.long)
        lmsgs: Sequence[LCFedMessage] = msgs  # type: ignore[assignment]
        coded = state.coded.copy()
        if new.fitted_at == plan.rnd:  # M was (re)fitted now: older codes are in another basis
            round_codes = projector(torch.stack([m.weights for m in lmsgs]))
            codes = torch.zeros_like(state.codes)
            coded[:] = False
        else:
            round_codes = torch.stack([m.code for m in lmsgs])  # type: ignore[misc]
            codes = state.codes.clone()
        codes[devices] = round_codes.to(codes.dtype)
        coded[devices.numpy()] = True

        centers, assignment = new.centers, new.assignment
        if self.tunes(plan.rnd):
            p = self.params
            tuned = tune_clusters(
                centers, assignment, codes, coded, projector, p.gap_low, p.gap_high, p.min_clusters, p.max_clusters
            )
            centers, assignment = tuned.centers, tuned.assignment
        # tuned centers have no kept codes: LCFed projects them in the next round
        kept = new.center_codes if centers is new.centers else None
        out = FedACState(**{**_fields(new), "centers": centers, "assignment": assignment, "center_codes": kept},
                         codes=codes, coded=coded)
        return out, dataclasses.replace(stats, assignment=assignment, num_clusters=int(centers.shape[0]))


def _fields(state: LCFedState) -> dict:
    """The LCFed fields of a state, shallow (no tensor copies)."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(LCFedState)}
