"""CFL (Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", IEEE TNNLS 2021) as an lcfed plugin.

The federation starts as one cluster, trained as FedAvg trains its model. When a cluster's training
has converged as a whole (the norm of its devices' mean update is small, below ``eps1``) while some
of its devices still pull hard (the largest update norm is above ``eps2``), its devices want different
models: the cluster is split in two by the cosine similarity of their updates, and each half goes on
with a model of its own. The cluster count grows during the run, as far as the data asks.

Choices of this version (the paper leaves them open or makes them otherwise):

- the mean update is sample-weighted (as the cluster's aggregation is); the paper's code uses the
  plain mean;
- the bipartition is complete-linkage agglomerative clustering into two on the cosine distance
  ``1 - cos`` of the updates, as the authors' code does; the half holding the cluster's first device
  keeps the cluster's index, the other half is appended;
- a cluster is split only from round ``warmup`` on (``plan.rnd`` counts from 0), and only when at
  least two of its devices took part this round; members that did not take part stay in the half
  that keeps the index;
- split first, then aggregate: each half's model is the old cluster model plus its own half's mean
  update, so the halves part at once;
- every device belongs to a cluster from the start (cluster 0) and is evaluated with its cluster's model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering

from lcfed.learning.clustering import weighted_mean
from lcfed.config import ExperimentConfig, require
from lcfed.methods.base import DeviceContext, Message, RoundPlan, RoundStats, Strategy


@dataclass(frozen=True)
class CFLParams:
    """CFL's thresholds on the update norms, and the first round that may split."""

    eps1: float = 0.3  # split only when the norm of a cluster's mean update is below this ...
    eps2: float = 0.9  # ... and its largest device update norm is above this
    warmup: int = 3  # no split before this round (rounds count from 0)

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        """Refuse bad values before any work, naming the field."""
        require(self.eps1 >= 0, f"{prefix}.eps1", self.eps1, "must be >= 0")
        require(self.eps2 >= 0, f"{prefix}.eps2", self.eps2, "must be >= 0")
        require(self.warmup >= 0, f"{prefix}.warmup", self.warmup, "must be >= 0 (the first round that may split)")


@dataclass(frozen=True)
class CFLState:
    """The server's state: one model per cluster and every device's cluster. The field names
    ``centers`` and ``assignment`` are those every clustered method of lcfed uses."""

    centers: torch.Tensor  # (K, dim): K grows when a cluster splits
    assignment: np.ndarray  # (m,): each device's cluster, 0 for every device at the start


@dataclass(frozen=True)
class CFLMessage(Message):
    """What a device uploads: its update (trained model minus the cluster model it started from).
    ``bytes_up`` is priced from this tensor."""

    update: torch.Tensor


def bipartition(updates: torch.Tensor) -> np.ndarray:
    """Labels 0/1 of the devices whose ``updates`` are the rows: complete-linkage clustering into two on
    the cosine distance. Row 0 is always in half 0, so the result does not depend on sklearn's numbering."""
    u = updates.double()
    unit = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    distance = (1.0 - unit @ unit.T).clamp_min(0.0).numpy()
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(distance).labels_
    return (labels != labels[0]).astype(np.int64)


class CFL(Strategy[CFLState, None, CFLMessage, torch.Tensor]):
    """Clustered Federated Learning: one cluster at first, split in two whenever its devices' updates
    disagree at a stationary point of the cluster's joint objective."""

    name = "cfl"
    Params = CFLParams
    params: CFLParams

    # --- server side ---------------------------------------------------------------------------
    def init(self) -> CFLState:
        """One cluster, holding every device, at the federation's initial weights."""
        return CFLState(self.fed.init.clone()[None], np.zeros(self.fed.num_devices, dtype=np.int64))

    def configure(self, state: CFLState, rnd: int) -> RoundPlan:
        """Broadcast every cluster model; each device is told its cluster (a per-device instruction).
        The downlink is what devices really receive, one cluster model each, not all K."""
        devices = self.participants(rnd)
        instructions = {d: int(state.assignment[d]) for d in devices}
        return self.plan(rnd, devices, state.centers, instructions, downlink=[(state.centers[0], len(devices))])

    def aggregate(self, state: CFLState, plan: RoundPlan,
                  msgs: Sequence[CFLMessage]) -> tuple[CFLState, RoundStats]:
        """Split the clusters whose updates call for it, then move each cluster model by its devices'
        mean update. New arrays for the new state: ``state`` itself is left as it came."""
        p = self.params
        devices = np.array([m.device for m in msgs])
        updates = torch.stack([m.update for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        assignment = state.assignment.copy()
        rows = list(state.centers.unbind(0))  # cluster models, new ones appended on a split

        for k in range(state.centers.shape[0]):
            member = np.flatnonzero(state.assignment[devices] == k)
            if plan.rnd < p.warmup or len(member) < 2:
                continue
            mean_norm = float(weighted_mean(updates[member], counts[member]).norm())
            max_norm = float(updates[member].norm(dim=1).max())
            if mean_norm < p.eps1 and max_norm > p.eps2:
                half = bipartition(updates[member])
                assignment[devices[member[half == 1]]] = len(rows)  # the second half: a new cluster ...
                rows.append(state.centers[k])  # ... starting from the model they shared

        centers = torch.stack(rows)  # a new tensor: the old state's centers are untouched
        labels = assignment[devices]
        for k in np.unique(labels):
            member = np.flatnonzero(labels == k)
            centers[k] += weighted_mean(updates[member], counts[member]).to(centers.dtype)

        new = CFLState(centers, assignment)
        # loss, bytes, the assignment and num_clusters (logged each round, and ari where groups are known)
        return new, self.clustered_stats(plan, msgs, assignment)

    def eval_payload(self, state: CFLState) -> CFLState:
        """Evaluation needs each device's cluster model: the cluster models and the assignment."""
        return state

    # --- device side ---------------------------------------------------------------------------
    def local(self, ctx: DeviceContext, dev: None, payload: torch.Tensor,
              instruction: int) -> tuple[None, CFLMessage]:
        """Train from the cluster model on the round's batches, and send back the update. Devices keep
        nothing between rounds (device state ``None``)."""
        start = payload[instruction]
        res = ctx.local_update(start)
        update = res.weights.cpu() - start.cpu()
        return None, CFLMessage(ctx.device, ctx.data.num_train, res.loss, update)

    def personalized(self, ctx: DeviceContext, dev: None, payload: CFLState) -> torch.Tensor:
        """A device is evaluated with its cluster's model."""
        return payload.centers[int(payload.assignment[ctx.device])]
