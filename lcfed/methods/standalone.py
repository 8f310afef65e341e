"""Standalone: every device trains only on its own data; nothing is shared (the control run).

Clustering only helps where a clustered method beats this.
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
class StandaloneParams:
    """No hyper-parameters beyond the shared training budget."""

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        return None


@dataclass(frozen=True)
class StandaloneState:
    rnd: int = 0


@dataclass(frozen=True)
class LocalModel:
    weights: torch.Tensor


class Standalone(Strategy[StandaloneState, LocalModel, Message, None]):
    name = "standalone"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    reads = ServerReads(sums=(), per_device=(), private=True)

    def init(self) -> StandaloneState:
        return StandaloneState()

    def configure(self, state: StandaloneState, rnd: int) -> RoundPlan:
        return RoundPlan(rnd, self.participants(rnd), None)

    def init_device(self, device: int, init: torch.Tensor) -> LocalModel:
        return LocalModel(init.clone())

    def local(self, ctx: DeviceContext, dev: LocalModel, payload: None, instruction: None) -> tuple[LocalModel, Message]:
        res = ctx.local_update(dev.weights)
        return LocalModel(res.weights), Message(ctx.device, ctx.data.num_train, res.loss)

    def aggregate(self, state: StandaloneState, plan: RoundPlan, msgs: Sequence[Message]) -> tuple[StandaloneState, RoundStats]:
        return StandaloneState(plan.rnd + 1), RoundStats(self.mean_loss(msgs), 0, 0)

    def personalized(self, ctx: DeviceContext, dev: LocalModel, payload: None) -> torch.Tensor:
        return dev.weights
