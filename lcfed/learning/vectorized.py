"""Many virtual devices' SGD steps in one kernel launch: ``torch.func.vmap`` over their weights.

On a GPU a LeNet-5 step on a batch of 32 is launch-bound: looping over 100 devices costs 1.7 s a
round on an H200, vmapped steps 0.23 s (benchmarks/README.md, gpu.py). Strategies stay written for one device: each
device of a round runs its ``Strategy.local`` in a thread of its own, and every gradient it asks
for (:func:`lcfed.learning.local_update.loss_and_grad`) goes to a :class:`StepBatcher`. The batcher waits until
every device still training has asked, then computes all the gradients in one vmapped call and
hands them back. A tick holds the k-th request of each device, in device order, so the batches
(and hence the numbers) do not depend on thread timing. Anything else a strategy computes (its
proximal terms, an evaluation) runs in its own thread as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap

from lcfed.learning.models import Network


class StepBatcher:
    """Gathers the gradient requests of a fixed set of members and serves them batched."""

    def __init__(self, net: Network, members: Iterable[int]) -> None:
        self.active = set(members)
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.results: dict[int, tuple[float, torch.Tensor]] = {}
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.ticks = 0
        self.calls = 0

        def loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(net(w, x), y)  # ``net`` runs only inside a tick, under the lock

        self._batched = vmap(grad_and_value(loss))

    def loss_and_grad(self, member: int, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
        """``member``'s loss and gradient at ``w`` on ``(x, y)``, computed with the other members'."""
        with self.cond:
            if self.error is not None:
                raise RuntimeError("a batched gradient step failed") from self.error
            if member not in self.active or member in self.pending:
                raise RuntimeError(f"device {member} asked for a gradient out of turn")
            self.pending[member] = (w.detach(), x, y)
            self._run_if_complete()
            while member not in self.results and self.error is None:
                self.cond.wait()
            if member not in self.results:
                assert self.error is not None
                raise RuntimeError("a batched gradient step failed") from self.error
            return self.results.pop(member)

    def leave(self, member: int) -> None:
        """``member`` has finished (or failed): the others no longer wait for it."""
        with self.cond:
            self.active.discard(member)
            self._run_if_complete()

    def _run_if_complete(self) -> None:
        if not self.pending or len(self.pending) < len(self.active):
            return
        batch = sorted(self.pending.items())
        self.pending = {}
        # one call per input shape (devices with fewer samples than the batch size draw smaller batches)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, (_, (w, x, y)) in enumerate(batch):
            groups.setdefault((tuple(w.shape), tuple(x.shape), tuple(y.shape)), []).append(i)
        try:
            for idx in groups.values():
                members = [batch[i] for i in idx]
                grads, losses = self._batched(
                    torch.stack([r[0] for _, r in members]),
                    torch.stack([r[1] for _, r in members]),
                    torch.stack([r[2] for _, r in members]),
                )
                for (member, _), g, loss in zip(members, grads.unbind(0), losses.tolist(), strict=True):
                    self.results[member] = (float(loss), g)
                self.calls += 1
            self.ticks += 1
        except BaseException as exc:  # every waiting member raises it
            self.error = exc
        self.cond.notify_all()


class BatchedNet:
    """What a device's strategy sees as ``ctx.net`` while it trains under a :class:`StepBatcher`:
    gradients go to the batcher, any other call to ``local()``, the calling thread's model skeleton."""

    def __init__(self, local: Callable[[], Network], batcher: StepBatcher, member: int) -> None:
        self.local = local
        self.batcher = batcher
        self.member = member

    def __call__(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.local()(flat, x)

    def loss_and_grad(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
        return self.batcher.loss_and_grad(self.member, w, x, y)
