"""SCAFFOLD: local steps corrected by control variates, which estimate each device's drift from the server's
update direction.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020 (arXiv:1910.06378), Alg. 1.

- Server state: the model x and the server control variate c (zeros at first).
- Device i (its control variate c_i, zeros at first, kept where the device lives): from y = x, K local
  steps ``y <- y - η_l (g_i(y) - c_i + c)`` on the round's batches; then option II,
  ``c_i+ = c_i - c + (x - y) / (K η_l)``; uploads Δy = y - x and Δc = c_i+ - c_i, keeps c_i+.
- Server: ``x <- x + η_g · mean Δy``, ``c <- c + (1/N) Σ Δc`` over the round's devices (N: the training
  devices; (|S|/N) · mean in the paper).
- Traffic: x and c down, Δy and Δc up: twice FedAvg's bytes each way, all of it per layer.

Choices the paper leaves open or this repository fixes:

- η_l is ``train.lr``, K the round's local steps (``train.local_steps``, or the batches of
  ``train.local_epochs``); η_g defaults to 1, the value of most of the paper's experiments.
- Means over devices are plain (unweighted), as in Alg. 1; FedAvg here weighs by samples.
- Option I (c_i+ = the gradient at x over the device's data) is not offered: option II costs nothing extra
  and is the variant the paper's experiments use.
- A device that is not selected keeps its c_i; with the device model a lost device's round is never
  computed, so its c_i stays too. No asynchronous aggregation: a stale Δc would move c by a drift
  measured against an older x.
- Evaluation is on the global model x (SCAFFOLD is not personalized).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.local_update import batch_rng, loss_and_grad, minibatches
from lcfed.methods.base import DeviceContext, Message, RoundPlan, RoundStats, ServerReads, Strategy

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class ScaffoldParams:
    """η_g, the server's step on the mean model update (1: the mean itself)."""

    global_lr: float = 1.0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.global_lr > 0, f"{prefix}.global_lr", self.global_lr, "must be > 0")


@dataclass(frozen=True)
class ScaffoldState:
    weights: torch.Tensor  # x
    control: torch.Tensor  # c


@dataclass(frozen=True)
class ScaffoldPayload:
    """What a device downloads: the model and the server control variate."""

    weights: torch.Tensor
    control: torch.Tensor


@dataclass(frozen=True)
class ControlVariate:
    """A device's c_i, held where the device lives (checkpointed with the device states)."""

    control: torch.Tensor


@dataclass(frozen=True)
class ScaffoldMessage(Message):
    delta_weights: torch.Tensor  # Δy = y - x
    delta_control: torch.Tensor  # Δc = c_i+ - c_i


@dataclass(frozen=True)
class CorrectedResult:
    weights: torch.Tensor
    loss: float
    steps: int


def corrected_sgd(ctx: DeviceContext, start: torch.Tensor, correction: torch.Tensor) -> CorrectedResult:
    """SGD from ``start`` (not modified) on the round's batches (stream 0, FedAvg's) with ``correction``
    (c - c_i) added to every gradient."""
    d = ctx.data
    w = start.detach().clone()
    losses = []
    for idx in minibatches(d.num_train, ctx.work, batch_rng(ctx.seed, ctx.device, ctx.rnd)):
        index = torch.from_numpy(idx).to(d.x_train.device)
        loss, grad = loss_and_grad(ctx.net, w, d.x_train[index], d.y_train[index])
        w -= ctx.work.lr * (grad + correction)
        losses.append(loss)
    return CorrectedResult(w, float(np.mean(losses)) if losses else float("nan"), len(losses))


def option_two(c_i: torch.Tensor, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    """Alg. 1's option II: ``c_i+ = c_i - c + (x - y) / (K η_l)``."""
    return c_i - c + (x - y) / (steps * lr)


class Scaffold(Strategy[ScaffoldState, ControlVariate, ScaffoldMessage, ScaffoldPayload]):
    name = "scaffold"
    reads = ServerReads(sums=("updates", "control variates"), per_device=())
    params: ScaffoldParams

    def init(self) -> ScaffoldState:
        return ScaffoldState(self.fed.init.clone(), torch.zeros_like(self.fed.init))

    def configure(self, state: ScaffoldState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        payload = ScaffoldPayload(state.weights, state.control)
        return self.plan(rnd, devices, payload, downlink=[(payload, len(devices))])

    def init_device(self, device: int, init: torch.Tensor) -> ControlVariate:
        return ControlVariate(torch.zeros_like(init))

    def local(self, ctx: DeviceContext, dev: ControlVariate, payload: ScaffoldPayload,
              instruction: None) -> tuple[ControlVariate, ScaffoldMessage]:
        where = ctx.data.x_train.device
        x, c, c_i = payload.weights.to(where), payload.control.to(where), dev.control.to(where)
        res = corrected_sgd(ctx, x, c - c_i)  # a device has training samples, so K >= 1
        c_new = option_two(c_i, c, x, res.weights, res.steps, ctx.work.lr)
        msg = ScaffoldMessage(ctx.device, ctx.data.num_train, res.loss, (res.weights - x).cpu(), (c_new - c_i).cpu())
        return ControlVariate(c_new.cpu()), msg

    def aggregate(self, state: ScaffoldState, plan: RoundPlan,
                  msgs: Sequence[ScaffoldMessage]) -> tuple[ScaffoldState, RoundStats]:
        dy = torch.stack([m.delta_weights for m in msgs]).to(torch.float64)
        dc = torch.stack([m.delta_control for m in msgs]).to(torch.float64)
        x = state.weights.to(torch.float64) + self.params.global_lr * dy.mean(0)
        c = state.control.to(torch.float64) + dc.sum(0) / len(self.fed.training_devices())
        new = ScaffoldState(x.to(state.weights.dtype), c.to(state.control.dtype))
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def eval_payload(self, state: ScaffoldState) -> torch.Tensor:
        return state.weights

    def personalized(self, ctx: DeviceContext, dev: ControlVariate, payload: torch.Tensor) -> torch.Tensor:
        return payload
