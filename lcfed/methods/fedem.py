"""FedEM: every device's data is a mixture of M shared components; the devices' mixture weights and the
components are learned by federated EM.

Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of Distributions",
NeurIPS 2021 (arXiv:2108.10252), Alg. 1 (client-server FedEM).

- Server state: M component models θ_1..θ_M, broadcast whole to the round's devices (M models down).
- Device t, each round it takes part, with its mixture weights π_t (uniform before its first round):
  E-step: for each training sample i, the responsibility q(m | i) ∝ π_tm · exp(−ℓ(θ_m; x_i, y_i)) (a
  softmax over m of log π_tm − ℓ, with the sample's cross-entropy ℓ); then π_t ← the mean of q over its samples.
  M-step: each component m does the round's local SGD from θ_m on the responsibility-weighted loss
  (1/|B|) Σ_{i∈B} q(m | i) ℓ(θ; x_i, y_i). It uploads the M trained components and π_t.
- Server: each component is the sample-weighted mean (n_t) of the participants' copies (the paper's
  ω_t = n_t / n, not n_t π_tm); asynchronously FedBuff's step on the M components together.
- Evaluation: the device's most probable component, argmax_m π_tm (ties: the lowest m).

Choices the paper leaves open, or that this repository's contract fixes:

- Prediction: the paper's personalized predictor is the mixture of the components' outputs,
  Σ_m π_tm p_θm(y | x). The Strategy contract scores one weight vector per device, so lcfed evaluates the
  component with the largest π_tm. Where π_t is one-hot (devices drawn from one component) the two agree;
  where it is soft, this under-states FedEM.
- Components start apart: θ_1 is the federation's initial model and θ_m (m > 1) permutes every parameter
  tensor's entries (IFCA's seeded distinct inits); from one shared init the E-step could never tell them apart.
- Local work: each component gets the round's whole budget (``train.local_steps`` or ``train.local_epochs``),
  on the same batches (stream 0): M times a single model's computation, as in the paper.
- The E-step uses the whole local training set with the components as received, before the M-step (as the
  authors' code does). The reported training loss is the sum over components of their mean weighted batch loss.
- What the server reads: the M models and π_t (M numbers, counted in ``bytes_up``); π_t serves only the
  metrics (``assignment`` = argmax π_t, hence ``ari`` / ``nmi``), never the algorithm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from lcfed.errors import require
from lcfed.learning.clustering import weighted_mean
from lcfed.learning.local_update import DeviceData, LocalWork, batch_rng, minibatches
from lcfed.learning.models import Model
from lcfed.methods.base import (
    Arrival,
    DeviceContext,
    Message,
    RoundPlan,
    RoundStats,
    ServerReads,
    Strategy,
    buffered_step,
)
from lcfed.methods.ifca import distinct_inits

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_INIT_TAG = 0xFE4


@dataclass(frozen=True)
class FedEMParams:
    """M, the number of mixture components (the paper's experiments use 3)."""

    num_components: int = 3

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(1 <= self.num_components <= 64, f"{prefix}.num_components", self.num_components,
                "must be in [1, 64] (every device trains and uploads all of them each round)")


@dataclass(frozen=True)
class FedEMState:
    components: torch.Tensor  # (M, dim)
    assignment: np.ndarray  # (m,): each device's most probable component when it last reported; -1 = never


@dataclass(frozen=True)
class MixtureWeights:
    """A device's mixture weights π_t over the components, kept where the device lives."""

    pi: torch.Tensor  # (M,), float64
    trained: bool = False


@dataclass(frozen=True)
class FedEMMessage(Message):
    weights: torch.Tensor  # (M, dim): the device's trained copy of every component
    pi: torch.Tensor  # (M,): its new mixture weights (metrics only)


def sample_losses(net: Model, components: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """ℓ(θ_m; x_i, y_i) for every component m and sample i: an (M, n) float64 matrix."""
    with torch.no_grad():
        return torch.stack([F.cross_entropy(net(w, x), y, reduction="none") for w in components]).double()


def e_step(losses: torch.Tensor, pi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FedEM's E-step on one device: responsibilities q (M, n), q[m, i] ∝ π_m exp(−losses[m, i]), and the
    new mixture weights, the mean of q over the samples."""
    q = torch.softmax(torch.log(pi.double())[:, None] - losses.double(), dim=0)
    return q, q.mean(1)


def weighted_fit(net: Model, w0: torch.Tensor, q: torch.Tensor, data: DeviceData, work: LocalWork,
                 rng: np.random.Generator) -> tuple[torch.Tensor, float]:
    """One component's M-step: local SGD from ``w0`` (not modified) on (1/|B|) Σ_{i∈B} q_i ℓ(w; x_i, y_i);
    the new weights and the mean weighted batch loss."""
    w, losses = w0.detach().clone(), []
    weight = q.to(device=data.x_train.device, dtype=w.dtype)
    for idx in minibatches(data.num_train, work, rng):
        index = torch.from_numpy(idx).to(data.x_train.device)
        leaf = w.detach().requires_grad_(True)
        per_sample = F.cross_entropy(net(leaf, data.x_train[index]), data.y_train[index], reduction="none")
        loss = (per_sample * weight[index]).sum() / len(idx)
        (grad,) = torch.autograd.grad(loss, leaf)
        w = w - work.lr * grad
        losses.append(float(loss.detach()))
    return w.detach(), float(np.mean(losses)) if losses else float("nan")


class FedEM(Strategy[FedEMState, MixtureWeights, FedEMMessage, torch.Tensor]):
    name = "fedem"
    supports_async = True
    reads = ServerReads(sums=("models",), per_device=("models (one per component)", "sample counts per component"))
    params: FedEMParams

    def init(self) -> FedEMState:
        rng = np.random.default_rng([self.seed, 0, _INIT_TAG])
        components = distinct_inits(self.fed.init, self.fed.spec, self.params.num_components, rng)
        return FedEMState(components, np.full(self.fed.num_devices, -1, dtype=np.int64))

    def configure(self, state: FedEMState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.components, downlink=[(state.components, len(devices))])

    def init_device(self, device: int, init: torch.Tensor) -> MixtureWeights:
        m = self.params.num_components
        return MixtureWeights(torch.full((m,), 1.0 / m, dtype=torch.float64))

    def local(self, ctx: DeviceContext, dev: MixtureWeights, payload: torch.Tensor,
              instruction: None) -> tuple[MixtureWeights, FedEMMessage]:
        d = ctx.data
        components = payload.to(d.x_train.device)
        q, pi = e_step(sample_losses(ctx.net, components, d.x_train, d.y_train), dev.pi)
        trained, loss = [], 0.0
        for m, theta in enumerate(components):
            w, component_loss = weighted_fit(ctx.net, theta, q[m], d, ctx.work, batch_rng(ctx.seed, ctx.device, ctx.rnd))
            trained.append(w.cpu())
            loss += component_loss
        pi = pi.cpu()
        return MixtureWeights(pi, True), FedEMMessage(ctx.device, d.num_train, loss, torch.stack(trained), pi)

    @staticmethod
    def most_probable(assignment: np.ndarray, msgs: Sequence[FedEMMessage]) -> np.ndarray:
        """``assignment`` with each sender's argmax π_t (ties: the lowest component)."""
        out = assignment.copy()
        out[[m.device for m in msgs]] = [int(torch.argmax(m.pi)) for m in msgs]
        return out

    def aggregate(self, state: FedEMState, plan: RoundPlan, msgs: Sequence[FedEMMessage]) -> tuple[FedEMState, RoundStats]:
        shape = state.components.shape
        copies = torch.stack([m.weights.reshape(-1) for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        assignment = self.most_probable(state.assignment, msgs)
        new = FedEMState(weighted_mean(copies, counts).reshape(shape), assignment)
        return new, self.clustered_stats(plan, msgs, assignment)

    def aggregate_async(self, state: FedEMState, plan: RoundPlan,
                        arrivals: Sequence[Arrival[FedEMMessage]]) -> tuple[FedEMState, RoundStats]:
        """FedBuff on the M components together: each arrival moves them by its staleness-weighted update
        against the components it started from."""
        msgs = [a.message for a in arrivals]
        assignment = self.most_probable(state.assignment, msgs)
        new = FedEMState(buffered_step(state.components, arrivals), assignment)
        return new, self.clustered_stats(plan, msgs, assignment)

    def eval_payload(self, state: FedEMState) -> torch.Tensor:
        return state.components

    def personalized(self, ctx: DeviceContext, dev: MixtureWeights, payload: torch.Tensor) -> torch.Tensor:
        return payload[int(torch.argmax(dev.pi))]
