"""Per-FedAvg: a MAML meta-model trained federatedly; each device personalizes it with one gradient step.

Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020.

- Objective: min_w (1/n) Σ_i f_i(w - α ∇f_i(w)).
- Local step (Alg. 1), with independent batches D, D' (and D'' for HF) drawn from the device's
  training data:  w_tmp = w - α ∇f(w; D);  w <- w - β ∇f(w_tmp; D')  (first-order, "FO", default),
  or  w <- w - β (I - α ∇²f(w; D'')) ∇f(w_tmp; D')  ("HF"; the paper estimates the Hessian-vector
  product by a difference of two gradients, here it is computed exactly by double backpropagation).
- Server: the plain mean of the participants' meta-models (Alg. 1 averages with weight 1/(rn), the
  objective weighs users equally).
- Personalized model of a device: the meta-model after ONE step of size α on one training batch of
  that device; the batch depends on (seed, device, number of aggregated rounds) only.

Decisions where the paper leaves room:

- FO is the default (two gradients per step, no second-order term); the shared local budget
  (``train.local_steps`` / ``local_epochs``) counts meta-steps, each drawing its own D and D'.
- β defaults to ``train.lr`` so Per-FedAvg runs on the same step size as every other method.
- α = 0.01 by default: on digits, 20 devices with 2 classes each (lr 0.05), α = 0.01 / 0.02 / 0.05 reached 0.77 / 0.64 /
  0.50 mean accuracy after 10 rounds; with a large α the meta-model's own loss diverges.
- The reported training loss is f(w; D) at the meta-model (comparable to the other methods').
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from lcfed.errors import require
from lcfed.learning.local_update import LocalWork, batch_rng, loss_and_grad, minibatches
from lcfed.learning.models import Model
from lcfed.methods.base import DeviceContext, ModelMessage, RoundPlan, RoundStats, ServerReads, Strategy

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

VARIANTS = ("fo", "hf")
# independent batch streams per (device, round); stream 0 is every other method's local_update
_INNER, _OUTER, _HESSIAN, _ADAPT = 1, 2, 3, 4


@dataclass(frozen=True)
class PerFedAvgParams:
    """Inner step α (also the personalization step), outer step β (None = train.lr), FO or HF variant."""

    alpha: float = 0.01
    beta: float | None = None
    variant: str = "fo"

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.alpha > 0, f"{prefix}.alpha", self.alpha, "must be > 0")
        require(self.beta is None or self.beta > 0, f"{prefix}.beta", self.beta, "must be > 0, or null for train.lr")
        require(self.variant in VARIANTS, f"{prefix}.variant", self.variant, f"one of {list(VARIANTS)}")


@dataclass(frozen=True)
class PerFedAvgState:
    weights: torch.Tensor  # the meta-model
    rounds: int = 0  # aggregated rounds; picks the personalization batch


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    y: torch.Tensor


def hessian_vector_product(net: Model, w: torch.Tensor, batch: Batch, v: torch.Tensor) -> torch.Tensor:
    """∇²f(w; batch) v for the mean cross-entropy, by double backpropagation."""
    w = w.detach().requires_grad_(True)
    loss = F.cross_entropy(net(w, batch.x), batch.y)
    (grad,) = torch.autograd.grad(loss, w, create_graph=True)
    (hv,) = torch.autograd.grad(grad @ v.detach(), w)
    return hv


def maml_step(
    net: Model, w: torch.Tensor, inner: Batch, outer: Batch, alpha: float, beta: float, hessian: Batch | None = None
) -> tuple[torch.Tensor, float]:
    """One Per-FedAvg meta-step from ``w`` (not modified); returns the new weights and f(w; inner).

    FO without ``hessian``; HF (the (I - α ∇²f(w; D'')) correction) with it.
    """
    loss, g_inner = loss_and_grad(net, w, inner.x, inner.y)
    w_tmp = w - alpha * g_inner
    _, g_outer = loss_and_grad(net, w_tmp, outer.x, outer.y)
    if hessian is not None:
        g_outer = g_outer - alpha * hessian_vector_product(net, w, hessian, g_outer)
    return w - beta * g_outer, loss


def adapt(net: Model, w: torch.Tensor, batch: Batch, alpha: float) -> torch.Tensor:
    """The personalized model: one gradient step of size α from the meta-model on a local batch."""
    _, grad = loss_and_grad(net, w, batch.x, batch.y)
    return w - alpha * grad


def _batches(x: torch.Tensor, y: torch.Tensor, work: LocalWork, rng: np.random.Generator) -> list[Batch]:
    out = []
    for idx in minibatches(int(y.shape[0]), work, rng):
        index = torch.from_numpy(idx).to(x.device)
        out.append(Batch(x[index], y[index]))
    return out


class PerFedAvg(Strategy[PerFedAvgState, None, ModelMessage, torch.Tensor]):
    name = "perfedavg"
    reads = ServerReads(sums=("models",), per_device=())
    params: PerFedAvgParams

    @property
    def beta(self) -> float:
        return self.params.beta if self.params.beta is not None else self.cfg.train.lr

    def init(self) -> PerFedAvgState:
        return PerFedAvgState(self.fed.init.clone())

    def configure(self, state: PerFedAvgState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.weights, downlink=[(state.weights, len(devices))])

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: None) -> tuple[None, ModelMessage]:
        d = ctx.data

        def stream(tag: int) -> list[Batch]:
            return _batches(d.x_train, d.y_train, ctx.work, batch_rng(ctx.seed, ctx.device, ctx.rnd, tag))

        inner, outer = stream(_INNER), stream(_OUTER)
        hess: Sequence[Batch | None] = stream(_HESSIAN) if self.params.variant == "hf" else [None] * len(inner)
        w = payload.to(d.x_train.device)
        losses = []
        for b1, b2, b3 in zip(inner, outer, hess, strict=True):
            w, loss = maml_step(ctx.net, w, b1, b2, self.params.alpha, self.beta, b3)
            losses.append(loss)
        return None, ModelMessage(ctx.device, d.num_train, float(np.mean(losses)), w.detach().cpu())

    def aggregate(
        self, state: PerFedAvgState, plan: RoundPlan, msgs: Sequence[ModelMessage]
    ) -> tuple[PerFedAvgState, RoundStats]:
        models = torch.stack([m.weights for m in msgs])
        new = PerFedAvgState(models.mean(0), plan.rnd + 1)
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def eval_payload(self, state: PerFedAvgState) -> PerFedAvgState:
        return state

    def personalized(self, ctx: DeviceContext, dev: None, payload: PerFedAvgState) -> torch.Tensor:
        d = ctx.data
        one = replace(ctx.work, steps=1, epochs=None)  # the round's work but one step: any later field carried
        (batch,) = _batches(d.x_train, d.y_train, one, batch_rng(ctx.seed, ctx.device, payload.rounds, _ADAPT))
        return adapt(ctx.net, payload.weights.to(d.x_train.device), batch, self.params.alpha)
