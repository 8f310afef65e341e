"""FL+HC: FedAvg warm-up, one hierarchical clustering of the devices' updates, then FedAvg per cluster.

Briggs, Fan, Andras, "Federated learning with hierarchical clustering of local updates to improve
training on non-IID data", IJCNN 2020 (arXiv:2004.11791).

- Rounds ``0 .. warmup_rounds-1``: plain FedAvg (sample-weighted mean of the participants' models).
- Round ``warmup_rounds`` (the clustering round): every device trains from the global model W and
  uploads its model; the server forms the updates Δw_i = w_i - W and clusters them once by
  agglomerative clustering with Euclidean distance (``linkage``: ward by default, as in the paper's
  experiments; average, complete and single are accepted), cutting the dendrogram where merges would
  exceed ``distance_threshold`` (or into ``num_clusters`` clusters when that is set).
- Afterwards each cluster runs its own FedAvg: members start from their cluster model, which becomes
  the sample-weighted mean of its participating members' models. Memberships never change.

Decisions where the paper leaves room:

- The clustering round uses all devices (the paper's algorithm clusters every client), whatever the
  participation fraction, so every device has a cluster afterwards.
- Each cluster's first model is the sample-weighted mean of its members' clustering-round models:
  one FedAvg round within the cluster started from W, so that round's training is not thrown away.
- The threshold is an absolute Euclidean distance between updates (scipy's ``fcluster`` with the
  ``distance`` criterion: merged when the cophenetic distance is <= threshold); it depends on the
  learning rate, the local work and the model, so sweep it or set ``num_clusters``.
- If ``warmup_rounds >= train.rounds`` the run never clusters and is plain FedAvg.
- Evaluation: every device uses its cluster model (the global model before the clustering round).
- ``coverage`` c > 0 (not in the paper; for availability that follows the groups): instead of one clustering round
  of every device, the rounds from ``warmup_rounds`` on select devices as usual and train from the warm-up's global
  model W, which stays put; the server keeps each seen device's latest update Δw_i = w_i − W, and clusters them once
  ⌈c · training devices⌉ have been seen (each cluster's first model the sample-weighted mean of its members' W + Δw_i).
  A device first seen later trains from W, joins the cluster whose clustering-time mean update is nearest
  (Euclidean), and that first model is not averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import cluster_means
from lcfed.methods.base import DeviceContext, ModelMessage, RoundPlan, RoundStats, ServerReads, Strategy

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

LINKAGES = ("ward", "average", "complete", "single")


@dataclass(frozen=True)
class FLHCParams:
    """FedAvg rounds before clustering, the dendrogram cut (distance, or a cluster count if > 0), linkage."""

    warmup_rounds: int = 3
    distance_threshold: float = 1.0
    num_clusters: int = 0
    linkage: str = "ward"
    coverage: float = 0.0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        m = cfg.data.training_devices
        require(self.warmup_rounds >= 0, f"{prefix}.warmup_rounds", self.warmup_rounds, "must be >= 0")
        require(self.distance_threshold > 0, f"{prefix}.distance_threshold", self.distance_threshold, "must be > 0")
        require(
            0 <= self.num_clusters <= m,
            f"{prefix}.num_clusters",
            self.num_clusters,
            f"must be 0 (cut at distance_threshold) or in [1, data.num_devices = {m}]",
        )
        require(self.linkage in LINKAGES, f"{prefix}.linkage", self.linkage, f"one of {list(LINKAGES)}")
        require(0 <= self.coverage <= 1, f"{prefix}.coverage", self.coverage,
                "must be in [0, 1] (0: one clustering round of every device; c: once c of the devices were seen)")


@dataclass(frozen=True)
class FLHCState:
    centers: torch.Tensor  # (C, dim); C = 1 (the global model) until the clustering round
    assignment: np.ndarray  # (m,), all 0 until the clustering round
    clustered: bool = False
    # with coverage > 0: the warm-up's global model W (which waiting and newcomer devices train from), the seen
    # devices' latest updates from it (zeros where unseen) until the clustering, and each cluster's mean update then
    reference: torch.Tensor | None = field(default=None, kw_only=True)
    updates: torch.Tensor | None = field(default=None, kw_only=True)
    seen: np.ndarray | None = field(default=None, kw_only=True)
    anchors: torch.Tensor | None = field(default=None, kw_only=True)


def hierarchical_labels(updates: torch.Tensor, method: str, threshold: float, num_clusters: int = 0) -> np.ndarray:
    """Agglomerative clustering of the rows of ``updates`` (Euclidean), labels 0.. in order of first appearance.

    With ``num_clusters > 0`` the dendrogram is cut into at most that many clusters; otherwise rows
    end up together when their linkage distance is <= ``threshold``.
    """
    n = updates.shape[0]
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster, linkage  # 0.4 s to import; only the server needs it

    tree = linkage(updates.detach().double().cpu().numpy(), method=method, metric="euclidean")
    raw = fcluster(tree, num_clusters, "maxclust") if num_clusters else fcluster(tree, threshold, "distance")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # canonical labels: cluster of device 0 is 0, and so on
    return rank[inverse].astype(np.int64)


class FLHC(Strategy[FLHCState, None, ModelMessage, torch.Tensor]):
    name = "flhc"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    reads = ServerReads(sums=("models",), per_device=("models (hierarchical clustering)",))
    params: FLHCParams

    def init(self) -> FLHCState:
        return FLHCState(self.fed.init.clone()[None], np.zeros(self.fed.num_devices, dtype=np.int64))

    def _clustering_round(self, state: FLHCState, rnd: int) -> bool:
        return not state.clustered and rnd == self.params.warmup_rounds

    def configure(self, state: FLHCState, rnd: int) -> RoundPlan:
        if self.params.coverage > 0:
            return self._configure_coverage(state, rnd)
        if self._clustering_round(state, rnd):
            devices = self.fed.training_devices()
        else:
            devices = self.participants(rnd)
        instructions = {d: int(state.assignment[d]) for d in devices}
        # each device downloads its cluster's model
        return self.plan(rnd, devices, state.centers, instructions, [(state.centers[0], len(devices))])

    def _configure_coverage(self, state: FLHCState, rnd: int) -> RoundPlan:
        """With ``coverage``: the payload's last row is W (the global model until the clustering); a device waiting
        for the clustering, or first seen after it, trains from it (instruction -1)."""
        devices = self.participants(rnd)
        waiting = not state.clustered and rnd >= self.params.warmup_rounds
        instructions = {d: -1 if waiting else int(state.assignment[d]) for d in devices}
        payload = torch.cat([state.centers, state.reference[None]]) if state.reference is not None else state.centers
        return self.plan(rnd, devices, payload, instructions, [(state.centers[0], len(devices))])

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: int) -> tuple[None, ModelMessage]:
        res = ctx.local_update(payload[instruction])
        return None, ModelMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu())

    def aggregate(self, state: FLHCState, plan: RoundPlan, msgs: Sequence[ModelMessage]) -> tuple[FLHCState, RoundStats]:
        p = self.params
        devices = [m.device for m in msgs]
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        if p.coverage > 0 and (state.clustered or plan.rnd >= p.warmup_rounds):
            new = self._aggregate_coverage(state, plan, msgs, models, counts)
        elif self._clustering_round(state, plan.rnd):
            labels = hierarchical_labels(models - state.centers[0], p.linkage, p.distance_threshold, p.num_clusters)
            k = int(labels.max()) + 1
            assignment = state.assignment.copy()
            assignment[devices] = labels
            centers = cluster_means(models, labels, models.new_zeros(k, models.shape[1]), counts)
            new = FLHCState(centers, assignment, clustered=True)
        else:
            labels = state.assignment[devices]
            new = FLHCState(cluster_means(models, labels, state.centers, counts), state.assignment, state.clustered)
        stats = RoundStats(
            self.mean_loss(msgs),
            self.upload_bytes(msgs),
            plan.down_bytes,
            assignment=new.assignment,
            num_clusters=int(new.centers.shape[0]),
        )
        return new, stats

    def _aggregate_coverage(self, state: FLHCState, plan: RoundPlan, msgs: Sequence[ModelMessage], models: torch.Tensor,
                            counts: torch.Tensor) -> FLHCState:
        p = self.params
        devices = np.array([m.device for m in msgs])
        if state.clustered:
            assert state.reference is not None and state.anchors is not None
            assignment = state.assignment.copy()
            for i in np.flatnonzero(state.assignment[devices] < 0):  # newcomers: the nearest mean update
                delta = models[i] - state.reference
                assignment[devices[i]] = int(torch.argmin((state.anchors - delta).norm(dim=1)))
            keep = np.flatnonzero(state.assignment[devices] >= 0)
            centers = state.centers
            if len(keep):
                centers = cluster_means(models[keep], state.assignment[devices[keep]], state.centers, counts[keep])
            return replace(state, centers=centers, assignment=assignment)
        reference = state.centers[0]
        updates = state.updates.clone() if state.updates is not None else models.new_zeros(self.fed.num_devices, models.shape[1])
        seen = state.seen.copy() if state.seen is not None else np.zeros(self.fed.num_devices, dtype=bool)
        updates[devices] = models - reference
        seen[devices] = True
        if int(seen.sum()) < math.ceil(p.coverage * len(self.fed.training_devices())):
            return replace(state, updates=updates, seen=seen)  # W stays put while the server waits
        members = np.flatnonzero(seen)
        deltas = updates[torch.from_numpy(members)]
        labels = hierarchical_labels(deltas, p.linkage, p.distance_threshold, p.num_clusters)
        k = int(labels.max()) + 1
        assignment = np.full(self.fed.num_devices, -1, dtype=np.int64)
        assignment[members] = labels
        sizes = torch.as_tensor(self.fed.train_sizes[members], dtype=torch.float64)
        centers = cluster_means(reference + deltas, labels, deltas.new_zeros(k, deltas.shape[1]), sizes)
        anchors = cluster_means(deltas, labels, deltas.new_zeros(k, deltas.shape[1]))
        return FLHCState(centers, assignment, clustered=True, reference=reference.clone(), anchors=anchors)

    def eval_payload(self, state: FLHCState) -> FLHCState:
        return state

    def personalized(self, ctx: DeviceContext, dev: None, payload: FLHCState) -> torch.Tensor:
        k = int(payload.assignment[ctx.device])
        if k < 0:  # coverage: not seen by the clustering yet
            return payload.reference if payload.reference is not None else payload.centers[0]
        return payload.centers[k]
