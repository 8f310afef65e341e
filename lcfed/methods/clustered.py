"""What clustered methods share: a server with K cluster models and an assignment
(:class:`ClusteredState`), devices that keep their own model (:class:`~lcfed.methods.base.PersonalModel`,
which stays in the base module because checkpoints name it there), and :class:`ClusteredStrategy`, the
hooks and local update LCFed, FedAC, FeSEM, CGPFL and ClusterFL build on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.local_update import Proximal, pull_towards
from lcfed.methods.base import (
    DeviceContext,
    M,
    ModelMessage,
    P,
    PersonalModel,
    RoundPlan,
    Strategy,
    updates_per_aggregation,
)

if TYPE_CHECKING:  # annotations only, as in lcfed.methods.base
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class EvalPayload:
    """What clustered methods send for evaluation: the cluster models and who belongs where."""

    centers: torch.Tensor
    assignment: np.ndarray

    @cached_property
    def mean_center(self) -> torch.Tensor:
        """The mean of the cluster models, which every unassigned device is evaluated with: computed once
        per payload, not once per device (at 10^5 never-trained devices it was a fifth of the evaluation)."""
        return self.centers.mean(0)


def own_or_cluster_model(device: int, dev: PersonalModel, payload: EvalPayload) -> torch.Tensor:
    """A device's own model once it has trained; before that its cluster's model (or the mean of
    the cluster models while it is unassigned)."""
    if dev.trained:
        return dev.weights
    k = int(payload.assignment[device])
    return payload.centers[k] if k >= 0 else payload.mean_center


def require_clusters_per_round(num_clusters: int, cfg: ExperimentConfig, prefix: str, why: str) -> None:
    """``num_clusters`` in [1, devices per round], for methods whose first clustering is of one round's
    participants; ``why`` ends the message."""
    per_round, called = updates_per_aggregation(cfg)
    require(1 <= num_clusters <= per_round, f"{prefix}.num_clusters", num_clusters,
            f"must be in [1, {called} = {per_round}] ({why})")


class ClusteredState(Protocol):
    """What a clustered method's server state holds: K cluster models and every device's cluster."""

    @property
    def centers(self) -> torch.Tensor: ...  # Ω, (K, dim)

    @property
    def assignment(self) -> np.ndarray: ...  # (m,), -1 = not yet assigned


CS = TypeVar("CS", bound=ClusteredState)


class ClusteredStrategy(Strategy[CS, PersonalModel, M, P]):
    """A method whose devices keep their own model and whose server keeps K cluster models and
    an assignment (state fields ``centers`` and ``assignment``): the hooks and the local update they
    all share. Generic over the server state, the message and the round payload.

    ``configure`` by default sends the cluster models, each assigned participant downloading its own.
    On the device, :meth:`train_own` is the shared body of ``local``: the local update from a start
    model with proximal terms (:meth:`cluster_proximal`), kept as the device's model and uploaded.
    """

    def unassigned(self) -> np.ndarray:
        """The assignment before any clustering: -1 for every device."""
        return np.full(self.fed.num_devices, -1, dtype=np.int64)

    def configure(self, state: CS, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        instructions = self.cluster_instructions(state.assignment, devices)
        return self.plan(rnd, devices, state.centers, instructions, [(state.centers[0], self.assigned(instructions))])

    def init_device(self, device: int, init: torch.Tensor) -> PersonalModel:
        return PersonalModel(init.clone())

    def eval_payload(self, state: CS) -> EvalPayload:
        return EvalPayload(state.centers, state.assignment)

    def personalized(self, ctx: DeviceContext, dev: PersonalModel, payload: EvalPayload) -> torch.Tensor:
        return own_or_cluster_model(ctx.device, dev, payload)

    @staticmethod
    def cluster_proximal(ctx: DeviceContext, centers: torch.Tensor, cluster: int, mu: float) -> list[Proximal]:
        """The pull ``μ/2 ‖ω − Ω_k‖²`` towards the device's cluster model ``centers[cluster]``; none while
        the device has no cluster (``cluster`` = -1) or μ = 0."""
        return pull_towards(centers[cluster].to(ctx.data.x_train.device), mu) if cluster >= 0 else []

    @staticmethod
    def train_own(
        ctx: DeviceContext, start: torch.Tensor, proximal: Sequence[Proximal] = ()
    ) -> tuple[PersonalModel, ModelMessage]:
        """The shared local update from ``start`` with ``proximal`` terms: the device keeps the trained
        model as its own and uploads it."""
        res = ctx.local_update(start, proximal)
        weights = res.weights.cpu()
        return PersonalModel(weights, True), ModelMessage(ctx.device, ctx.data.num_train, res.loss, weights)

    @staticmethod
    def cluster_instructions(assignment: np.ndarray, devices: Sequence[int]) -> dict[int, int]:
        """Each participant's cluster id (-1 while unassigned): what it is told in ``configure``."""
        return {d: int(assignment[d]) for d in devices}

    @staticmethod
    def assigned(instructions: Mapping[int, int]) -> int:
        """How many of a round's participants have a cluster (instruction >= 0)."""
        return sum(1 for k in instructions.values() if k >= 0)
