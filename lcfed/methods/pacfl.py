"""PACFL: one-shot clustering of the devices by the principal angles between their data subspaces, then
FedAvg within each cluster.

Vahidian, Morafah, Wang, Kungurtsev, Chen, Shah, Lin, "Efficient Distribution Similarity Identification in
Clustered Federated Learning via Principal Angles Between Client Data Subspaces", AAAI 2023 (arXiv:2209.10526).

- Signature: device k stacks its flattened training inputs as the columns of D_k (d × n_k) and sends U_k, the
  ``num_vectors`` (p) leading left singular vectors of its truncated SVD: d × p numbers, once.
- Proximity: the principal angles between span(U_i) and span(U_j), θ = arccos of the singular values of U_iᵀU_j,
  in degrees; A_ij is their sum (``proximity: sum``, default) or the smallest (``smallest``).
- Clustering: average-linkage agglomerative clustering of A, merging while the linkage distance is <= β
  (``threshold``, degrees); clusters numbered in order of their first device.
- Then FedAvg per cluster: members train from their cluster's model, which becomes the sample-weighted mean of
  its participants' models. Memberships never change.
- A device placed after the clustering (a newcomer): its signature puts it in the cluster with the smallest mean
  proximity to its members (average linkage's rule); in that first round it trains from the mean of the cluster
  models, and that model is not averaged into any cluster.

When the clustering happens (``coverage``):

- ``coverage: 0`` (the paper's one shot): round 0 asks every training device (all of them, whatever
  ``train.participation``, as FL+HC's clustering round; with the device model, those it keeps) for its signature;
  they train from the initial model, and each cluster's first model is the mean of its members' round-0 models.
- ``coverage: c`` in (0, 1]: rounds select devices as usual and train one global model (FedAvg); every device
  sends its signature the first time it is seen; the server clusters the devices seen so far after the first round
  in which at least ⌈c · training devices⌉ have been seen. Each cluster starts from the global model (the mean of
  its members in that round where it has some). Devices seen later are newcomers. This is for availability that
  follows the groups: the devices online in round 0 may all come from a few groups.

Choices the paper leaves open, or that this repository fixes: the proximity measure (the paper's proximity is
built from the principal angles; the authors' code, as we read it, takes the smallest entry of arccos(U_iᵀU_j),
the angle between two basis vectors rather than a principal angle); the inputs are the standardized ones the model
sees, not centred; p = 3 and β = 120 degrees of the sum were measured on digits: on the rotated testbed (8 devices) a group's
devices lie 37–83 degrees apart and different groups' 190–240 with 2 groups, 44–92 and 120–222 with 4, and average
linkage recovers 2 and 4 groups of 8 or 16 devices exactly (ARI 1); β scales with p and the data (at most 90 · p), so sweep it. What the server reads: each device's U_k once (d · p numbers,
counted in ``bytes_up``), a summary of its inputs' dominant directions. No asynchronous aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import cluster_means, weighted_mean
from lcfed.methods.base import DeviceContext, Message, RoundPlan, RoundStats, ServerReads, Strategy
from lcfed.methods.clustered import EvalPayload

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

PROXIMITIES = ("sum", "smallest")
LINKAGES = ("average", "complete", "single")


@dataclass(frozen=True)
class PACFLParams:
    """p (singular vectors a device sends), β (the dendrogram cut, degrees), the proximity and the linkage, and
    the coverage of seen devices the clustering waits for (0: every device in round 0)."""

    num_vectors: int = 3
    threshold: float = 120.0
    proximity: str = "sum"
    linkage: str = "average"
    coverage: float = 0.0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.num_vectors >= 1, f"{prefix}.num_vectors", self.num_vectors, "must be >= 1")
        require(self.threshold > 0, f"{prefix}.threshold", self.threshold, "must be > 0 (degrees)")
        require(self.proximity in PROXIMITIES, f"{prefix}.proximity", self.proximity, f"one of {list(PROXIMITIES)}")
        require(self.linkage in LINKAGES, f"{prefix}.linkage", self.linkage, f"one of {list(LINKAGES)}")
        require(0 <= self.coverage <= 1, f"{prefix}.coverage", self.coverage,
                "must be in [0, 1] (0: every device's signature in round 0; c: cluster once c of the devices were seen)")


@dataclass(frozen=True)
class PACFLState:
    centers: torch.Tensor  # (C, dim): the global model (C = 1) until the clustering
    assignment: np.ndarray  # (m,): -1 until a device is placed
    signatures: torch.Tensor  # (m, d, p): each seen device's U_k; (m, 0, p) before any was seen
    seen: np.ndarray  # (m,) bool: the server holds the device's signature
    clustered: bool = False


@dataclass(frozen=True)
class PACFLTask:
    """A device's instruction: the cluster it trains (-1: the mean of the models sent), and whether it sends its
    signature."""

    cluster: int
    signature: bool


@dataclass(frozen=True)
class PACFLMessage(Message):
    weights: torch.Tensor
    signature: torch.Tensor  # (d, p), or empty when not asked


def data_subspace(x: torch.Tensor, p: int) -> torch.Tensor:
    """U_p: the ``p`` leading left singular vectors of the data matrix whose columns are the flattened samples
    of ``x`` (d × p, float32; zero columns past the matrix's rank)."""
    rows = x.reshape(x.shape[0], -1).double()
    _, s, vh = torch.linalg.svd(rows, full_matrices=False)
    u = torch.zeros(rows.shape[1], p, dtype=torch.float64, device=rows.device)
    rank = int((s > s[0] * max(rows.shape) * torch.finfo(torch.float64).eps).sum()) if len(s) else 0
    k = min(p, rank)
    u[:, :k] = vh[:k].T
    return u.float()


def principal_angles(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The principal angles between span(u) and span(v) (orthonormal columns), in degrees, ascending."""
    cosines = torch.linalg.svdvals(u.double().T @ v.double()).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.arccos(cosines))


def proximity(signatures: torch.Tensor, others: torch.Tensor, measure: str) -> torch.Tensor:
    """A (len(signatures), len(others)) matrix of proximities: the sum or the smallest of the principal angles."""
    out = torch.zeros(len(signatures), len(others), dtype=torch.float64)
    for i, u in enumerate(signatures):
        for j, v in enumerate(others):
            angles = principal_angles(u, v)
            out[i, j] = angles.sum() if measure == "sum" else angles.min()
    return out


def one_shot_labels(distance: torch.Tensor, threshold: float, method: str) -> np.ndarray:
    """Agglomerative clustering of a symmetric distance matrix cut at ``threshold``; clusters numbered in
    order of their first row."""
    n = distance.shape[0]
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster, linkage  # only the server needs it
    from scipy.spatial.distance import squareform

    d = ((distance + distance.T) / 2).numpy().copy()
    np.fill_diagonal(d, 0.0)
    raw = fcluster(linkage(squareform(d, checks=False), method=method), threshold, "distance")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse].astype(np.int64)


def nearest_cluster(distance_to_members: torch.Tensor, labels: np.ndarray) -> int:
    """The cluster with the smallest mean distance to its members (ties: the lowest)."""
    means = [float(distance_to_members[labels == k].mean()) for k in range(int(labels.max()) + 1)]
    return int(np.argmin(means))


class PACFL(Strategy[PACFLState, None, PACFLMessage, torch.Tensor]):
    name = "pacfl"
    reads = ServerReads(sums=("models",), per_device=("data subspaces (principal vectors)",))
    params: PACFLParams

    def init(self) -> PACFLState:
        m = self.fed.num_devices
        return PACFLState(self.fed.init.clone()[None], np.full(m, -1, dtype=np.int64),
                          torch.zeros(m, 0, self.params.num_vectors), np.zeros(m, dtype=bool))

    def configure(self, state: PACFLState, rnd: int) -> RoundPlan:
        one_shot = not state.clustered and self.params.coverage == 0
        devices = self.fed.training_devices() if one_shot else self.participants(rnd)
        tasks = {d: PACFLTask(int(state.assignment[d]), not bool(state.seen[d])) for d in devices}
        placed = sum(1 for t in tasks.values() if t.cluster >= 0)
        # a placed device downloads its cluster's model, any other every model (their mean is its start)
        return self.plan(rnd, devices, state.centers, tasks,
                         [(state.centers[0], placed), (state.centers, len(devices) - placed)])

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: PACFLTask) -> tuple[None, PACFLMessage]:
        start = payload[instruction.cluster] if instruction.cluster >= 0 else payload.mean(0)
        res = ctx.local_update(start)
        signature = data_subspace(ctx.data.x_train, self.params.num_vectors).cpu() if instruction.signature else torch.zeros(0)
        return None, PACFLMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu(), signature)

    def _clusters_now(self, seen: np.ndarray) -> bool:
        c = self.params.coverage
        return c == 0 or int(seen.sum()) >= math.ceil(c * len(self.fed.training_devices()))

    def aggregate(self, state: PACFLState, plan: RoundPlan, msgs: Sequence[PACFLMessage]) -> tuple[PACFLState, RoundStats]:
        p = self.params
        devices = np.array([m.device for m in msgs])
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        sent = [m for m in msgs if m.signature.numel()]
        signatures, seen = state.signatures, state.seen.copy()
        if sent:
            if signatures.shape[1] == 0:
                signatures = torch.zeros(len(seen), *sent[0].signature.shape)
            signatures = signatures.clone()
            for m in sent:
                signatures[m.device] = m.signature
                seen[m.device] = True
        assignment = state.assignment.copy()
        if not state.clustered:
            merged = weighted_mean(models, counts)  # everyone trained from the one global model
            clustered = self._clusters_now(seen)
            if clustered:
                ids = np.flatnonzero(seen)
                sig = signatures[ids]
                assignment[ids] = one_shot_labels(proximity(sig, sig, p.proximity), p.threshold, p.linkage)
                start = merged.repeat(int(assignment.max()) + 1, 1)
                centers = cluster_means(models, assignment[devices], start, counts)
            else:
                centers = merged[None]
        else:
            clustered = True
            placed = np.flatnonzero(assignment >= 0)
            for m in sent:  # newcomers
                distance = proximity(m.signature[None], signatures[placed], p.proximity)[0]
                assignment[m.device] = nearest_cluster(distance, assignment[placed])
            keep = np.flatnonzero(state.assignment[devices] >= 0)  # a newcomer's first model is not averaged
            centers = state.centers
            if len(keep):
                centers = cluster_means(models[keep], state.assignment[devices[keep]], state.centers, counts[keep])
        new = PACFLState(centers, assignment, signatures, seen, clustered)
        return new, self.clustered_stats(plan, msgs, assignment)

    def eval_payload(self, state: PACFLState) -> EvalPayload:
        return EvalPayload(state.centers, state.assignment)

    def personalized(self, ctx: DeviceContext, dev: None, payload: EvalPayload) -> torch.Tensor:
        k = int(payload.assignment[ctx.device])
        return payload.centers[k] if k >= 0 else payload.mean_center
