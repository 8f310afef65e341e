"""The PCA projector at FedAC's CNN size: every informative direction is kept and the codes' cosines
match a float64 oracle (issue 14, item 3)."""

from __future__ import annotations

import numpy as np
import torch

from lcfed.learning.similarity import cosine_matrix, fit_projector, rank_cutoff

CNN_SIZE = 4_778_954  # FedAC's CNN on 3x32x32 input (tests/test_fedac.py::test_cnn_parameter_count_and_split)


def test_rank_cutoff_depends_on_the_number_of_models_only():
    eps = float(np.finfo(np.float64).eps)
    assert rank_cutoff(20) == 10 * np.sqrt(20 * eps) < 1e-6
    assert rank_cutoff(100) < 2e-6


def test_cnn_sized_pca_keeps_all_ten_directions_and_matches_a_float64_oracle():
    n, rank, dim = 20, 10, CNN_SIZE
    rng = np.random.default_rng(14)
    # W = mean + A B: B (rank x dim) orthonormal rows with disjoint supports (a tenth of the columns
    # each, so every column is used), A (n x rank) with column scales 1 ... 0.1. The old cutoff,
    # s_max * max(n, dim) * eps(float32) = 0.57 s_max, dropped every direction below it.
    a = rng.standard_normal((n, rank)) * np.logspace(0, -1, rank)
    bounds = np.linspace(0, dim, rank + 1).astype(int)
    gen = torch.Generator().manual_seed(14)
    models = torch.randn(dim, generator=gen).mul_(0.01).repeat(n, 1)
    for j in range(rank):
        lo, hi = bounds[j], bounds[j + 1]
        b = torch.randn(hi - lo, generator=gen, dtype=torch.float64)
        models[:, lo:hi] += (torch.from_numpy(a[:, j : j + 1]) * (b / b.norm())).float()

    # oracle, float64: the centred PCA of W is (SVD of the centred A) times B, so the code of W's row
    # i is row i of U S (up to the sign of each direction); fresh models A' B + mean give (A' - Ā) V
    ac = a - a.mean(0)
    u, s, vt = np.linalg.svd(ac, full_matrices=False)
    assert s[-1] / s[0] < 0.57  # directions the old cutoff would have dropped
    oracle = u * s

    proj = fit_projector(models, rank)
    comps = proj.components
    assert comps.shape == (rank, dim) and comps.dtype == torch.float32
    assert (comps.norm(dim=1) > 0.99).all()  # all D = 10 directions kept
    gram = comps.double() @ comps.double().T
    assert torch.allclose(gram, torch.eye(rank, dtype=torch.float64), atol=1e-5)
    codes = proj(models).double()
    want = cosine_matrix(torch.from_numpy(oracle), torch.from_numpy(oracle))
    assert (cosine_matrix(codes, codes) - want).abs().max() < 1e-4
    # codes of the cluster-center-like means of a few members, against the oracle's
    groups = [[0, 1, 2], [3, 4], [5, 6, 7, 8], list(range(9, 20))]
    means = torch.stack([models[g].mean(0) for g in groups])
    oracle_means = np.stack([oracle[g].mean(0) for g in groups])
    got = cosine_matrix(proj(means).double(), codes)
    assert (got - cosine_matrix(torch.from_numpy(oracle_means), torch.from_numpy(oracle))).abs().max() < 1e-4


def test_rank_deficient_sample_gives_zero_rows_beyond_its_rank():
    # 6 models, 3 of them repeated: the centred sample has rank 2, so directions 3 and 4 are zero rows
    rng = np.random.default_rng(3)
    base = torch.from_numpy(rng.standard_normal((3, 200_000))).float()
    models = torch.cat([base, base])
    proj = fit_projector(models, 4)
    norms = proj.components.norm(dim=1)
    assert torch.allclose(norms[:2], torch.ones(2), atol=1e-5) and torch.equal(norms[2:], torch.zeros(2))
