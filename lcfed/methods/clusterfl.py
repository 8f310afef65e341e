"""ClusterFL: personal models tied to their cluster's mean, clusters from the similarity of the models.

Ouyang, Xie, Zhou, Shen, Ji, Xing, "ClusterFL: A Similarity-Aware Federated Learning System for
Human Activity Recognition", MobiSys 2021 (reference code: ``xmouyang/ClusterFL``).

The paper learns each node's model w_i and a cluster-indicator matrix F by alternating minimization
of  Σ_i f_i(w_i) + α tr(W Wᵀ) - β tr(Fᵀ W Wᵀ F)  (the k-means objective on the models, relaxed):

- F-step, on the server every ``recluster_every`` rounds: the trace term is maximized by the top-K
  eigenvectors of the similarity matrix S = W Wᵀ (spectral relaxation); their rows, normalized, are
  discretized into K clusters by k-means. S here is the cosine similarity of the centred device
  models with negative entries set to 0 (the reference code centres its similarity matrix and clips
  negative affinities), computed over the latest model the server holds from each device.
- W-step, on the devices: for a normalized indicator F (F_ik = 1/sqrt(n_k)), the gradient of the
  regularizer at α = β is 2α (w_i - Ω_k) with Ω_k the mean of cluster k's models, so each device
  trains its own model with the proximal term μ/2 ||w_i - Ω_k||² (μ = 2α).

Decisions (a documented simplification): the paper solves the W-step with ADMM (dual variables U,
auxiliary Ω) and a soft F from the PCA of a KL-divergence matrix of the models' outputs on server
data; here F is hard (K clusters, reportable for ARI), Ω_k is the plain mean of the latest models of
its members (all of them, as the paper's server holds every node's W), and there is no ADMM dual.
Its system parts (cluster-wise straggler dropout, correlation-based node selection) are not modelled.
A device seen for the first time after a reclustering trains without the proximal term until the
next one. Evaluation: each device's own model (its cluster's model if it has not trained yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import cluster_means, kmeans_labels
from lcfed.learning.similarity import cosine_matrix
from lcfed.methods.base import DeviceContext, ModelMessage, PersonalModel, RoundPlan, RoundStats, ServerReads
from lcfed.methods.clustered import ClusteredStrategy, require_clusters_per_round

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class ClusterFLParams:
    """K clusters, μ (pull towards the cluster mean), rounds between re-clusterings (first after round 0)."""

    num_clusters: int = 5
    mu: float = 0.1
    recluster_every: int = 3

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require_clusters_per_round(self.num_clusters, cfg, prefix, "the first clustering needs K models")
        require(self.mu >= 0, f"{prefix}.mu", self.mu, "must be >= 0")
        require(self.recluster_every >= 1, f"{prefix}.recluster_every", self.recluster_every, "must be >= 1")


@dataclass(frozen=True)
class ClusterFLState:
    models: torch.Tensor  # (m, dim): the latest model received from each device (the paper's W)
    seen: np.ndarray  # (m,) bool: the server holds a model of this device
    centers: torch.Tensor  # Ω, (K, dim)
    assignment: np.ndarray  # (m,), -1 = not clustered yet


def similarity(models: torch.Tensor) -> torch.Tensor:
    """Clipped cosine similarity of the centred models: the affinity the F-step maximizes over."""
    x = models.double()
    return cosine_matrix(x - x.mean(0), x - x.mean(0)).clamp_min(0)


def indicator_clusters(sim: torch.Tensor, k: int, seed: int) -> np.ndarray:
    """Cluster labels from the relaxed indicator: top-k eigenvectors of ``sim``, rows normalized, k-means."""
    if sim.shape[0] == k:
        return np.arange(k, dtype=np.int64)
    _, vecs = torch.linalg.eigh(sim.double())  # ascending eigenvalues
    return kmeans_labels(vecs[:, -k:], k, seed, normalize=True)


class ClusterFL(ClusteredStrategy[ClusterFLState, ModelMessage, torch.Tensor]):
    name = "clusterfl"
    reads = ServerReads(sums=("models",), per_device=("models (pairwise similarities)",))
    params: ClusterFLParams

    def init(self) -> ClusterFLState:
        m, init = self.fed.num_devices, self.fed.init
        return ClusterFLState(
            models=init.repeat(m, 1),
            seen=np.zeros(m, dtype=bool),
            centers=init.repeat(self.params.num_clusters, 1),
            assignment=self.unassigned(),
        )

    def local(
        self, ctx: DeviceContext, dev: PersonalModel, payload: torch.Tensor, instruction: int
    ) -> tuple[PersonalModel, ModelMessage]:
        return self.train_own(ctx, dev.weights, self.cluster_proximal(ctx, payload, instruction, self.params.mu))

    def aggregate(
        self, state: ClusterFLState, plan: RoundPlan, msgs: Sequence[ModelMessage]
    ) -> tuple[ClusterFLState, RoundStats]:
        p = self.params
        devices = [m.device for m in msgs]
        models = state.models.clone()
        models[devices] = torch.stack([m.weights for m in msgs])
        seen = state.seen.copy()
        seen[devices] = True
        assignment = state.assignment.copy()
        known = np.flatnonzero(seen)
        if plan.rnd % p.recluster_every == 0 and len(known) >= p.num_clusters:
            assignment[known] = indicator_clusters(similarity(models[known]), p.num_clusters, self.seed + plan.rnd)
        members = np.flatnonzero(assignment >= 0)
        centers = cluster_means(models[torch.from_numpy(members)], assignment[members], state.centers)
        new = ClusterFLState(models, seen, centers, assignment)
        stats = self.clustered_stats(plan, msgs, assignment)
        return new, stats
