"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds (mu/2) ||w - w_global||^2.

A plugin method is a Strategy subclass with its hyper-parameters as a dataclass ``Params``; here the
server side is FedAvg's, and only the device's local update changes. With mu = 0 it is FedAvg,
number for number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lcfed.config import ExperimentConfig, require
from lcfed.learning.local_update import Proximal, batch_rng, local_update
from lcfed.methods.base import DeviceContext
from lcfed.methods.fedavg import FedAvg, ModelMessage


@dataclass(frozen=True)
class FedProxParams:
    mu: float = 0.01  # weight of the proximal term

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.mu >= 0, f"{prefix}.mu", self.mu, "must be >= 0")


class FedProx(FedAvg):
    name = "fedprox"
    Params = FedProxParams
    compare_space = str(Path(__file__).with_name("fedprox_space.yaml"))  # what `lcfed compare` tunes

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: None) -> tuple[None, ModelMessage]:
        start = payload.to(ctx.data.x_train.device)
        pull = [Proximal(start, self.params.mu)]  # towards the round's global model
        res = local_update(ctx.net, start, ctx.data, ctx.work, batch_rng(ctx.seed, ctx.device, ctx.rnd), pull)
        return None, ModelMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu())
