"""CGPFL: personalized models pulled towards K group (context) models, groups found by cosine similarity.

Tang, Guo, Guo, "Personalized Federated Learning with Contextualized Generalization", IJCAI 2022
(arXiv:2106.13044).

- Device i in group k keeps its personalized model θ_i and minimizes ``L_sup(θ_i) + μ/2 ‖θ_i − Ω_k‖²``
  with the shared local update, starting from its own θ_i; it uploads θ_i and downloads Ω_k.
- Server: assignment = argmax_k cos(θ_i, Ω_k) over the full parameter vector, against the previous
  round's Ω_k (the expensive full-dimensional clustering LCFed's paper compares against);
  Ω_k = plain mean of the assigned θ_i; an empty group keeps its model.
- Simplification (as in LCFed's description of CGPFL): the paper's device also keeps a local copy
  of the group model, moved as ``w ← w − η μ (w − θ_i)`` after solving for θ_i (pFedMe-style bi-level
  updates), and uploads that copy. Here θ_i itself is uploaded, so LCFed with λ = 0 and full-model
  cosine instead of its low-rank one is the closest relative.
- Choices left open: before the first clustering a device has no group and trains without the
  proximal term (as LCFed does); the first assignment is k-means on the L2-normalized uploaded models
  (cosine geometry), seeded, computed on the models' coordinates in their own span (same result,
  far cheaper). Default μ = 0.1, LCFed's value, so both pull equally hard.
- Personalized model: θ_i after its last local training; before that, its group model (or the mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import assign_by_cosine, cluster_means, kmeans_labels
from lcfed.methods.base import DeviceContext, ModelMessage, PersonalModel, RoundPlan, RoundStats, ServerReads
from lcfed.methods.clustered import ClusteredStrategy, require_clusters_per_round
from lcfed.methods.fesem import span_coordinates

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_KMEANS_TAG = 0xC6F1


@dataclass(frozen=True)
class CGPFLParams:
    """μ (pull of θ_i towards its group model) and K, the number of groups."""

    mu: float = 0.1
    num_clusters: int = 5

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.mu >= 0, f"{prefix}.mu", self.mu, "must be >= 0")
        require_clusters_per_round(self.num_clusters, cfg, prefix, "the first clustering needs K participants")


@dataclass(frozen=True)
class CGPFLState:
    centers: torch.Tensor  # Ω, (K, dim)
    assignment: np.ndarray  # (m,), -1 = not yet assigned


class CGPFL(ClusteredStrategy[CGPFLState, ModelMessage, torch.Tensor]):
    name = "cgpfl"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    reads = ServerReads(sums=("models",), per_device=("models (cosine assignment)",))
    params: CGPFLParams

    def init(self) -> CGPFLState:
        return CGPFLState(centers=self.fed.init.repeat(self.params.num_clusters, 1), assignment=self.unassigned())

    def local(
        self, ctx: DeviceContext, dev: PersonalModel, payload: torch.Tensor, instruction: int
    ) -> tuple[PersonalModel, ModelMessage]:
        return self.train_own(ctx, dev.weights, self.cluster_proximal(ctx, payload, instruction, self.params.mu))

    def aggregate(self, state: CGPFLState, plan: RoundPlan, msgs: Sequence[ModelMessage]) -> tuple[CGPFLState, RoundStats]:
        models = torch.stack([m.weights for m in msgs])
        if (state.assignment < 0).all():
            seed = int(np.random.default_rng([self.seed, plan.rnd, _KMEANS_TAG]).integers(2**31 - 1))
            labels = kmeans_labels(span_coordinates(models), self.params.num_clusters, seed)  # = on the models
        else:
            labels = assign_by_cosine(models, state.centers)
        assignment = state.assignment.copy()
        assignment[[m.device for m in msgs]] = labels
        new = CGPFLState(cluster_means(models, labels, state.centers), assignment)
        stats = self.clustered_stats(plan, msgs, assignment)
        return new, stats
