"""Class-balanced FedAvg: FedAvg whose devices run a local loop of their own, weighing each sample so that every
class present on the device counts equally (a device with 90 % "1"s learns its few "7"s as much as its "1"s).

The shared ``ctx.local_update`` minimizes the plain mean loss, so the method writes its own loop. It keeps what
makes runs reproducible: the shared loop's batches (stream 0 of ``batch_rng``, drawn by ``minibatches``), the
model called as ``ctx.net(weights, x)``, and no generator but seeded ones.

Run it from this folder: ``lcfed run -c ../../../configs/demo.yaml --set method.name=balanced:BalancedFedAvg``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lcfed.config import ExperimentConfig, require
from lcfed.learning.local_update import batch_rng, minibatches
from lcfed.methods.base import DeviceContext, ModelMessage
from lcfed.methods.fedavg import FedAvg


@dataclass(frozen=True)
class BalancedParams:
    """``power``: 1 weighs each sample by the inverse of its class's count on the device, 0 is plain FedAvg's
    loss (computed by this loop, so not bit for bit FedAvg's numbers)."""

    power: float = 1.0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(0 <= self.power <= 1, f"{prefix}.power", self.power, "must be in [0, 1]")


def class_weights(y: torch.Tensor, power: float) -> torch.Tensor:
    """Each sample's weight ``(n / (C · n_y)) ** power`` (C classes present, n_y samples of its class): the weights
    average 1 when ``power`` is 1, so the loss keeps FedAvg's scale."""
    counts = torch.bincount(y)
    present = int((counts > 0).sum())
    return (len(y) / (present * counts[y].double())) ** power


class BalancedFedAvg(FedAvg):
    name = "balanced"
    Params = BalancedParams
    params: BalancedParams

    # --8<-- [start:local]
    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: None) -> tuple[None, ModelMessage]:
        d = ctx.data
        weight = class_weights(d.y_train, self.params.power).to(device=d.x_train.device, dtype=payload.dtype)
        w, losses = payload.to(d.x_train.device).detach().clone(), []
        # the shared loop's batches: stream 0 of this device's generator for this round
        for idx in minibatches(d.num_train, ctx.work, batch_rng(ctx.seed, ctx.device, ctx.rnd)):
            index = torch.from_numpy(idx).to(d.x_train.device)
            leaf = w.detach().requires_grad_(True)
            per_sample = F.cross_entropy(ctx.net(leaf, d.x_train[index]), d.y_train[index], reduction="none")
            loss = (per_sample * weight[index]).mean()
            (grad,) = torch.autograd.grad(loss, leaf)
            w = w - ctx.work.lr * grad
            losses.append(float(loss.detach()))
        mean_loss = float(np.mean(losses)) if losses else float("nan")
        return None, ModelMessage(ctx.device, d.num_train, mean_loss, w.detach().cpu())
    # --8<-- [end:local]
