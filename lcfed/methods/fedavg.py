"""FedAvg: one global model, the sample-weighted mean of the participants' local models.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017.

Its server side is :class:`GlobalModel`, generic over the device state, which the methods that keep one
global model and something on the device as well (Ditto, APFL) build on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lcfed.methods.base import (
    Arrival,
    D,
    DeviceContext,
    ModelMessage,
    RoundPlan,
    RoundStats,
    ServerReads,
    Strategy,
    buffered_step,
)

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class FedAvgParams:
    """FedAvg has no hyper-parameters beyond the shared training budget."""

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        return None


@dataclass(frozen=True)
class FedAvgState:
    weights: torch.Tensor


class GlobalModel(Strategy[FedAvgState, D, ModelMessage, torch.Tensor]):
    """FedAvg's server: one global model broadcast to the round's devices, which upload their trained copy;
    the device side (and what a device keeps, ``D``) is the subclass's."""

    supports_async = True
    reads = ServerReads(sums=("models",), per_device=(), private=True)

    def init(self) -> FedAvgState:
        return FedAvgState(self.fed.init.clone())

    def configure(self, state: FedAvgState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.weights, downlink=[(state.weights, len(devices))])

    def aggregate(self, state: FedAvgState, plan: RoundPlan, msgs: Sequence[ModelMessage]) -> tuple[FedAvgState, RoundStats]:
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        new = FedAvgState(self.private_mean(plan.rnd, models, counts, state.weights))
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def aggregate_async(self, state: FedAvgState, plan: RoundPlan,
                        arrivals: Sequence[Arrival[ModelMessage]]) -> tuple[FedAvgState, RoundStats]:
        """FedBuff: the global model moves by the arrivals' staleness-weighted updates (each against the
        model it started from)."""
        msgs = [a.message for a in arrivals]
        new = FedAvgState(buffered_step(state.weights, arrivals))
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def eval_payload(self, state: FedAvgState) -> torch.Tensor:
        return state.weights


class FedAvg(GlobalModel[None]):
    name = "fedavg"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: None) -> tuple[None, ModelMessage]:
        res = ctx.local_update(payload)
        return None, ModelMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu())

    def personalized(self, ctx: DeviceContext, dev: None, payload: torch.Tensor) -> torch.Tensor:
        return payload
