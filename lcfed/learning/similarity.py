"""Model similarity: LCFed's low-rank projector (PCA over sampled models) and cosine / L2 measures."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Projector:
    """``P(w) = M (w - mean)``: M holds the top-D principal directions (D x dim) of sampled models."""

    components: torch.Tensor
    mean: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.components.shape[0])

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        """Project one model (dim,) or a stack (n, dim) to D numbers each, in ``w``'s dtype.

        The sums run in float64 over blocks of columns: a float32 dot product over FedAC's 4.8M
        parameters is off by ~3e-3 of the code (cosines by as much), float64 by ~1e-9.
        """
        x = w[None] if w.ndim == 1 else w
        out = torch.zeros(x.shape[0], self.rank, dtype=torch.float64, device=x.device)
        for sl in _column_blocks(x.shape[1]):
            out += (x[:, sl].double() - self.mean[sl].double()) @ self.components[:, sl].double().T
        out = out.to(w.dtype)
        return out[0] if w.ndim == 1 else out


#: columns per block of the float64 sums here: their float64 copies are n x this, not n x dim
_BLOCK = 1 << 16


def _column_blocks(dim: int) -> list[slice]:
    return [slice(s, min(s + _BLOCK, dim)) for s in range(0, dim, _BLOCK)]


def rank_cutoff(n: int) -> float:
    """Smallest kept singular value of :func:`fit_projector`, relative to the largest: ``10 sqrt(n eps)``.

    The squared singular values come from the eigenvalues of an n x n float64 Gram matrix; eigh's
    backward error is O(n eps ||G||) and forming G adds a few eps ||G|| (measured: 6-22 eps at
    20 x 4.8M), so an eigenvalue below ``100 n eps λ_max`` cannot be told from zero. The cutoff
    depends on the number of models and float64's eps only, not on dim(ω): 6.7e-7 at n = 20.
    """
    return 10.0 * (max(n, 1) * torch.finfo(torch.float64).eps) ** 0.5


def centred_gram(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (dim,) and Gram matrix C Cᵀ (n x n) of the centred rows C = rows − mean, both float64.

    Summed block by block over the columns, so at most an n x block float64 copy exists at a time.
    """
    n, dim = rows.shape
    mean = torch.empty(dim, dtype=torch.float64, device=rows.device)
    gram = torch.zeros(n, n, dtype=torch.float64, device=rows.device)
    for sl in _column_blocks(dim):
        block = rows[:, sl].to(torch.float64, copy=True)
        mean[sl] = block.mean(0)
        block -= mean[sl]
        gram += block @ block.T
    return mean, gram


def sq_dist_matrix(rows: torch.Tensor) -> torch.Tensor:
    """Squared L2 distance between every pair of rows (n x n, float64), via the centred Gram matrix
    (centring first keeps the cancellation of ‖a‖² + ‖b‖² − 2a·b to the spread of the rows)."""
    _, gram = centred_gram(rows)
    diag = gram.diagonal()
    out = (diag[:, None] + diag[None, :] - 2 * gram).clamp_min(0)
    out.fill_diagonal_(0)
    return out


def fit_projector(models: torch.Tensor, rank: int) -> Projector:
    """Centred PCA of the stacked flat models (n x dim), keeping ``rank`` directions.

    Computed through the n x n Gram matrix of the centred models, in float64 block by block over
    the columns (one float64 copy of an n x block slice at a time, never of the whole matrix): the
    mean, G = C Cᵀ, eigh(G) = V diag(s²) Vᵀ, then M = diag(1/s) Vᵀ C, again by blocks. For 100
    LeNet-5 models this is ~9x faster than LAPACK's thin SVD of n x dim
    (benchmarks/clustering_cost.py). Signs are fixed (largest-magnitude loading positive) so the
    same models give the same M on any process. Directions whose singular value is at most
    :func:`rank_cutoff` (n) times the largest, beyond the data's rank, come out as zero rows rather
    than noise; the cutoff does not grow with dim (``s_max max(n, dim) eps(float32)`` would be
    0.57 s_max at the 4.8M parameters of FedAC's CNN).
    """
    if models.ndim != 2:
        raise ValueError(f"models must be (n, dim), got shape {tuple(models.shape)}")
    n, dim = models.shape
    mean, gram = centred_gram(models)
    blocks = _column_blocks(dim)
    evals, evecs = torch.linalg.eigh(gram)
    order = torch.argsort(evals, descending=True)
    s = evals[order].clamp_min(0).sqrt()
    keep = min(rank, n)
    s_kept = s[:keep]
    live = s_kept > s[:1].sum() * rank_cutoff(n)  # s[:1].sum(): s_max, or 0 for no models
    # rows of Vᵀ / s for the live directions; zero rows for the rest (noise of a rank-deficient sample)
    coef = evecs[:, order[:keep]].T / s_kept.clamp_min(torch.finfo(torch.float64).tiny)[:, None]
    coef[~live] = 0
    comps = torch.empty(keep, dim, dtype=models.dtype, device=models.device)
    for sl in blocks:
        comps[:, sl] = (coef @ (models[:, sl].double() - mean[sl])).to(models.dtype)
    signs = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    signs[signs == 0] = 1
    comps.mul_(signs)
    if keep < rank:
        comps = torch.cat([comps, comps.new_zeros(rank - keep, dim)])
    return Projector(comps.contiguous(), mean.to(models.dtype))


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of ``a`` (n x d) with every row of ``b`` (k x d); zero rows give 0."""
    an = a / a.norm(dim=1, keepdim=True).clamp_min(1e-12)
    bn = b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return an @ bn.T


def sq_l2_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distance of every row of ``a`` with every row of ``b``."""
    return torch.cdist(a.double(), b.double()).pow(2).to(a.dtype)
