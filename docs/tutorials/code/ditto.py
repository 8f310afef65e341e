"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021) as an lcfed plugin.

Two models are trained at once:

- a global model ``w``, which is FedAvg's: each round the selected devices train it from the
  server's copy on their round's batches, and the server averages what they send back;
- on every device a personal model ``v``, which never leaves the device: it trains on the device's
  own data with the pull ``lam/2 ||v - w||^2`` towards the global model the device received this round.

``lam = 0`` gives purely local models; a large ``lam`` gives (nearly) the global model. Devices are
evaluated with their personal model.

Run it from this folder: ``lcfed run -c ../../../configs/demo.yaml --set method.name=ditto:Ditto``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lcfed.learning.clustering import weighted_mean
from lcfed.config import ExperimentConfig, require
from lcfed.learning.local_update import Proximal, batch_rng, local_update
from lcfed.methods.base import DeviceContext, ModelMessage, RoundPlan, RoundStats, Strategy


@dataclass(frozen=True)
class DittoParams:
    """Ditto's hyper-parameters, set with ``--set method.<field>=...``. Every field needs a default."""

    lam: float = 0.1  # the pull of the personal model towards the global one
    personal_steps: int = 0  # local steps of the personal model; 0: as many as the global model's

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        """Refuse bad values before any work, naming the field (``method.lam: got -1; must be >= 0``)."""
        require(self.lam >= 0, f"{prefix}.lam", self.lam, "must be >= 0")
        require(self.personal_steps >= 0, f"{prefix}.personal_steps", self.personal_steps,
                "must be >= 0 (0: train.local_steps)")


@dataclass(frozen=True)
class DittoServer:
    """The server's state: the global model (flat weights). Frozen: ``aggregate`` returns a new one."""

    weights: torch.Tensor


@dataclass(frozen=True)
class DittoDevice:
    """What a device keeps between rounds, where it lives: its personal model, and whether it has
    trained it yet (until then it is evaluated with the global model)."""

    weights: torch.Tensor
    trained: bool = False


class Ditto(Strategy[DittoServer, DittoDevice, ModelMessage, torch.Tensor]):
    """Ditto: FedAvg's global model, and a personal model on each device pulled towards it.

    ``init``, ``configure``, ``aggregate`` and ``eval_payload`` run on the server; ``init_device``,
    ``local`` and ``personalized`` run where the device lives (this process, or a Ray actor).
    """

    name = "ditto"
    Params = DittoParams
    params: DittoParams  # what self.params holds (the base class types it loosely)

    # --- server side ---------------------------------------------------------------------------
    def init(self) -> DittoServer:
        """The global model starts at the federation's initial weights (the same for every method)."""
        return DittoServer(self.fed.init.clone())

    def configure(self, state: DittoServer, rnd: int) -> RoundPlan:
        """Broadcast the global model to the round's devices. ``self.participants`` picks them (a seeded
        sample, or the devices the device model kept); the downlink prices one model per receiver."""
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.weights, downlink=[(state.weights, len(devices))])

    def aggregate(self, state: DittoServer, plan: RoundPlan,
                  msgs: Sequence[ModelMessage]) -> tuple[DittoServer, RoundStats]:
        """FedAvg's step: the sample-weighted mean of the devices' global-model updates. ``bytes_up`` is
        priced from the tensors the messages carry (one model each: the personal models stay home)."""
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        new = DittoServer(weighted_mean(models, counts))
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def eval_payload(self, state: DittoServer) -> torch.Tensor:
        """Devices that have not trained yet are evaluated with the global model: send it."""
        return state.weights

    # --- device side ---------------------------------------------------------------------------
    def init_device(self, device: int, init: torch.Tensor) -> DittoDevice:
        """A device's personal model before its first round: the initial weights, not trained."""
        return DittoDevice(init.clone())

    def local(self, ctx: DeviceContext, dev: DittoDevice, payload: torch.Tensor,
              instruction: None) -> tuple[DittoDevice, ModelMessage]:
        """Train both models on this device; upload the global one, keep the personal one.

        The global model trains on the round's batches (``ctx.local_update``, batch stream 0), exactly as
        FedAvg's would. The personal model draws its batches from stream 1 of the same
        (seed, device, round): independent of the global model's, and still the same wherever the
        device runs, so runs stay seeded and resumable.
        """
        w_global = payload.to(ctx.data.x_train.device)
        shared = ctx.local_update(w_global)  # does not modify w_global

        work = ctx.work
        if self.params.personal_steps > 0:
            work = dataclasses.replace(work, steps=self.params.personal_steps, epochs=None)
        pull = [Proximal(w_global, self.params.lam)]  # lam/2 ||v - w_global||^2
        mine = local_update(ctx.net, dev.weights.to(w_global.device), ctx.data, work,
                            batch_rng(ctx.seed, ctx.device, ctx.rnd, stream=1), pull)

        # a new state and a new message: hooks never change their arguments in place
        new_dev = DittoDevice(mine.weights.cpu(), trained=True)
        msg = ModelMessage(ctx.device, ctx.data.num_train, shared.loss, shared.weights.cpu())
        return new_dev, msg

    def personalized(self, ctx: DeviceContext, dev: DittoDevice, payload: torch.Tensor) -> torch.Tensor:
        """The weights this device is evaluated with: its personal model once trained, else the global one."""
        return dev.weights if dev.trained else payload
