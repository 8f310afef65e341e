"""FedRep: a shared representation (the body φ) learned federatedly, a personal head h_i trained on top of it.

Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021 (arXiv:2102.07078), Alg. 1.

- Device, each round, from the downloaded φ and its own h_i: first the head alone (φ frozen) for
  ``head_factor`` times the round's local budget, then the body alone (h_i frozen, the new one) for the
  round's budget; keeps h_i, uploads φ_i. Head and body draw independent batches (streams 1 and 0).
- Server: φ = the sample-weighted mean of the φ_i (FedPer's server, whose state and messages this reuses).
- Evaluation: (current φ, h_i), as FedPer.

Choices the paper leaves open or this repository fixes: the split is the model's φ / h (the head is the
decision layer, the last linear layer, as in the paper's experiments); the paper's 10 local epochs for the
head and 1 for the body become ``head_factor`` = 10 times the body's budget (``train.local_steps`` or
``train.local_epochs``), so with ``train.local_epochs: 1`` it is the paper's setting. The reported
training loss is the body phase's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.local_update import DeviceData, LocalWork, batch_rng, loss_and_grad, minibatches
from lcfed.learning.models import Model
from lcfed.methods.base import DeviceContext
from lcfed.methods.fedper import EmbeddingMessage, FedPer, PersonalHead

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_HEAD = 1  # the head phase's batch stream (the body's is stream 0, FedAvg's)


@dataclass(frozen=True)
class FedRepParams:
    """How many times the round's local budget the head trains before the body (the paper: 10 epochs to 1)."""

    head_factor: int = 10

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        require(self.head_factor >= 1, f"{prefix}.head_factor", self.head_factor, "must be >= 1")


@dataclass(frozen=True)
class PartResult:
    weights: torch.Tensor
    loss: float


def part_sgd(net: Model, w: torch.Tensor, part: slice, data: DeviceData, work: LocalWork,
             rng: np.random.Generator) -> PartResult:
    """SGD on ``w[part]`` only, the rest frozen, from ``w`` (not modified)."""
    w = w.detach().clone()
    losses = []
    for idx in minibatches(data.num_train, work, rng):
        index = torch.from_numpy(idx).to(data.x_train.device)
        loss, grad = loss_and_grad(net, w, data.x_train[index], data.y_train[index])
        w[part] -= work.lr * grad[part]
        losses.append(loss)
    return PartResult(w, float(np.mean(losses)) if losses else float("nan"))


def scaled(work: LocalWork, factor: int) -> LocalWork:
    """``factor`` times the budget, in its own unit (steps or epochs)."""
    if work.epochs is not None:
        return dataclasses.replace(work, epochs=work.epochs * factor)
    assert work.steps is not None
    return dataclasses.replace(work, steps=work.steps * factor)


class FedRep(FedPer):
    name = "fedrep"
    samples_in_sgd_only = False  # its own SGD on the head and the body (part_sgd), not DP-SGD
    params: FedRepParams

    def local(self, ctx: DeviceContext, dev: PersonalHead, payload: torch.Tensor,
              instruction: None) -> tuple[PersonalHead, EmbeddingMessage]:
        where, emb = ctx.data.x_train.device, self.fed.spec.embedding_size
        w = torch.cat([payload.to(where), dev.decision.to(where)])
        head = part_sgd(ctx.net, w, slice(emb, None), ctx.data, scaled(ctx.work, self.params.head_factor),
                        batch_rng(ctx.seed, ctx.device, ctx.rnd, _HEAD))
        body = part_sgd(ctx.net, head.weights, slice(0, emb), ctx.data, ctx.work,
                        batch_rng(ctx.seed, ctx.device, ctx.rnd))
        return (PersonalHead(body.weights[emb:].cpu().clone()),
                EmbeddingMessage(ctx.device, ctx.data.num_train, body.loss, body.weights[:emb].cpu().clone()))
