"""IFCA: devices evaluate every cluster model on their own data and join the one with the lowest loss.

Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated Learning",
NeurIPS 2020. This is the paper's model-averaging variant (Alg. 2 with local updates).

- Each round every participant downloads all K cluster models (``down_bytes`` counts K models per
  participant), computes the loss of each on its whole local training set (as the authors' code
  does, not on a minibatch), joins the argmin (ties: lowest index), runs the shared local update
  from that model and uploads the result plus its cluster id.
- Server: cluster k = sample-weighted mean of the models that chose k (the brief's choice; the
  paper and its code average uniformly, which is the same thing there since all devices hold n
  samples); a cluster nobody chose keeps its model.
- Distinct inits (IFCA needs them, or every device picks cluster 0 forever): cluster 0 is the
  federation's init and cluster j > 0 permutes the entries of every parameter tensor of that init
  with a seeded generator. PyTorch's default inits draw each tensor's entries i.i.d., so a
  permuted tensor is again a draw from the init distribution, with no need to rebuild the network.
- Personalized model: the cluster model with the lowest loss on the device's training data at
  evaluation time (the authors pick it on the test data, which peeks at the labels being scored).
- The cluster id is uploaded as a plain int and so is not counted in ``bytes_up`` (8 bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.local_update import DeviceData, evaluate
from lcfed.learning.models import Model, ParamSpec
from lcfed.methods.base import (
    Arrival,
    DeviceContext,
    Message,
    RoundPlan,
    RoundStats,
    ServerReads,
    Strategy,
    buffered_step,
)

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_INIT_TAG = 0x1FCA


@dataclass(frozen=True)
class IFCAParams:
    """K, the number of cluster models."""

    num_clusters: int = 5

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        m = cfg.data.training_devices
        # clusters come from random inits, not from the devices, so K is bounded by m, not by a round's participants
        require(1 <= self.num_clusters <= m, f"{prefix}.num_clusters", self.num_clusters, f"must be in [1, devices = {m}]")


@dataclass(frozen=True)
class IFCAState:
    centers: torch.Tensor  # (K, dim)
    assignment: np.ndarray  # (m,), the cluster each device last chose; -1 = never participated


@dataclass(frozen=True)
class IFCAMessage(Message):
    weights: torch.Tensor
    cluster: int


def distinct_inits(init: torch.Tensor, spec: ParamSpec, k: int, rng: np.random.Generator) -> torch.Tensor:
    """``k`` initial models: ``init`` itself, then copies whose every parameter tensor is shuffled."""
    out = [init.clone()]
    for _ in range(1, k):
        w = init.clone()
        for shape, off in zip(spec.shapes, spec.offsets, strict=True):
            n = int(np.prod(shape))
            perm = torch.from_numpy(rng.permutation(n))
            w[off : off + n] = init[off : off + n][perm]
        out.append(w)
    return torch.stack(out)


def cluster_losses(net: Model, centers: torch.Tensor, data: DeviceData) -> torch.Tensor:
    """Mean training loss of every cluster model on one device's training set (K values)."""
    where = data.x_train.device
    out = []
    for w in centers:
        res = evaluate(net, w.to(where), data.x_train, data.y_train)
        out.append(res.loss_sum / max(res.total, 1))
    return torch.tensor(out, dtype=torch.float64)


class IFCA(Strategy[IFCAState, None, IFCAMessage, torch.Tensor]):
    name = "ifca"
    reads = ServerReads(sums=("models",), per_device=("cluster choices",), private=True)
    supports_async = True
    params: IFCAParams

    def init(self) -> IFCAState:
        rng = np.random.default_rng([self.seed, 0, _INIT_TAG])
        return IFCAState(
            centers=distinct_inits(self.fed.init, self.fed.spec, self.params.num_clusters, rng),
            assignment=np.full(self.fed.num_devices, -1, dtype=np.int64),
        )

    def configure(self, state: IFCAState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        # every participant receives all K models: IFCA's communication cost
        return self.plan(rnd, devices, state.centers, downlink=[(state.centers, len(devices))])

    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor, instruction: None) -> tuple[None, IFCAMessage]:
        k = int(torch.argmin(cluster_losses(ctx.net, payload, ctx.data)))
        res = ctx.local_update(payload[k])
        return None, IFCAMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu(), k)

    def aggregate(self, state: IFCAState, plan: RoundPlan, msgs: Sequence[IFCAMessage]) -> tuple[IFCAState, RoundStats]:
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        labels = np.array([m.cluster for m in msgs], dtype=np.int64)
        assignment = state.assignment.copy()
        assignment[[m.device for m in msgs]] = labels
        # a choice only picks the slot of the device's clipped update: the denominators never read it
        new = IFCAState(self.private_means(plan.rnd, models, labels, state.centers, weights=counts), assignment)
        stats = self.clustered_stats(plan, msgs, assignment)
        return new, stats

    def aggregate_async(self, state: IFCAState, plan: RoundPlan,
                        arrivals: Sequence[Arrival[IFCAMessage]]) -> tuple[IFCAState, RoundStats]:
        """FedBuff per cluster: a late update goes to the cluster the device chose when it started (its best
        model then), and moves that cluster's model by its staleness-weighted update against the model it
        started from. The device's assignment is that choice."""
        msgs = [a.message for a in arrivals]
        centers = state.centers.clone()
        for k in sorted({m.cluster for m in msgs}):
            members = [a for a in arrivals if a.message.cluster == k]
            centers[k] = buffered_step(state.centers[k], members, start_of=lambda a, k=k: a.start[k])
        assignment = state.assignment.copy()
        assignment[[m.device for m in msgs]] = [m.cluster for m in msgs]
        return IFCAState(centers, assignment), self.clustered_stats(plan, msgs, assignment)

    def eval_payload(self, state: IFCAState) -> torch.Tensor:
        return state.centers

    def personalized(self, ctx: DeviceContext, dev: None, payload: torch.Tensor) -> torch.Tensor:
        if ctx.data.num_train == 0:
            return payload[0]
        return payload[int(torch.argmin(cluster_losses(ctx.net, payload, ctx.data)))]
