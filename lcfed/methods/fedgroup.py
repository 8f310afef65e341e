"""FedGroup: offline clustering by decomposed cosine similarity of pretraining updates.

Duan, Liu, Ji, Liu, Liang, Chen, Tan, "FedGroup: Efficient Federated Learning via Decomposed
Similarity-Based Clustering", ISPA 2021 (reference code: FlexCFL, ``morningD/FlexCFL``,
``flearn/trainer/fedgroup.py``).

- Cold start (round 0): a sample of devices trains from the initial model w0 and uploads its
  model; the server forms the updates ΔW = w_i - w0 (n x dim), takes the top ``svd_rank`` right
  singular vectors V of ΔW (the "decomposed directions"; FlexCFL's TruncatedSVD of ΔWᵀ), and
  describes each device by its cosines with them, EDC_ij = cos(Δw_i, v_j) (n x r). k-means++ on the
  rows of EDC gives K groups; a group's model is the plain mean of its members' pretrained models
  (as in FlexCFL).
- Then each group is trained FedAvg-style: members start from their group model, the server takes
  the sample-weighted mean of the participating members' models. Groups never exchange weights
  (FlexCFL's inter-group aggregation rate is 0 for FedGroup) and memberships never change
  (offline clustering).
- A newcomer (a participant not in the cold-start sample) pretrains from w0 like the sample did and
  uploads its model; the server places it in the group of maximal cos(Δw_new, Ω_g - w0).

Decisions where paper and code leave room:

- Newcomer placement. FlexCFL compares the newcomer's update with the group's "latest update"; at
  cold start that equals the mean pretraining update of the members, ``Ω_g - w0``. Later, the
  latest update is a one-round step of an already trained model and not comparable with a
  pretraining update from w0, so the group's whole displacement ``Ω_g - w0`` is used throughout.
- One exchange per round: a newcomer's round is its pretraining and placement; it trains with its
  group from its next participation on, and its pretrained model is not averaged into the group.
- Cold-start sample: ``pretrain_fraction`` of all devices in round 0, whatever the participation
  (FlexCFL samples min(20 K, m) devices: every device in the paper's settings, hence default 1.0).
- ``svd_rank = 0`` means K directions, FlexCFL's choice. k-means runs on the raw EDC rows.
- Evaluation: each device uses its group model; a device not yet placed uses the mean of the group
  models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import cluster_means, kmeans_labels
from lcfed.learning.similarity import cosine_matrix
from lcfed.methods.base import DeviceContext, ModelMessage, RoundPlan, RoundStats, ServerReads, Strategy
from lcfed.methods.clustered import EvalPayload

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig

_SAMPLE_TAG = 0xF6C0


@dataclass(frozen=True)
class FedGroupParams:
    """K groups, the share of devices pretrained for the cold start, and the SVD rank (0 = K)."""

    num_clusters: int = 5
    pretrain_fraction: float = 1.0
    svd_rank: int = 0

    def sample_size(self, num_devices: int) -> int:
        return max(1, int(np.ceil(self.pretrain_fraction * num_devices - 1e-9)))

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        m = cfg.data.training_devices
        require(0 < self.pretrain_fraction <= 1, f"{prefix}.pretrain_fraction", self.pretrain_fraction, "must be in (0, 1]")
        n = self.sample_size(m)
        require(
            1 <= self.num_clusters <= n,
            f"{prefix}.num_clusters",
            self.num_clusters,
            f"must be in [1, cold-start sample = ceil(pretrain_fraction * m) = {n}]",
        )
        require(
            0 <= self.svd_rank <= n,
            f"{prefix}.svd_rank",
            self.svd_rank,
            f"must be 0 (= num_clusters) or in [1, cold-start sample = {n}]",
        )


@dataclass(frozen=True)
class FedGroupState:
    init: torch.Tensor  # w0, the common starting point of every pretraining
    centers: torch.Tensor  # group models Ω, (K, dim)
    assignment: np.ndarray  # (m,), -1 = not yet placed
    cold_started: bool = False


@dataclass(frozen=True)
class FedGroupPayload:
    init: torch.Tensor
    centers: torch.Tensor


def decomposed_cosine(updates: torch.Tensor, rank: int) -> torch.Tensor:
    """EDC: cosine of every update (row of ``updates``, n x dim) with the top ``rank`` singular directions.

    The directions are the right singular vectors of the (uncentred) update matrix; signs are fixed
    (largest-magnitude loading positive) so identical inputs give identical EDC on any process.
    """
    u = updates.detach().double()
    _, _, vh = torch.linalg.svd(u, full_matrices=False)
    dirs = vh[: min(rank, vh.shape[0])]
    signs = torch.sign(dirs.gather(1, dirs.abs().argmax(1, keepdim=True)))
    signs[signs == 0] = 1
    return cosine_matrix(u, dirs * signs)


def cold_start_groups(updates: torch.Tensor, k: int, rank: int, seed: int) -> np.ndarray:
    """Group labels of the pretrained devices: k-means++ on their decomposed cosine similarities."""
    if updates.shape[0] == k:
        return np.arange(k, dtype=np.int64)  # one device per group; k-means would only reorder them
    return kmeans_labels(decomposed_cosine(updates, rank), k, seed, normalize=False)


def place_newcomers(updates: torch.Tensor, directions: torch.Tensor) -> np.ndarray:
    """Group of each newcomer: the group whose direction (Ω_g - w0) is most cosine-similar to its update."""
    return cosine_matrix(updates.double(), directions.double()).argmax(1).cpu().numpy().astype(np.int64)


class FedGroup(Strategy[FedGroupState, None, ModelMessage, FedGroupPayload]):
    name = "fedgroup"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    reads = ServerReads(sums=("models",), per_device=("update directions",))
    params: FedGroupParams

    def init(self) -> FedGroupState:
        init = self.fed.init.clone()
        return FedGroupState(
            init=init,
            centers=init.repeat(self.params.num_clusters, 1),
            assignment=np.full(self.fed.num_devices, -1, dtype=np.int64),
        )

    def configure(self, state: FedGroupState, rnd: int) -> RoundPlan:
        if not state.cold_started:
            m = self.fed.num_devices
            rng = np.random.default_rng([self.seed, rnd, _SAMPLE_TAG])
            if self.fed.held_out:  # drawn from the training devices only (the same draw without held-out ones)
                pool = np.asarray(self.fed.training_devices())
                chosen = rng.choice(pool, size=self.params.sample_size(len(pool)), replace=False)
            else:
                chosen = rng.choice(m, size=self.params.sample_size(m), replace=False)
            devices = tuple(sorted(int(d) for d in chosen))
        else:
            devices = self.participants(rnd)
        instructions = {d: int(state.assignment[d]) for d in devices}
        # every device downloads one model: its group's, or w0 to pretrain from
        return self.plan(rnd, devices, FedGroupPayload(state.init, state.centers), instructions,
                         [(state.init, len(devices))])

    def local(self, ctx: DeviceContext, dev: None, payload: FedGroupPayload, instruction: int) -> tuple[None, ModelMessage]:
        res = ctx.local_update(payload.centers[instruction] if instruction >= 0 else payload.init)
        return None, ModelMessage(ctx.device, ctx.data.num_train, res.loss, res.weights.cpu())

    def aggregate(self, state: FedGroupState, plan: RoundPlan, msgs: Sequence[ModelMessage]) -> tuple[FedGroupState, RoundStats]:
        p = self.params
        devices = np.array([m.device for m in msgs], dtype=np.int64)
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        assignment = state.assignment.copy()
        if not state.cold_started:
            labels = cold_start_groups(models - state.init, p.num_clusters, p.svd_rank or p.num_clusters, self.seed + plan.rnd)
            assignment[devices] = labels
            centers = cluster_means(models, labels, state.centers)  # plain mean of the members (FlexCFL)
        else:
            member = state.assignment[devices] >= 0
            mem = torch.from_numpy(member)
            centers = cluster_means(models[mem], state.assignment[devices[member]], state.centers, counts[mem])
            if (~member).any():
                # newcomers are placed against the groups as they were when they pretrained
                placed = place_newcomers(models[~mem] - state.init, state.centers - state.init)
                assignment[devices[~member]] = placed
        new = FedGroupState(state.init, centers, assignment, cold_started=True)
        placed_any = assignment >= 0
        stats = RoundStats(
            self.mean_loss(msgs),
            self.upload_bytes(msgs),
            plan.down_bytes,
            assignment=assignment,
            num_clusters=int(len(np.unique(assignment[placed_any]))),
        )
        return new, stats

    def eval_payload(self, state: FedGroupState) -> EvalPayload:
        return EvalPayload(state.centers, state.assignment)

    def personalized(self, ctx: DeviceContext, dev: None, payload: EvalPayload) -> torch.Tensor:
        k = int(payload.assignment[ctx.device])
        return payload.centers[k] if k >= 0 else payload.mean_center
