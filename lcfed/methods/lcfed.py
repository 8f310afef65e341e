"""LCFed: low-rank clustered FL with a global embedding and cluster models.

Zhang et al., "LCFed: An Efficient Clustered Federated Learning Framework for Heterogeneous Data",
ICASSP 2025 (arXiv:2501.01850). What the paper leaves open and what is chosen here (Φ a mean, not
the paper's sum; argmax LrCos; local work): ``docs/methods.md``.

- Device i in cluster k minimizes ``L_sup + μ/2 ||ω_i − Ω_k||² + λ/2 ||φ_i − Φ||²`` starting from its
  own ω_i (Alg. 1); it uploads ω_i and its low-rank code ``M ω_i`` (D numbers).
- Server: Φ = sample-weighted mean of the participants' φ_i; Ω_k = plain mean of the ω_i assigned
  to k (Eq. 5); assignment = argmax_k cos(M ω_i, M Ω_k) against the previous round's Ω_k.
- M: centred PCA of S_d sampled models, fitted after the first round (the models then already
  reflect local data) and refitted every ``refit_every`` rounds; the first assignment is k-means
  on the (normalized) codes.
- ``coverage`` c > 0 (not in the paper; for availability that follows the groups, where the first round sees
  only some of them): the first clustering waits until ⌈c · training devices⌉ devices (and at least K) have
  uploaded. Until then each round's devices train from the initial model, pulled to Φ only (no cluster yet), as
  every device does in LCFed's round 0, so that models uploaded in different rounds are comparable; the server
  keeps every seen device's latest model; then M is fitted on (S_d of) those models and k-means clusters all of
  them, each Ω_k the mean of its members' kept models. K is then bounded by the training devices, not by a round's. Devices first seen
  later are assigned by LrCos when they arrive, as always.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lcfed.errors import require
from lcfed.learning.clustering import assign_by_cosine, cluster_means, kmeans_labels, weighted_mean
from lcfed.learning.local_update import Proximal
from lcfed.learning.privacy import local_code, random_projector
from lcfed.learning.similarity import Projector, fit_projector
from lcfed.methods.base import (
    Arrival,
    DeviceContext,
    Message,
    PersonalModel,
    RoundPlan,
    RoundStats,
    ServerReads,
    updates_per_aggregation,
)
from lcfed.methods.clustered import ClusteredStrategy, require_clusters_per_round

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig


@dataclass(frozen=True)
class LCFedParams:
    """μ (cluster proximal weight), λ (global-embedding weight), K clusters, D low-rank dimension,
    S_d models sampled for the PCA (0 = all participants of the fitting round), refit period (0 = never)."""

    mu: float = 0.1
    lam: float = 0.1
    num_clusters: int = 5
    rank: int = 10
    sample_size: int = 0
    refit_every: int = 0
    coverage: float = 0.0

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        per_round, called = updates_per_aggregation(cfg)
        require(self.mu >= 0, f"{prefix}.mu", self.mu, "must be >= 0")
        require(self.lam >= 0, f"{prefix}.lam", self.lam, "must be >= 0")
        if self.coverage > 0:  # the first clustering waits for at least K devices, whatever a round holds
            m = cfg.data.training_devices
            require(1 <= self.num_clusters <= m, f"{prefix}.num_clusters", self.num_clusters,
                    f"must be in [1, training devices = {m}]")
        else:
            require_clusters_per_round(self.num_clusters, cfg, prefix, "K <= m, and the first clustering needs K participants")
        require(
            self.sample_size == 0 or 2 <= self.sample_size <= per_round,
            f"{prefix}.sample_size",
            self.sample_size,
            f"must be 0 (all participants) or in [2, {called} = {per_round}]",
        )
        s_d = self.sample_size or per_round
        require(1 <= self.rank <= s_d, f"{prefix}.rank", self.rank, f"must be in [1, S_d = {s_d}] (D <= sampled models)")
        require(self.refit_every >= 0, f"{prefix}.refit_every", self.refit_every, "must be >= 0 (0 = fit once)")
        require(0 <= self.coverage <= 1, f"{prefix}.coverage", self.coverage,
                "must be in [0, 1] (0: cluster after the first round; c: once c of the training devices were seen)")
        # the wait keeps each seen device's model on the server and fits M on them: per-device reads DP cannot noise
        require(self.coverage == 0 or cfg.privacy.mode == "off", f"{prefix}.coverage", self.coverage,
                "must be 0 under privacy.mode central (the wait keeps every seen device's model on the server)")


@dataclass(frozen=True)
class LCFedState:
    embedding: torch.Tensor  # Φ, the embedding part only
    centers: torch.Tensor  # Ω, (K, dim)
    assignment: np.ndarray  # (m,), -1 = not yet assigned
    projector: Projector | None
    fitted_at: int  # round whose aggregation last fitted M, -1 before
    # M Ω_k under the current M, kept as the mean of the members' codes (M is affine, so the mean of
    # the codes is the code of the mean): assignment then costs m K D, not K D dim (None: recompute)
    center_codes: torch.Tensor | None
    # with coverage > 0, until the first clustering: every device's latest model (zeros where unseen) and which
    # devices were seen; None otherwise
    latest: torch.Tensor | None = field(default=None, kw_only=True)
    seen: np.ndarray | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class LCFedPayload:
    embedding: torch.Tensor
    centers: torch.Tensor
    projector: Projector | None


@dataclass(frozen=True)
class LCFedMessage(Message):
    weights: torch.Tensor
    code: torch.Tensor | None  # M ω_i, once M exists

    def known_code(self) -> torch.Tensor:
        """The code, which every device sends once M was broadcast."""
        if self.code is None:
            raise ValueError(f"device {self.device} sent no code although the server holds M")
        return self.code


class LCFed(ClusteredStrategy[LCFedState, LCFedMessage, LCFedPayload]):
    name = "lcfed"
    samples_in_sgd_only = True  # its devices read their samples only in ctx.local_update
    params: LCFedParams
    supports_async = True
    # under privacy.mode: central the codes are noised on the device and M reads no device (docs/privacy.md)
    reads = ServerReads(sums=("models", "embeddings"), per_device=("codes",), private=True)

    def init(self) -> LCFedState:
        init = self.fed.init
        k = self.params.num_clusters
        return LCFedState(
            embedding=init[: self.fed.spec.embedding_size].clone(),
            centers=init.repeat(k, 1),
            assignment=self.unassigned(),
            # private: a seeded random M from round 0, never the PCA of devices' models
            projector=random_projector(init, self.params.rank, self.seed) if self.dp is not None else None,
            fitted_at=-1,
            center_codes=None,
        )

    def configure(self, state: LCFedState, rnd: int) -> RoundPlan:
        devices = self.participants(rnd)
        instructions = self.cluster_instructions(state.assignment, devices)
        downlink: list[tuple[Any, int]] = [(state.embedding, len(devices)), (state.centers[0], self.assigned(instructions))]
        if state.projector is not None and state.fitted_at == rnd - 1:
            downlink.append((state.projector, len(devices)))  # a new M goes to every participant
        payload = LCFedPayload(state.embedding, state.centers, state.projector)
        return self.plan(rnd, devices, payload, instructions, downlink)

    def local(
        self, ctx: DeviceContext, dev: PersonalModel, payload: LCFedPayload, instruction: int
    ) -> tuple[PersonalModel, LCFedMessage]:
        prox = self.cluster_proximal(ctx, payload.centers, instruction, self.params.mu)
        if self.params.lam > 0:
            emb = self.fed.spec.embedding_size
            prox.append(Proximal(payload.embedding.to(ctx.data.x_train.device), self.params.lam, slice(0, emb)))
        # waiting for coverage: every seen device's model is one round's training from the same start, so that the
        # first clustering compares like with like whenever each device was seen
        waiting = self.params.coverage > 0 and payload.projector is None
        own, sent = self.train_own(ctx, self.fed.init if waiting else dev.weights, prox)
        code = payload.projector(sent.weights) if payload.projector is not None else None
        if code is not None and self.dp is not None:
            code = local_code(code, self.cfg.privacy.code_noise, ctx.seed, ctx.rnd, ctx.device)
        return own, LCFedMessage(sent.device, sent.num_samples, sent.loss, sent.weights, code)

    def aggregate(self, state: LCFedState, plan: RoundPlan, msgs: Sequence[LCFedMessage]) -> tuple[LCFedState, RoundStats]:
        p = self.params
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        if p.coverage > 0 and (state.assignment < 0).all():
            return self.first_clustering(state, plan, msgs, models, counts)
        projector, fitted_at = state.projector, state.fitted_at
        refit = p.refit_every and plan.rnd - fitted_at >= p.refit_every and self.dp is None
        if projector is None or refit:
            rng = np.random.default_rng([self.seed, plan.rnd, 0x9CA])
            size = min(p.sample_size or len(msgs), len(msgs))
            sample = np.sort(rng.choice(len(msgs), size=size, replace=False))
            projector, fitted_at = fit_projector(models[torch.from_numpy(sample)], p.rank), plan.rnd
            codes = projector(models)
            center_codes = projector(state.centers)
        else:
            codes = torch.stack([m.known_code() for m in msgs])
            center_codes = state.center_codes if state.center_codes is not None else projector(state.centers)
        if (state.assignment < 0).all():
            labels = kmeans_labels(codes, p.num_clusters, self.seed + plan.rnd)
        else:
            labels = assign_by_cosine(codes, center_codes)
        assignment = state.assignment.copy()
        assignment[list(plan.devices)] = labels
        emb = self.fed.spec.embedding_size
        new = LCFedState(
            embedding=self.private_mean(plan.rnd, models[:, :emb], counts, state.embedding, stream=1),
            centers=self.private_means(plan.rnd, models, labels, state.centers, public_labels=True),
            assignment=assignment,
            projector=projector,
            fitted_at=fitted_at,
            center_codes=cluster_means(codes.to(center_codes.dtype), labels, center_codes),
        )
        stats = self.clustered_stats(plan, msgs, assignment)
        return new, stats

    def first_clustering(self, state: LCFedState, plan: RoundPlan, msgs: Sequence[LCFedMessage], models: torch.Tensor,
                         counts: torch.Tensor) -> tuple[LCFedState, RoundStats]:
        """With ``coverage`` > 0, before any device has a cluster: Φ moves and every seen device's latest model is
        kept until ⌈coverage · training devices⌉ (and at least K) were seen; then M is fitted on (S_d of) those models, k-means
        clusters all of them, and each Ω_k is the mean of its members' latest models."""
        p = self.params
        latest = state.latest.clone() if state.latest is not None else models.new_zeros(self.fed.num_devices, models.shape[1])
        seen = state.seen.copy() if state.seen is not None else np.zeros(self.fed.num_devices, dtype=bool)
        ids = [m.device for m in msgs]
        latest[ids] = models
        seen[ids] = True
        emb = self.fed.spec.embedding_size
        embedding = weighted_mean(models[:, :emb], counts)
        if int(seen.sum()) < max(math.ceil(p.coverage * len(self.fed.training_devices())), p.num_clusters):
            new = replace(state, embedding=embedding, latest=latest, seen=seen)
            return new, self.clustered_stats(plan, msgs, state.assignment)
        members = np.flatnonzero(seen)
        pool = latest[torch.from_numpy(members)]
        rng = np.random.default_rng([self.seed, plan.rnd, 0x9CA])
        sample = np.sort(rng.choice(len(members), size=min(p.sample_size or len(members), len(members)), replace=False))
        projector = fit_projector(pool[torch.from_numpy(sample)], p.rank)
        codes = projector(pool)
        labels = kmeans_labels(codes, p.num_clusters, self.seed + plan.rnd)
        assignment = state.assignment.copy()
        assignment[members] = labels
        center_codes = projector(state.centers)
        new = LCFedState(embedding, cluster_means(pool, labels, state.centers), assignment, projector, plan.rnd,
                         cluster_means(codes.to(center_codes.dtype), labels, center_codes))
        return new, self.clustered_stats(plan, msgs, assignment)

    def aggregate_async(self, state: LCFedState, plan: RoundPlan,
                        arrivals: Sequence[Arrival[LCFedMessage]]) -> tuple[LCFedState, RoundStats]:
        """The round's aggregation over the arrived updates (a late update is assigned by its code against the
        current centres, as in a round), then each model moves only part of the way: cluster ``k``'s by the mean
        staleness weight of its arrivals, the shared embedding by the arrivals' sample-weighted mean weight.
        With every update fresh (weight 1) this is the round's aggregation of those devices. M is affine, so the
        centres' codes move alike; a stale update is recoded with the current M."""
        order = sorted(arrivals, key=lambda a: a.message.device)
        # a stale update's code is of the M it started under (or none): the server recodes it with the current M
        msgs = [replace(a.message, code=state.projector(a.message.weights))
                if a.staleness and state.projector is not None else a.message for a in order]
        synced, stats = self.aggregate(state, replace(plan, devices=tuple(m.device for m in msgs)), msgs)
        weights = torch.tensor([a.weight for a in order], dtype=torch.float64)
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        labels = torch.from_numpy(synced.assignment[[m.device for m in msgs]])
        k = state.centers.shape[0]
        per_cluster = torch.ones(k, dtype=torch.float64)
        for c in range(k):
            if (labels == c).any():
                per_cluster[c] = weights[labels == c].mean()
        refit = synced.fitted_at != state.fitted_at
        old_codes = synced.projector(state.centers) if refit and synced.projector is not None else state.center_codes

        def move(old: torch.Tensor, new: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
            return (old.to(torch.float64) + by * (new.to(torch.float64) - old.to(torch.float64))).to(new.dtype)

        col = per_cluster[:, None]
        new = replace(
            synced,
            embedding=move(state.embedding, synced.embedding, (counts / counts.sum() * weights).sum()),
            centers=move(state.centers, synced.centers, col),
            center_codes=(move(old_codes, synced.center_codes, col)
                          if old_codes is not None and synced.center_codes is not None else synced.center_codes),
        )
        return new, stats
