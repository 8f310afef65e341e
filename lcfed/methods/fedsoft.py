"""FedSoft: soft clustering. Every device's data is a mix of S sources; it weighs the S cluster centres by its
estimated importance weights, pulls its own model towards them, and the centres average the devices' models by
those weights.

Ruan, Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local Updating", AAAI 2022
(arXiv:2112.06053), Alg. 1.

- Server state: S centres c_1..c_S, broadcast whole to the round's devices (S models down).
- Importance weights of device k: u_ks = n_ks / n_k, where n_ks counts its training samples on which centre s
  has the smallest loss (ties: the lowest s); each u_ks is raised to at least the smoother σ (``smoother``) and
  the weights renormalized to sum to 1, so that no centre loses a device for good.
- Local update: the shared local SGD on f_k(w) + λ/2 Σ_s u_ks ‖w − c_s‖² from the device's own model (the
  u-weighted centre before its first round). With Σ_s u_ks = 1 that proximal term is λ/2 ‖w − Σ_s u_ks c_s‖² up to a
  constant, so it is one pull towards the weighted centre. The device keeps w and uploads it with u_k.
- Server: c_s = Σ_k u_ks n_k w_k / Σ_k u_ks n_k over the round's devices.
- Evaluation: the device's own model once it has trained (the paper reports both the centres and these
  personalized models), before that the mean centre; ``assignment`` is each device's argmax_s u_ks (ARI / NMI).

Choices the paper leaves open, or that this repository fixes: the paper re-estimates u every τ rounds on
clients the server samples per cluster with probability ∝ u_ks n_k; here the round's devices come from
``train.participation`` (or the device model) like every method's, and each re-estimates u whenever it takes
part (τ = 1), since it downloads every centre anyway. The renormalization after the smoother is ours (the paper's
Σ_s u_ks need not be 1 after it). Centres start from the federation's one init, each but the first with seeded
Gaussian noise of a tenth of each tensor's spread: from one init exactly every sample would pick centre 0 and the
centres would never part, and apart inits (IFCA's permuted copies) are not averaged soundly, since every centre
averages every device's model (models of other lineages: on rotated MNIST with S = 4 the devices never learned).
What the server reads: each device's model and its u_k (S numbers, counted in
``bytes_up``). No asynchronous aggregation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.local_update import pull_towards
from lcfed.learning.models import ParamSpec
from lcfed.methods.base import DeviceContext, Message, PersonalModel, RoundPlan, RoundStats, ServerReads
from lcfed.methods.clustered import ClusteredStrategy
from lcfed.methods.fedem import sample_losses

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_INIT_TAG = 0xF50F7


@dataclass(frozen=True)
class FedSoftParams:
    """S (the number of centres), λ (the pull towards the weighted centre) and σ (the smallest importance weight)."""

    num_clusters: int = 2
    lam: float = 0.1
    smoother: float = 1e-4

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(1 <= self.num_clusters <= 64, f"{prefix}.num_clusters", self.num_clusters,
                "must be in [1, 64] (every device downloads all the centres each round)")
        require(self.lam >= 0, f"{prefix}.lam", self.lam, "must be >= 0")
        require(0 <= self.smoother * self.num_clusters < 1, f"{prefix}.smoother", self.smoother,
                "must be >= 0 and below 1 / num_clusters")


@dataclass(frozen=True)
class FedSoftState:
    centers: torch.Tensor  # (S, dim)
    assignment: np.ndarray  # (m,): each device's largest importance weight when it last reported; -1 = never


@dataclass(frozen=True)
class FedSoftMessage(Message):
    weights: torch.Tensor
    importance: torch.Tensor  # (S,): u_k


#: the noise that parts the centres, relative to each parameter tensor's standard deviation
INIT_SPREAD = 0.1


def nearby_inits(init: torch.Tensor, spec: ParamSpec, k: int, rng: np.random.Generator) -> torch.Tensor:
    """``k`` initial centres of one lineage: ``init``, then copies with seeded Gaussian noise of
    :data:`INIT_SPREAD` times each tensor's standard deviation (its mean magnitude for a single number)."""
    out = [init.clone()]
    for _ in range(1, k):
        w = init.clone()
        for tensor in spec.unflatten(w).values():  # views into w, one per parameter tensor
            piece = tensor.view(-1)
            spread = float(piece.std()) if piece.numel() > 1 else float(piece.abs().mean())
            noise = torch.from_numpy(rng.standard_normal(piece.numel()).astype(np.float32)).to(init.dtype)
            piece += INIT_SPREAD * spread * noise
        out.append(w)
    return torch.stack(out)


def importance_weights(losses: torch.Tensor, smoother: float) -> torch.Tensor:
    """u: the share of the samples (columns of the (S, n) ``losses``) on which each centre has the smallest loss
    (ties: the lowest), each raised to at least ``smoother``, renormalized to sum to 1 (float64)."""
    s = losses.shape[0]
    best = torch.argmin(losses, dim=0)
    u = torch.bincount(best, minlength=s).double() / max(losses.shape[1], 1)
    u = u.clamp_min(smoother)
    return u / u.sum()


class FedSoft(ClusteredStrategy[FedSoftState, FedSoftMessage, torch.Tensor]):
    name = "fedsoft"
    reads = ServerReads(sums=("models",), per_device=("models", "importance weights"))
    params: FedSoftParams

    def init(self) -> FedSoftState:
        rng = np.random.default_rng([self.seed, 0, _INIT_TAG])
        return FedSoftState(nearby_inits(self.fed.init, self.fed.spec, self.params.num_clusters, rng), self.unassigned())

    def configure(self, state: FedSoftState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.centers, downlink=[(state.centers, len(devices))])

    def local(self, ctx: DeviceContext, dev: PersonalModel, payload: torch.Tensor,
              instruction: None) -> tuple[PersonalModel, FedSoftMessage]:
        d = ctx.data
        centers = payload.to(d.x_train.device)
        u = importance_weights(sample_losses(ctx.net, centers, d.x_train, d.y_train), self.params.smoother)
        weighted = (u.to(centers)[:, None] * centers).sum(0)
        start = dev.weights if dev.trained else weighted
        own, msg = self.train_own(ctx, start, pull_towards(weighted, self.params.lam))
        return own, FedSoftMessage(ctx.device, msg.num_samples, msg.loss, msg.weights, u.cpu())

    def aggregate(self, state: FedSoftState, plan: RoundPlan, msgs: Sequence[FedSoftMessage]) -> tuple[FedSoftState, RoundStats]:
        models = torch.stack([m.weights for m in msgs]).double()
        mass = torch.stack([m.importance * m.num_samples for m in msgs]).double()  # (devices, S): u_ks n_k
        total = mass.sum(0)
        centers = state.centers.clone()
        filled = total > 0
        centers[filled] = ((mass.T @ models)[filled] / total[filled, None]).to(centers.dtype)
        assignment = state.assignment.copy()
        assignment[[m.device for m in msgs]] = [int(torch.argmax(m.importance)) for m in msgs]
        return FedSoftState(centers, assignment), self.clustered_stats(plan, msgs, assignment)
