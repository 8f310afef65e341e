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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class FLHCState:
    centers: torch.Tensor  # (C, dim); C = 1 (the global model) until the clustering round
    assignment: np.ndarray  # (m,), all 0 until the clustering round
    clustered: bool = False


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
    reads = ServerReads(sums=("models",), per_device=("models (hierarchical clustering)",))
    params: FLHCParams

    def init(self) -> FLHCState:
        return FLHCState(self.fed.init.clone()[None], np.zeros(self.fed.num_devices, dtype=np.int64))

    def _clustering_round(self, state: FLHCState, rnd: int) -> bool:
        return not state.clustered and rnd == self.params.warmup_rounds

    def configure(self, state: FLHCState, rnd: int) -> RoundPlan:
        if self._clustering_round(state, rnd):
            devices = self.fed.training_devices()
        else:
            devices = self.participants(rnd)
        instructions = {d: int(state.assignment[d]) for d in devices}
        # each device downloads its cluster's model
        return self.plan(rnd, devices, state.centers, instructions, [(state.centers[0], len(devices))])

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: int) -> tuple[None, ModelMessage]:
        res = ctx.local_update(payload[instruction])
        return None, ModelMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu())

    def aggregate(self, state: FLHCState, plan: RoundPlan, msgs: Sequence[ModelMessage]) -> tuple[FLHCState, RoundStats]:
        p = self.params
        devices = [m.device for m in msgs]
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        if self._clustering_round(state, plan.rnd):
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

    def eval_payload(self, state: FLHCState) -> FLHCState:
        return state

    def personalized(self, ctx: DeviceContext, dev: None, payload: FLHCState) -> torch.Tensor:
        return payload.centers[int(payload.assignment[ctx.device])]
