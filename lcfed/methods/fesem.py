"""FeSEM: multi-center FL by stochastic EM with the L2 distance between device and center models.

Long, Xie, Shen, Zhou, Wang, Jiang, Zhang, "Multi-center federated learning: clients clustering for
better personalization", World Wide Web 26 (2023), published online 2022 (arXiv:2108.08647; first
version: Xie et al., "Multi-Center Federated Learning", arXiv:2005.01026).

- Device i in cluster k starts its local SGD at the center Ω_k and uploads the trained model
  W_i; it downloads one model (its center), so ``down_bytes`` = one model per participant.
- E-step (server): each uploaded W_i joins the center with the smallest ‖W_i − Ω_k‖₂ over the full
  parameter vector, against the previous round's centers. M-step: Ω_k = plain mean of its members'
  W_i (the paper's unweighted average); an empty cluster keeps its center.
- Choices the paper leaves open: the first round has no centers yet, so every participant trains
  from the federation's init and the K starting centers are picked among the first round's uploaded
  models by k-means++ seeding (L2, seeded), followed by one E- and one M-step. A device that has no
  cluster yet (it did not take part in the first round) starts from the mean of the centers.
- Personalized model: the device's own model after its last local training (Ω_k fine-tuned on its
  data); before it ever trained, its center (or the centers' mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.learning.clustering import cluster_means
from lcfed.learning.similarity import sq_l2_matrix
from lcfed.methods.base import DeviceContext, ModelMessage, PersonalModel, RoundPlan, RoundStats, ServerReads
from lcfed.methods.clustered import ClusteredStrategy, require_clusters_per_round

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_SEED_TAG = 0xFE5E


@dataclass(frozen=True)
class FeSEMParams:
    """K, the number of centers."""

    num_clusters: int = 5

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require_clusters_per_round(self.num_clusters, cfg, prefix, "the first centers are picked among a round's models")


@dataclass(frozen=True)
class FeSEMState:
    centers: torch.Tensor  # Ω, (K, dim)
    assignment: np.ndarray  # (m,), -1 = not yet assigned


def assign_by_l2(points: torch.Tensor, centers: torch.Tensor) -> np.ndarray:
    """Index of the nearest center (Euclidean) for each point; ties go to the lower index."""
    return sq_l2_matrix(points, centers).argmin(1).cpu().numpy().astype(np.int64)


def span_coordinates(points: torch.Tensor) -> torch.Tensor:
    """The rows' coordinates (n x n, float64) in an orthonormal basis of their own span.

    Every distance and inner product between rows is kept, so k-means (and its seeding) clusters
    them exactly as it would the full models, on n numbers per model instead of dim (for 20 LeNet-5
    models, ~0.3 s instead of ~15 s of scikit-learn k-means).
    """
    x = points.detach().double().cpu()
    if x.shape[0] >= x.shape[1]:
        return x
    return torch.linalg.qr(x.T).R.T


def kmeanspp_centers(points: torch.Tensor, k: int, rng: np.random.Generator) -> torch.Tensor:
    """``k`` rows of ``points`` chosen by k-means++ seeding (D² sampling), reproducible from ``rng``."""
    from sklearn.cluster import kmeans_plusplus  # lazy: a slow import, needed only here

    x = span_coordinates(points).numpy()
    _, idx = kmeans_plusplus(x, n_clusters=k, random_state=int(rng.integers(2**31 - 1)))
    return points[torch.from_numpy(np.sort(idx))].clone()


class FeSEM(ClusteredStrategy[FeSEMState, ModelMessage, torch.Tensor]):
    name = "fesem"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    reads = ServerReads(sums=("models",), per_device=("models (L2 distances)",))
    params: FeSEMParams

    def init(self) -> FeSEMState:
        return FeSEMState(centers=self.fed.init.repeat(self.params.num_clusters, 1), assignment=self.unassigned())

    def configure(self, state: FeSEMState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        instructions = self.cluster_instructions(state.assignment, devices)
        return self.plan(rnd, devices, state.centers, instructions, [(state.centers[0], len(devices))])

    def local(
        self, ctx: DeviceContext, dev: PersonalModel, payload: torch.Tensor, instruction: int
    ) -> tuple[PersonalModel, ModelMessage]:
        return self.train_own(ctx, payload[instruction] if instruction >= 0 else payload.mean(0))

    def aggregate(self, state: FeSEMState, plan: RoundPlan, msgs: Sequence[ModelMessage]) -> tuple[FeSEMState, RoundStats]:
        models = torch.stack([m.weights for m in msgs])
        previous = state.centers
        if (state.assignment < 0).all():
            rng = np.random.default_rng([self.seed, plan.rnd, _SEED_TAG])
            previous = kmeanspp_centers(models, self.params.num_clusters, rng)
        labels = assign_by_l2(models, previous)  # E-step
        assignment = state.assignment.copy()
        assignment[[m.device for m in msgs]] = labels
        new = FeSEMState(cluster_means(models, labels, previous), assignment)  # M-step
        stats = self.clustered_stats(plan, msgs, assignment)
        return new, stats
