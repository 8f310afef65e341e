"""FedProx: FedAvg whose local objective adds a proximal term towards the round's global model.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (arXiv:1812.06127).

- Device: minimizes ``h(w; w_t) = F_k(w) + μ/2 ‖w − w_t‖²`` (Eq. 2) from ``w_t`` with the shared local
  update (each SGD step adds ``μ (w − w_t)`` to the gradient); uploads w.
- Server: FedAvg's sample-weighted mean; asynchronously FedBuff's step, as FedAvg (the proximal term is
  against the model the device started from, which the arrival carries).
- Choices the paper leaves open: μ is tuned per dataset in the paper (from {0.001, 0.01, 0.1, 1});
  the default 0.01 is mid-range. The paper's γ-inexact solutions (stragglers doing partial work) are
  not simulated as such: a device either does the round's full budget or, with the device model, is
  lost. With μ = 0 it is FedAvg, number for number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lcfed.errors import require
from lcfed.learning.local_update import pull_towards
from lcfed.methods.base import DeviceContext, ModelMessage
from lcfed.methods.fedavg import FedAvg

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class FedProxParams:
    """μ, the weight of the proximal term μ/2 ‖w − w_t‖²."""

    mu: float = 0.01

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.mu >= 0, f"{prefix}.mu", self.mu, "must be >= 0")


class FedProx(FedAvg):
    name = "fedprox"
    params: FedProxParams

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: None) -> tuple[None, ModelMessage]:
        start = payload.to(ctx.data.x_train.device)
        res = ctx.local_update(start, pull_towards(start, self.params.mu))
        return None, ModelMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu())
