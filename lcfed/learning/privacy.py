"""Client-level differential privacy, the math: clipping a device's update, the seeded Gaussian noise of an
aggregate, the private (clipped and noised) mean of each cluster, a device's locally noised code and the
data-independent projection it is taken with (DP-FedAvg, McMahan et al. 2018; docs/privacy.md).

Pure functions of tensors and seeds: the noise of an aggregate is a function of (seed, round, cluster,
stream), so the in-process engine, Ray and a resumed run draw the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from lcfed.learning.similarity import Projector

__all__ = ["COUNT_STREAM", "clip_rows", "count_within", "gaussian", "local_code", "next_clip", "noised_fraction",
           "private_means", "random_projector"]

# keeps these streams apart from every other seeded draw of a run
_NOISE, _CODE, _PROJECT = 0xD1FF, 0xC0DE, 0x9A0
#: the stream of the noise on adaptive clipping's count, apart from every sum's (streams 0, 1, ...)
COUNT_STREAM = 0xC0C1


def clip_rows(updates: torch.Tensor, clip: float, layers: Sequence[slice] = ()) -> torch.Tensor:
    """Each row scaled to L2 norm at most ``clip`` (rows within it unchanged); with ``layers``, each layer's slice
    of a row to ``clip / sqrt(len(layers))``, so the whole row is within ``clip`` too."""
    out = updates.clone()
    parts = list(layers) or [slice(0, updates.shape[1])]
    bound = clip / math.sqrt(len(parts))
    for sl in parts:
        norms = out[:, sl].norm(dim=1, keepdim=True)
        out[:, sl] *= (bound / norms.clamp_min(1e-30)).clamp(max=1.0)
    return out


def gaussian(shape: tuple[int, ...], std: float, seed: int, rnd: int, cluster: int, stream: int = 0) -> torch.Tensor:
    """N(0, std²) noise of one aggregate, float64, a pure function of (seed, round, cluster, stream)."""
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, rnd, cluster, stream, _NOISE]).generate_state(1)[0]))
    return torch.randn(shape, generator=gen, dtype=torch.float64) * std


def private_means(
    models: torch.Tensor,
    labels: np.ndarray,
    previous: torch.Tensor,
    clip: float,
    sum_std: float,
    denominators: torch.Tensor,
    seed: int,
    rnd: int,
    stream: int = 0,
    layers: Sequence[slice] = (),
) -> torch.Tensor:
    """Each cluster's new model: ``previous[k] + (Σ clipped (w_i − previous[k]) + N(0, sum_std²)) / denominators[k]``
    over the rows ``w_i`` labelled ``k``. Every cluster is noised, members or not (an empty one's noise says
    nothing about who is in it), each with its own (seed, round, cluster, stream) draw."""
    k = previous.shape[0]
    lab = torch.as_tensor(labels, dtype=torch.long)
    ref = previous.to(torch.float64)
    updates = clip_rows(models.to(torch.float64) - ref[lab], clip, layers)
    sums = torch.zeros(k, models.shape[1], dtype=torch.float64).index_add_(0, lab, updates)
    noise = torch.stack([gaussian((models.shape[1],), sum_std, seed, rnd, c, stream) for c in range(k)])
    return (ref + (sums + noise) / denominators.to(torch.float64)[:, None]).to(previous.dtype)


def local_code(code: torch.Tensor, multiplier: float, seed: int, rnd: int, device: int) -> torch.Tensor:
    """A device's code made locally private: scaled to unit norm (sensitivity 2 between any two codes), plus
    N(0, (2·multiplier)²) per coordinate, drawn from (seed, round, device)."""
    unit = code.to(torch.float64) / code.to(torch.float64).norm().clamp_min(1e-30)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, rnd, device, _CODE]).generate_state(1)[0]))
    noisy = unit + torch.randn(unit.shape, generator=gen, dtype=torch.float64) * (2.0 * multiplier)
    return noisy.to(code.dtype)


def random_projector(center: torch.Tensor, rank: int, seed: int) -> Projector:
    """A projection that reads no device: ``rank`` orthonormal random directions (Johnson–Lindenstrauss),
    centred at ``center`` (the seeded initial model, public), drawn from the run's seed."""
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, _PROJECT]).generate_state(1)[0]))
    g = torch.randn(center.numel(), rank, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(g)
    return Projector(q.T.contiguous().to(center.dtype), center.clone())


def count_within(models: torch.Tensor, labels: np.ndarray, previous: torch.Tensor, clip: float) -> int:
    """How many rows' updates ``w_i − previous[label_i]`` have L2 norm at most ``clip`` (adaptive clipping's count,
    taken before clipping)."""
    lab = torch.as_tensor(labels, dtype=torch.long)
    norms = (models.to(torch.float64) - previous.to(torch.float64)[lab]).norm(dim=1)
    return int((norms <= clip).sum())


def noised_fraction(within: int, count_std: float, cohort: float, seed: int, rnd: int) -> float:
    """b̄ = (within + N(0, count_std²)) / cohort: the private fraction of updates within the clip, its noise drawn
    from (seed, round, cluster 0, :data:`COUNT_STREAM`)."""
    return float((within + gaussian((1,), count_std, seed, rnd, 0, COUNT_STREAM)[0]) / cohort)


def next_clip(clip: float, fraction: float, quantile: float, lr: float) -> float:
    """The geometric update of Andrew et al. 2021: ``clip · exp(−lr (fraction − quantile))``; the clip shrinks while
    more than the ``quantile`` of updates are within it, and grows while fewer are."""
    return clip * math.exp(-lr * (fraction - quantile))
