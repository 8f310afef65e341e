"""FedPer: the base layers (embedding φ) are federated, the personalization layer (decision h) is not.

Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization Layers",
arXiv:1912.00818, 2019.

- Server: φ = sample-weighted mean of the participants' φ_i (FedAvg on the base layers only).
- Device: trains (φ, h_i) with the shared local update from the downloaded φ and its own h_i, keeps
  h_i, uploads only φ_i; it downloads only φ. Both directions count φ's bytes alone.
- Split: the paper leaves the number of personalization layers open; here it is the project's
  decision layer h (the last linear layer), as in LCFed's comparison (``docs/methods.md``).
- Every h_i starts from the federation's init; the personalized model is (current φ, h_i).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lcfed.methods.base import DeviceContext, Message, RoundPlan, RoundStats, ServerReads, Strategy

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class FedPerParams:
    """No hyper-parameters beyond the shared training budget (the split is the model's φ / h)."""

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        return None


@dataclass(frozen=True)
class FedPerState:
    embedding: torch.Tensor  # φ, the embedding part only


@dataclass(frozen=True)
class PersonalHead:
    decision: torch.Tensor  # h_i, never leaves the device


@dataclass(frozen=True)
class EmbeddingMessage(Message):
    embedding: torch.Tensor


class FedPer(Strategy[FedPerState, PersonalHead, EmbeddingMessage, torch.Tensor]):
    name = "fedper"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    reads = ServerReads(sums=("embeddings",), per_device=(), private=True)

    def init(self) -> FedPerState:
        return FedPerState(self.fed.init[: self.fed.spec.embedding_size].clone())

    def configure(self, state: FedPerState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.embedding, downlink=[(state.embedding, len(devices))])

    def init_device(self, device: int, init: torch.Tensor) -> PersonalHead:
        return PersonalHead(init[self.fed.spec.embedding_size :].clone())

    def local(
        self, ctx: DeviceContext, dev: PersonalHead, payload: torch.Tensor, instruction: None
    ) -> tuple[PersonalHead, EmbeddingMessage]:
        where = ctx.data.x_train.device
        res = ctx.local_update(torch.cat([payload.to(where), dev.decision.to(where)]))
        emb = self.fed.spec.embedding_size
        head = PersonalHead(res.weights[emb:].clone())
        return head, EmbeddingMessage(ctx.device, ctx.data.num_train, res.loss, res.weights[:emb].cpu().clone())

    def aggregate(self, state: FedPerState, plan: RoundPlan, msgs: Sequence[EmbeddingMessage]) -> tuple[FedPerState, RoundStats]:
        embeddings = torch.stack([m.embedding for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        new = FedPerState(self.private_mean(plan.rnd, embeddings, counts, state.embedding))
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def eval_payload(self, state: FedPerState) -> torch.Tensor:
        return state.embedding

    def personalized(self, ctx: DeviceContext, dev: PersonalHead, payload: torch.Tensor) -> torch.Tensor:
        return torch.cat([payload.to(dev.decision.device), dev.decision])
