"""DC-PFL: dynamic clustering by model discrepancy, splits at the end of rapid-decrease periods,
layer-wise aggregation.

Liu, Huang, He, Cao, "Dynamic Clustering for Personalized Federated Learning on Heterogeneous Edge
Devices" (Eq. 3-6, Sec. III-IV, V-A). ``docs/methods.md`` lists the constants and the choices made
where the paper is open; each constant is a field of :class:`DCPFLParams` (in
:mod:`lcfed.methods.dcpfl_steps`, beside the steps that read them) with the paper's value as its default.

What happens, in this engine's rounds (every round every device trains locally):

- Warm-up, rounds ``0 .. t_start-1``: FedAvg with one group. Devices upload their full model; the
  server averages it and accumulates the model discrepancy ``D_ij = |S(w_i) - S(w_j)|_1 / dim``
  (Eq. 3, S = min-max scaling of the whole flat model) and the layer-wise discrepancy (Eq. 5).
  After the last warm-up round it averages both over the ``t_start`` rounds, builds the
  average-linkage dendrogram of D (Sec. III-B) and sets the layers' aggregation intervals.
- Groups: the dendrogram cut at ``gamma~ * gamma_global`` (gamma_global = the root's height, the
  smallest threshold giving one group; merged when the average distance is <= the threshold).
  gamma~ starts at 1 and moves down by ``gamma_step`` (the paper's λ_γ) on each accepted split.
- Layer-wise aggregation (Sec. IV, Eq. 6): a layer of group g is low-discrepancy when
  ``D_{g,l} < low_ratio * D_g`` and is then aggregated every ``alpha*tau`` rounds, else every ``tau``.
  On an aggregation round of a layer the group's members upload that layer (a ``{layer: tensor}``
  mapping) and receive the group's sample-weighted average of it at the start of the next round,
  which overwrites their own copy; between aggregations devices keep training their own weights and
  upload only their loss. The clock counts rounds trained since the last full synchronization.
- Rapid-decrease period (Sec. III-C): l(t) = plain mean of the devices' losses, smoothed by a
  window of ``window`` rounds. The period ends at the knee of the smoothed curve, the point of
  sharpest bend, found in units where both axes run over [0, 1] on the rounds observed since the
  period's highest smoothed loss (:func:`rdp_end`); the server declares it once the curve has
  flattened past the knee (it lies ``min_bend`` below its chord), the knee is ``t_obv`` rounds old
  and the drop stands out from the noise.
- Split trial: the round after the detection every device uploads its full model; the server forms
  the group models under the current structure G0 and the next one G1. The round after, every device
  receives both of its group models, trains each (same batches) and reports both losses. G1 is kept
  iff mean loss(G0) > mean loss(G1) (devices then continue from their G1-trained weights); otherwise
  G0 stays and the trial is repeated ``t_sp`` rounds later.
- Personalized model: the device's own current weights.

Decisions where the paper leaves room (the simplest faithful reading):

- Device loss l_i(t) is the mean minibatch loss of the round's local training (what
  ``local_update`` reports; no extra test pass). The detector and the split test use the plain mean
  over devices (the paper's 1/n sum); ``RoundStats.train_loss`` stays sample-weighted like every
  other method's.
- Smoothed loss = mean of the last ``window`` losses (the paper's sum from t-s to t has s+1 terms
  over s). Eq. 4 taken literally, in rounds and raw loss units, is no knee detector: |l'| << 1
  makes r ~ 1/|l''|, whose minimum sits at the first rounds whatever the curve (decay scales of 5,
  15 and 40 rounds all ended at round 9, and runs split on a fixed cadence). The radius of
  curvature depends on the axes' units; normalized as in :func:`knee`, the knee is where the
  curve turns from steep (slope below -1) to flat. It is located as the point farthest below the
  chord, not by Eq. 4 on second differences, which noise of 0.5 % of the decrease already pulls
  to the first rounds of a slow curve. The loss history restarts when the group structure changes
  (a new RDP is monitored).
- "Split at the end of an RDP": gamma~ goes down in steps of ``gamma_step`` until the cut really
  changes the groups (a level that gives the current groups is no split); if no level above 0 does,
  the structure is final and no more trials run. A rejected trial is retried with the same G1:
  the retry's upload round is ``t_sp`` rounds after the decision round; no re-detection is needed.
- D_g in Eq. 6 is the plain mean of D_{g,l} over layers (the paper: "the average discrepancy of
  all model layers in group g"). Intervals are first set from the warm-up average (one group), then
  recomputed per group whenever the server holds every member's full model (a full
  synchronization, and a trial's upload round for both structures).
- Group averages are sample-weighted (FedAvg's rule); singleton groups communicate nothing but
  their loss (their average is their own model). ``alpha = 1`` is the paper's NoLA ablation.
- The trial's upload round is a full synchronization; the trial round uploads no weights and its
  losses come from two trainings per device (the paper's "downloads both group models, followed by
  a local SGD"). Devices hold both candidates until the next round says which to keep.
- The paper averages losses over all n clients every round, so DC-PFL needs full participation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.learning.clustering import cluster_means, weighted_mean
from lcfed.methods.base import DeviceContext, Federation, Message, RoundPlan, RoundStats, ServerReads, Strategy
from lcfed.methods.dcpfl_steps import (
    DCPFLParams,
    average_linkage,
    discrepancy_matrix,
    due_layers,
    layer_discrepancy,
    layer_intervals,
    next_split,
    rdp_end,
)

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

WARMUP, TRAIN, UPLOAD, TRIAL = "warmup", "train", "upload", "trial"


# --- state and messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """A split under test: both structures' group models and the intervals each would use."""

    old_models: torch.Tensor  # (G0, dim)
    new_models: torch.Tensor  # (G1, dim)
    new_groups: np.ndarray  # (m,)
    new_level: int
    old_intervals: np.ndarray  # (G0, L)
    new_intervals: np.ndarray  # (G1, L)


@dataclass(frozen=True)
class DCPFLState:
    disc_sum: torch.Tensor  # (m, m) float64, sum of D^t over the warm-up rounds
    layer_disc_sum: torch.Tensor  # (L,) float64, sum of the warm-up's layer-wise discrepancy
    tree: np.ndarray | None  # linkage matrix once the warm-up is over
    level: int  # gamma~ = 1 - level * gamma_step
    groups: np.ndarray  # (m,)
    intervals: np.ndarray  # (G, L) aggregation interval of each group's layers
    synced_at: int  # first round trained after the last full synchronization
    pending: dict[int, dict[str, torch.Tensor]]  # group -> averaged layers devices receive next round
    losses: tuple[float, ...]  # l(t) of the current rapid-decrease period
    upload_at: int = -1  # round whose full upload starts a split trial (-1: none scheduled)
    trial: Trial | None = None  # candidates devices train in the current round
    adopt: bool = False  # devices switch to their new-structure candidate (the last trial was accepted)


@dataclass(frozen=True)
class TrialPayload:
    old_models: torch.Tensor
    new_models: torch.Tensor


@dataclass(frozen=True)
class Instruction:
    """A device's group, the layers it uploads, whether to adopt its new-structure candidate, and
    on a trial round its group under the new structure."""

    group: int
    upload: tuple[str, ...] = ()
    adopt: bool = False
    new_group: int = -1


@dataclass(frozen=True)
class DCPFLMessage(Message):
    layers: dict[str, torch.Tensor] = field(default_factory=dict)  # only the layers aggregated this round
    new_loss: float = float("nan")  # on a trial round: the loss of the new structure's model


@dataclass(frozen=True)
class DeviceModel:
    weights: torch.Tensor
    candidate: torch.Tensor | None = None  # trained from the new structure's group model, until decided


#: a round's broadcast: both structures' group models on a trial round, else the averaged layers each
#: group receives (group -> layer name -> tensor; empty when nothing was aggregated)
DCPFLPayload = TrialPayload | Mapping[int, Mapping[str, torch.Tensor]]


class DCPFL(Strategy[DCPFLState, DeviceModel, DCPFLMessage, DCPFLPayload]):
    name = "dcpfl"
    reads = ServerReads(sums=("models",), per_device=("models (pairwise discrepancies)", "losses"))
    params: DCPFLParams

    def __init__(self, cfg: ExperimentConfig, fed: Federation) -> None:
        super().__init__(cfg, fed)
        self.layers = fed.spec.layers()
        self.names = tuple(self.layers)

    # --- server side ---------------------------------------------------------------------------
    def init(self) -> DCPFLState:
        m = self.fed.num_devices
        return DCPFLState(
            disc_sum=torch.zeros(m, m, dtype=torch.float64),
            layer_disc_sum=torch.zeros(len(self.names), dtype=torch.float64),
            tree=None,
            level=0,
            groups=np.zeros(m, dtype=np.int64),
            intervals=np.full((1, len(self.names)), self.params.tau, dtype=np.int64),
            synced_at=self.params.t_start,
            pending={},
            losses=(),
        )

    def kind(self, state: DCPFLState, rnd: int) -> str:
        if rnd < self.params.t_start:
            return WARMUP
        if state.trial is not None:
            return TRIAL
        return UPLOAD if rnd == state.upload_at else TRAIN

    def uploads(self, state: DCPFLState, rnd: int) -> list[tuple[str, ...]]:
        """The layers each group uploads in round ``rnd`` (a singleton group uploads nothing)."""
        kind = self.kind(state, rnd)
        sizes = np.bincount(state.groups, minlength=state.intervals.shape[0])
        if kind == TRIAL:
            return [()] * len(sizes)
        if kind in (WARMUP, UPLOAD):
            return [self.names] * len(sizes)
        due = due_layers(state.intervals, rnd - state.synced_at + 1)
        return [
            tuple(n for n, d in zip(self.names, row, strict=True) if d) if sizes[g] > 1 else ()
            for g, row in enumerate(due)
        ]

    def configure(self, state: DCPFLState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        groups = state.groups
        if state.trial is not None:
            t = state.trial
            instr = {d: Instruction(int(groups[d]), new_group=int(t.new_groups[d])) for d in devices}
            downlink = [(t.old_models[g], int(c)) for g, c in enumerate(np.bincount(groups))]
            downlink += [(t.new_models[g], int(c)) for g, c in enumerate(np.bincount(t.new_groups))]
            return self.plan(rnd, devices, TrialPayload(t.old_models, t.new_models), instr, downlink)
        ups = self.uploads(state, rnd)
        instr = {d: Instruction(int(groups[d]), ups[groups[d]], state.adopt) for d in devices}
        sizes = np.bincount(groups)
        down = [(state.pending[g], int(sizes[g])) for g in sorted(state.pending)]
        return self.plan(rnd, devices, state.pending, instr, down)

    def aggregate(self, state: DCPFLState, plan: RoundPlan, msgs: Sequence[DCPFLMessage]) -> tuple[DCPFLState, RoundStats]:
        kind = self.kind(state, plan.rnd)
        if kind == TRIAL:
            new, train_loss = self._decide(state, plan.rnd, msgs)
        else:
            new = {WARMUP: self._warmup, TRAIN: self._train, UPLOAD: self._upload}[kind](state, plan.rnd, msgs)
            new = self._detect(new, plan.rnd) if kind != UPLOAD else new
            train_loss = self.mean_loss(msgs)
        stats = RoundStats(
            train_loss,
            self.upload_bytes(msgs),
            plan.down_bytes,
            assignment=new.groups,
            num_clusters=int(new.groups.max()) + 1,
        )
        return new, stats

    def _full_models(self, msgs: Sequence[DCPFLMessage]) -> torch.Tensor:
        return torch.stack([torch.cat([m.layers[n] for n in self.names]) for m in msgs])

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: flat[sl].clone() for n, sl in self.layers.items()}

    def _group_intervals(self, models: torch.Tensor, groups: np.ndarray, centers: torch.Tensor) -> np.ndarray:
        disc = np.stack(
            [layer_discrepancy(models[groups == g], centers[g], self.layers).numpy() for g in range(len(centers))]
        )
        p = self.params
        return layer_intervals(disc, p.tau, p.alpha, p.low_ratio)

    def _warmup(self, state: DCPFLState, rnd: int, msgs: Sequence[DCPFLMessage]) -> DCPFLState:
        p = self.params
        models = self._full_models(msgs)
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        center = weighted_mean(models, counts)
        new = replace(
            state,
            disc_sum=state.disc_sum + discrepancy_matrix(models),
            layer_disc_sum=state.layer_disc_sum + layer_discrepancy(models, center, self.layers),
            pending={0: self._split(center)},
            losses=(*state.losses, _plain_mean(m.loss for m in msgs)),
        )
        if rnd == p.t_start - 1:  # the discrepancy is now the average over T_start rounds
            layer_disc = (new.layer_disc_sum / p.t_start).numpy()[None]
            new = replace(
                new,
                tree=average_linkage(new.disc_sum / p.t_start),
                intervals=layer_intervals(layer_disc, p.tau, p.alpha, p.low_ratio),
                synced_at=rnd + 1,
            )
        return new

    def _train(self, state: DCPFLState, rnd: int, msgs: Sequence[DCPFLMessage]) -> DCPFLState:
        pending: dict[int, dict[str, torch.Tensor]] = {}
        for g in range(state.intervals.shape[0]):
            members = [m for m in msgs if state.groups[m.device] == g and m.layers]
            if members:
                counts = torch.tensor([m.num_samples for m in members], dtype=torch.float64)
                pending[g] = {
                    n: weighted_mean(torch.stack([m.layers[n] for m in members]), counts) for n in members[0].layers
                }
        new = replace(state, pending=pending, losses=(*state.losses, _plain_mean(m.loss for m in msgs)), adopt=False)
        if due_layers(state.intervals, rnd - state.synced_at + 1).all():
            # every layer of every group arrived: re-derive each group's intervals (Eq. 5-6), restart the clock
            disc = np.zeros(state.intervals.shape, dtype=np.float64)
            for g, layers in pending.items():
                members = [m for m in msgs if state.groups[m.device] == g]
                center = torch.cat([layers[n] for n in self.names])
                disc[g] = layer_discrepancy(self._full_models(members), center, self.layers).numpy()
            p = self.params
            new = replace(new, intervals=layer_intervals(disc, p.tau, p.alpha, p.low_ratio), synced_at=rnd + 1)
        return new

    def _upload(self, state: DCPFLState, rnd: int, msgs: Sequence[DCPFLMessage]) -> DCPFLState:
        assert state.tree is not None
        split = next_split(state.tree, state.groups, state.level, self.params.gamma_step)
        assert split is not None  # checked when the trial was scheduled; the tree never changes
        level, new_groups = split
        models = self._full_models(msgs)
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        old_models = cluster_means(
            models, state.groups, models.new_zeros(int(state.groups.max()) + 1, models.shape[1]), counts
        )
        new_models = cluster_means(
            models, new_groups, models.new_zeros(int(new_groups.max()) + 1, models.shape[1]), counts
        )
        trial = Trial(
            old_models,
            new_models,
            new_groups,
            level,
            self._group_intervals(models, state.groups, old_models),
            self._group_intervals(models, new_groups, new_models),
        )
        losses = (*state.losses, _plain_mean(m.loss for m in msgs))
        return replace(state, pending={}, losses=losses, upload_at=-1, trial=trial, synced_at=rnd + 1, adopt=False)

    def _decide(self, state: DCPFLState, rnd: int, msgs: Sequence[DCPFLMessage]) -> tuple[DCPFLState, float]:
        assert state.trial is not None
        t = state.trial
        old_loss = _plain_mean(m.loss for m in msgs)
        new_loss = _plain_mean(m.new_loss for m in msgs)
        if old_loss > new_loss:  # the new structure lowers the loss: keep it, monitor a new RDP
            new = replace(
                state,
                groups=t.new_groups,
                level=t.new_level,
                intervals=t.new_intervals,
                losses=(),
                trial=None,
                adopt=True,
            )
            weighted = [replace(m, loss=m.new_loss) for m in msgs]
            return new, self.mean_loss(weighted)
        new = replace(
            state,
            intervals=t.old_intervals,
            losses=(*state.losses, old_loss),
            trial=None,
            adopt=False,
            upload_at=rnd + self.params.t_sp,
        )
        return new, self.mean_loss(msgs)

    def _detect(self, state: DCPFLState, rnd: int) -> DCPFLState:
        """Schedule a split trial for the next round if the rapid-decrease period just ended."""
        p = self.params
        if state.tree is None or state.upload_at >= 0:
            return state
        if rdp_end(state.losses, p) is None:
            return state
        if next_split(state.tree, state.groups, state.level, p.gamma_step) is None:
            return state
        return replace(state, upload_at=rnd + 1)

    def eval_payload(self, state: DCPFLState) -> bool:
        return state.adopt

    # --- device side ---------------------------------------------------------------------------
    def init_device(self, device: int, init: torch.Tensor) -> DeviceModel:
        return DeviceModel(init.clone())

    def local(
        self, ctx: DeviceContext, dev: DeviceModel, payload: DCPFLPayload, instruction: Instruction
    ) -> tuple[DeviceModel, DCPFLMessage]:
        if isinstance(payload, TrialPayload):
            # both candidates see the same batches, so their losses differ only by the start model
            old = ctx.local_update(payload.old_models[instruction.group])
            new = ctx.local_update(payload.new_models[instruction.new_group])
            msg = DCPFLMessage(ctx.device, ctx.data.num_train, old.loss, new_loss=new.loss)
            return DeviceModel(old.weights.cpu(), new.weights.cpu()), msg
        w = dev.candidate if instruction.adopt and dev.candidate is not None else dev.weights
        received = payload.get(instruction.group, {})
        if received:
            w = w.clone()
            for name, value in received.items():
                w[self.layers[name]] = value.to(w)
        res = ctx.local_update(w)
        weights = res.weights.cpu()
        up = {name: weights[self.layers[name]].clone() for name in instruction.upload}
        return DeviceModel(weights), DCPFLMessage(ctx.device, ctx.data.num_train, res.loss, up)

    def personalized(self, ctx: DeviceContext, dev: DeviceModel, payload: bool) -> torch.Tensor:
        # right after an accepted trial the device's model is its new-structure candidate
        return dev.candidate if payload and dev.candidate is not None else dev.weights


def _plain_mean(values: Iterable[float]) -> float:
    """The paper's 1/n sum over devices (not sample-weighted)."""
    return float(np.mean(list(values)))
