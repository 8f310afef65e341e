"""Clustering steps shared by the clustered methods: assignment (E-step) and cluster means (M-step)."""

from __future__ import annotations

import numpy as np
import torch

from lcfed.learning.similarity import cosine_matrix


def assign_by_cosine(points: torch.Tensor, centers: torch.Tensor) -> np.ndarray:
    """Index of the most cosine-similar center for each point (LCFed's LrCos argmax)."""
    return cosine_matrix(points, centers).argmax(1).cpu().numpy().astype(np.int64)


def kmeans_labels(points: torch.Tensor, k: int, seed: int, normalize: bool = True) -> np.ndarray:
    """k-means labels of the points; rows are L2-normalized first so clusters follow cosine geometry."""
    from sklearn.cluster import KMeans  # lazy: scikit-learn costs ~2.5 s to import per worker
    from threadpoolctl import threadpool_limits

    x = points.detach().double().cpu()
    if normalize:
        x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    km = KMeans(n_clusters=k, n_init=10, random_state=seed)
    # one OpenMP thread: scikit-learn adds its threads' partial sums in the order they finish
    with threadpool_limits(limits=1, user_api="openmp"):
        return km.fit_predict(x.numpy()).astype(np.int64)


def cluster_means(
    models: torch.Tensor, labels: np.ndarray, previous: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean model of each cluster (Eq. 5); clusters without members keep their previous model.

    ``weights`` turns the plain mean into a weighted one (e.g. by sample counts).
    """
    k = previous.shape[0]
    lab = torch.as_tensor(labels, device=models.device, dtype=torch.long)
    w = torch.ones(models.shape[0], dtype=models.dtype, device=models.device) if weights is None else weights.to(models)
    # index_add_ instead of a dense (K x n) one-hot matmul: ~4x faster at n = 1,000, K = 100
    sums = torch.zeros(k, models.shape[1], dtype=models.dtype, device=models.device).index_add_(0, lab, models * w[:, None])
    mass = torch.zeros(k, dtype=models.dtype, device=models.device).index_add_(0, lab, w)
    out = previous.clone()
    filled = mass > 0
    out[filled] = sums[filled] / mass[filled, None]
    return out


def weighted_mean(models: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean of the rows of ``models``."""
    w = weights.to(models)
    return (w[:, None] * models).sum(0) / w.sum()
