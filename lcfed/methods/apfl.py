"""APFL: each device mixes a personal model with the global one, v̄ = α v + (1 − α) w, and trains both.

Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461, 2020, Alg. 1.

- Device, at each local step on a batch ξ (the round's batches, stream 0), from the values of the step before:
  ``w <- w − η ∇f(w; ξ)``, ``v <- v − η α ∇f(v̄; ξ)`` (the gradient of f(v̄) in v), and with ``adaptive``
  ``α <- clip(α − η_α ⟨v − w, ∇f(v̄; ξ)⟩, 0, 1)``; uploads w, keeps v and α where it lives.
- Server: FedAvg on w (its sample-weighted mean); asynchronously FedBuff's step, as FedAvg.
- Evaluation: the mixed model α v + (1 − α) w with the current global w; the global model before the device
  has trained.

Choices the paper leaves open: it reports fixed α ∈ {0.25, 0.5, 0.75} and the adaptive variant without one
default; here α = 0.25, fixed, and ``adaptive`` starts from it. η = ``train.lr``; η_α (``alpha_lr``)
defaults to η. The reported training loss is the global model's (comparable with FedAvg's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.local_update import batch_rng, loss_and_grad, minibatches
from lcfed.learning.models import Model
from lcfed.methods.base import DeviceContext, ModelMessage
from lcfed.methods.fedavg import GlobalModel

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class APFLParams:
    """α (the personal model's share of the mix), whether it adapts, and its step (None = train.lr)."""

    alpha: float = 0.25
    adaptive: bool = False
    alpha_lr: float | None = None

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(0 <= self.alpha <= 1, f"{prefix}.alpha", self.alpha, "must be in [0, 1]")
        require(self.alpha_lr is None or self.alpha_lr > 0, f"{prefix}.alpha_lr", self.alpha_lr,
                "must be > 0, or null for train.lr")


@dataclass(frozen=True)
class APFLDevice:
    """A device's personal model v and its mixing weight α, held where the device lives."""

    personal: torch.Tensor
    alpha: float
    trained: bool = False


@dataclass(frozen=True)
class APFLStep:
    w: torch.Tensor
    v: torch.Tensor
    alpha: float
    loss: float  # f(w; ξ)


def apfl_step(net: Model, w: torch.Tensor, v: torch.Tensor, alpha: float, x: torch.Tensor, y: torch.Tensor,
              lr: float, alpha_lr: float | None) -> APFLStep:
    """One APFL step on the batch (x, y) from (w, v, α), none modified; ``alpha_lr`` None keeps α fixed."""
    loss, g_w = loss_and_grad(net, w, x, y)
    _, g_mix = loss_and_grad(net, alpha * v + (1 - alpha) * w, x, y)
    new_alpha = alpha
    if alpha_lr is not None:
        new_alpha = float(np.clip(alpha - alpha_lr * float(torch.dot(v - w, g_mix)), 0.0, 1.0))
    return APFLStep(w - lr * g_w, v - lr * alpha * g_mix, new_alpha, loss)


class APFL(GlobalModel[APFLDevice]):
    name = "apfl"
    params: APFLParams

    def init_device(self, device: int, init: torch.Tensor) -> APFLDevice:
        return APFLDevice(init.clone(), self.params.alpha)

    def local(self, ctx: DeviceContext, dev: APFLDevice, payload: torch.Tensor,
              instruction: None) -> tuple[APFLDevice, ModelMessage]:
        d = ctx.data
        alpha_lr = self.params.alpha_lr if self.params.alpha_lr is not None else ctx.work.lr
        step_alpha = alpha_lr if self.params.adaptive else None
        w, v, alpha = payload.to(d.x_train.device), dev.personal.to(d.x_train.device), dev.alpha
        losses = []
        for idx in minibatches(d.num_train, ctx.work, batch_rng(ctx.seed, ctx.device, ctx.rnd)):
            index = torch.from_numpy(idx).to(d.x_train.device)
            step = apfl_step(ctx.net, w, v, alpha, d.x_train[index], d.y_train[index], ctx.work.lr, step_alpha)
            w, v, alpha = step.w, step.v, step.alpha
            losses.append(step.loss)
        msg = ModelMessage(ctx.device, d.num_train, float(np.mean(losses)), w.detach().cpu())
        return APFLDevice(v.detach().cpu(), alpha, True), msg

    def personalized(self, ctx: DeviceContext, dev: APFLDevice, payload: torch.Tensor) -> torch.Tensor:
        if not dev.trained:
            return payload
        return dev.alpha * dev.personal + (1 - dev.alpha) * payload.to(dev.personal.device)
