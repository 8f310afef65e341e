"""The one local-update routine every method uses: minibatch SGD with optional proximal terms.

A step is ``w <- w - lr * (grad L_sup(w; B) + sum_j weight_j * (w[part_j] - target_j))``: LCFed's
μ- and λ-terms (Alg. 1, line 4), FedProx-style and CGPFL-style terms are all :class:`Proximal`\\ s.
Batches come from a per-(seed, device, round) generator so a device trains identically wherever it
is hosted (in-process or on any actor).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap

from lcfed.learning.models import Model


@dataclass(frozen=True)
class DeviceData:
    """One device's local samples (float images, int64 labels), on the device that trains them;
    ``x_val``/``y_val`` only with a validation split (``data.val_fraction``)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])


@dataclass(frozen=True)
class SampleDP:
    """Sample-level DP-SGD (Abadi et al. 2016): each sample's gradient clipped to ``clip``, N(0, (noise·clip)²) added
    to their sum, divided by the batch size."""

    clip: float
    noise: float


@dataclass(frozen=True)
class LocalWork:
    """How much local training a round does: ``steps`` minibatches, or ``epochs`` full passes; each a DP-SGD step
    with ``sample_dp``."""

    lr: float
    batch_size: int
    steps: int | None = None
    epochs: int | None = None
    sample_dp: SampleDP | None = None

    def steps_for(self, n: int) -> int:
        """The steps a round takes on ``n`` samples."""
        if self.epochs is not None:
            return self.epochs * -(-n // min(self.batch_size, n))
        assert self.steps is not None
        return self.steps


@dataclass(frozen=True)
class Proximal:
    """The term ``weight/2 * ||w[part] - target||^2`` added to the local objective (``part=None``: all of w)."""

    target: torch.Tensor
    weight: float
    part: slice | None = None


def pull_towards(target: torch.Tensor, weight: float) -> list[Proximal]:
    """The proximal terms of a pull ``weight/2 * ||w - target||^2``: none at weight 0, so an unregularized step
    keeps the plain step's float operations (and its numbers)."""
    return [Proximal(target, weight)] if weight > 0 else []


@dataclass(frozen=True)
class LocalResult:
    """Weights after local training, the mean supervised loss over its steps, and the step count."""

    weights: torch.Tensor
    loss: float
    steps: int


def batch_rng(seed: int, device: int, rnd: int, stream: int = 0) -> np.random.Generator:
    """The generator for one device's batches in one round; independent of where it runs."""
    return np.random.default_rng([seed, device, rnd, stream])


def minibatches(n: int, work: LocalWork, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Index batches: ``steps`` batches drawn from successive shuffles, or ``epochs`` full shuffles."""
    bs = min(work.batch_size, n)
    if work.epochs is not None:
        for _ in range(work.epochs):
            perm = rng.permutation(n)
            for start in range(0, n, bs):
                yield perm[start : start + bs]
        return
    assert work.steps is not None
    perm = rng.permutation(n)
    pos = 0
    for _ in range(work.steps):
        if pos + bs > n:
            perm = rng.permutation(n)
            pos = 0
        yield perm[pos : pos + bs]
        pos += bs


def loss_and_grad(net: Model, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Mean cross-entropy of ``net`` at ``w`` on ``(x, y)`` and its gradient with respect to ``w``.

    A ``net`` with its own ``loss_and_grad`` (:class:`lcfed.learning.vectorized.BatchedNet`) computes it
    together with other devices'."""
    batched = getattr(net, "loss_and_grad", None)
    if batched is not None:
        return batched(w, x, y)
    w = w.detach().requires_grad_(True)
    loss = F.cross_entropy(net(w, x), y)
    (grad,) = torch.autograd.grad(loss, w)
    return float(loss.detach()), grad


def private_loss_and_grad(net: Model, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dp: SampleDP,
                          noise: torch.Generator) -> tuple[float, torch.Tensor]:
    """The mean loss at ``w`` on ``(x, y)`` and the DP-SGD gradient: per-sample gradients (``torch.func``: vmap
    over the samples) each clipped to ``dp.clip``, summed, plus N(0, (dp.noise·dp.clip)²) drawn from ``noise``,
    over the batch size."""

    def one(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(w, x[None]), y[None])

    grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0))(w.detach(), x, y)
    scale = (dp.clip / grads.norm(dim=1, keepdim=True).clamp_min(1e-30)).clamp(max=1.0)
    drawn = torch.randn(w.shape, generator=noise, dtype=torch.float64) * (dp.noise * dp.clip)
    return float(losses.mean()), ((grads * scale).sum(0) + drawn.to(w.device, w.dtype)) / x.shape[0]


def local_update(
    net: Model,
    w0: torch.Tensor,
    data: DeviceData,
    work: LocalWork,
    rng: np.random.Generator,
    proximal: Sequence[Proximal] = (),
) -> LocalResult:
    """Run the local SGD of one device from ``w0``; ``w0`` is not modified. With ``work.sample_dp`` each step is a
    DP-SGD step whose noise comes from a generator seeded by ``rng``'s first draw (so a function of the same
    (seed, device, round, stream) as the batches)."""
    w = w0.detach().clone()
    losses = []
    dp = work.sample_dp
    noise = torch.Generator().manual_seed(int(rng.integers(2**62))) if dp is not None else None
    for idx in minibatches(data.num_train, work, rng):
        index = torch.from_numpy(idx).to(data.x_train.device)
        if dp is not None and noise is not None:
            loss, grad = private_loss_and_grad(net, w, data.x_train[index], data.y_train[index], dp, noise)
        else:
            loss, grad = loss_and_grad(net, w, data.x_train[index], data.y_train[index])
        for term in proximal:
            part = slice(None) if term.part is None else term.part
            grad[part] += term.weight * (w[part] - term.target)
        w -= work.lr * grad
        losses.append(loss)
    return LocalResult(w, float(np.mean(losses)) if losses else float("nan"), len(losses))


@dataclass(frozen=True)
class EvalResult:
    """Correct predictions, sample count and summed loss of one model on one device's test set;
    ``val``: the same on its validation set, when it has one."""

    correct: int
    total: int
    loss_sum: float
    val: EvalResult | None = None


@torch.no_grad()
def evaluate(net: Model, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> EvalResult:
    """Accuracy counts and summed cross-entropy of ``net`` at ``w`` on ``(x, y)``."""
    correct, loss_sum = 0, 0.0
    for start in range(0, int(y.shape[0]), batch_size):
        logits = net(w, x[start : start + batch_size])
        target = y[start : start + batch_size]
        correct += int((logits.argmax(1) == target).sum())
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
    return EvalResult(correct, int(y.shape[0]), loss_sum)
