"""Ditto: FedAvg's global model, and on every device a personal model pulled towards it.

Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021
(arXiv:2012.04221), Alg. 1.

- Global model w: FedAvg's (the shared local update from w_t on the round's batches, stream 0; the
  sample-weighted mean on the server); asynchronously FedBuff's step, as FedAvg.
- Personal model v_k, kept where the device lives and never uploaded: ``min F_k(v) + λ/2 ‖v − w_t‖²``
  with SGD, against the global model w_t the device received this round, on batches of its own
  (stream 1 of the same (seed, device, round)).
- Evaluation: the personal model once the device has trained, the global model before.

Choices the paper leaves open: λ is tuned per dataset (the paper's grid {0.05, 0.1, 0.2, 0.5, 1, 2}, or its
local selection heuristic); default 0.1. The personal model's local work s defaults to the round's budget
(``method.personal_steps`` = 0; a positive value is a number of SGD steps). Only selected devices update
v_k (Alg. 1); with the device model a lost device's v_k stays as it was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lcfed.errors import require
from lcfed.learning.local_update import batch_rng, local_update, pull_towards
from lcfed.methods.base import DeviceContext, ModelMessage, PersonalModel
from lcfed.methods.fedavg import GlobalModel

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_PERSONAL = 1  # the personal model's batch stream


@dataclass(frozen=True)
class DittoParams:
    """λ (the personal model's pull towards the global one) and its local steps (0: the round's budget)."""

    lam: float = 0.1
    personal_steps: int = 0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.lam >= 0, f"{prefix}.lam", self.lam, "must be >= 0")
        require(self.personal_steps >= 0, f"{prefix}.personal_steps", self.personal_steps,
                "must be >= 0 (0: the round's local budget)")


def personal_step(ctx: DeviceContext, v: torch.Tensor, w_t: torch.Tensor, lam: float, steps: int = 0) -> torch.Tensor:
    """Ditto's personal update: SGD on F_k(v) + λ/2 ‖v − w_t‖² from ``v`` (not modified), on stream 1."""
    work = dataclasses.replace(ctx.work, steps=steps, epochs=None) if steps > 0 else ctx.work
    rng = batch_rng(ctx.seed, ctx.device, ctx.rnd, _PERSONAL)
    return local_update(ctx.net, v.to(w_t.device), ctx.data, work, rng, pull_towards(w_t, lam)).weights


class Ditto(GlobalModel[PersonalModel]):
    name = "ditto"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    params: DittoParams

    def init_device(self, device: int, init: torch.Tensor) -> PersonalModel:
        return PersonalModel(init.clone())

    def local(self, ctx: DeviceContext, dev: PersonalModel, payload: torch.Tensor,
              instruction: None) -> tuple[PersonalModel, ModelMessage]:
        w_t = payload.to(ctx.data.x_train.device)
        shared = ctx.local_update(w_t)
        v = personal_step(ctx, dev.weights, w_t, self.params.lam, self.params.personal_steps)
        return PersonalModel(v.cpu(), True), ModelMessage(ctx.device, ctx.data.num_train, shared.loss, shared.weights.cpu())

    def personalized(self, ctx: DeviceContext, dev: PersonalModel, payload: torch.Tensor) -> torch.Tensor:
        return dev.weights if dev.trained else payload
