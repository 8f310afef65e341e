"""What a run gives back: its metrics and history (:class:`RunResult`), its final models, and what a
held-out device finds when it joins after the last round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lcfed.learning.local_update import EvalResult
from lcfed.learning.models import ParamSpec


@dataclass
class RunResult:
    """A finished run: the last evaluation, every round's metrics and the final assignment."""

    final: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    assignment: np.ndarray | None = None
    wall_seconds: float = 0.0
    round_seconds: float = 0.0
    tracking: dict[str, str] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    placement: dict[str, Any] = field(default_factory=dict)  # where an engine ran it (Ray: nodes, GPUs)
    provenance: dict[str, str] = field(default_factory=dict)  # what produced the numbers (lcfed.numerics)
    # the last evaluation per device and which devices had trained by then (the devices acc_mean counts)
    evaluation: dict[int, EvalResult] = field(default_factory=dict)
    trained: np.ndarray | None = None
    models: FinalModels | None = None  # only when an observer asks (``wants_models``)


@dataclass
class FinalModels:
    """The models at the end of a run: the server's state and each device's personalized weights
    (those it is evaluated with; empty when the pool cannot give them)."""

    server_state: Any
    personal: dict[int, Any]


#: server-state fields that hold final models, and their names (``models/<name>`` in MLflow)
SERVER_MODELS = {"weights": "global", "centers": "clusters", "embedding": "embedding"}


@dataclass(frozen=True)
class Newcomer:
    """What a held-out device finds when it joins after the last round: the server's full-size
    models to choose from (``models``, (n, dim)), else the embedding it holds (or None), which the
    device completes from the initial model and trains for one round's local work."""

    models: torch.Tensor | None
    embedding: torch.Tensor | None = None


def newcomer(state: Any, spec: ParamSpec) -> Newcomer:
    """The :data:`SERVER_MODELS` of ``state`` a newcomer may adopt (as :func:`final_models` hands them
    to the tracking): its global model and cluster models, else its embedding."""
    full, embedding = [], None
    for name in SERVER_MODELS:
        value = getattr(state, name, None)
        if not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 1 and value.numel() == spec.size:
            full.append(value[None])
        elif value.dim() == 2 and value.shape[1] == spec.size:
            full.append(value)
        elif value.dim() == 1 and value.numel() == spec.embedding_size:
            embedding = value.detach().float().cpu()
    if full:
        return Newcomer(torch.cat([w.detach().float().cpu() for w in full]))
    return Newcomer(None, embedding)


def newcomer_metrics(results: dict[int, EvalResult]) -> dict[str, float]:
    """``acc_new_mean`` / ``acc_new_weighted``: the held-out devices' test accuracy once joined."""
    rows = [r for r in results.values() if r.total > 0]
    if not rows:
        return {"acc_new_mean": float("nan"), "acc_new_weighted": float("nan")}
    return {"acc_new_mean": float(np.mean([r.correct / r.total for r in rows])),
            "acc_new_weighted": sum(r.correct for r in rows) / sum(r.total for r in rows)}
