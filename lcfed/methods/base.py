"""The Strategy interface every method implements: the hooks, and the registry's entry for a method.

A round is ``configure -> local (per device, where its data lives) -> aggregate``; evaluation asks
each device for its personalized model. The round loop exists once (:mod:`lcfed.run.loop`) and only
calls these hooks, in-process or on Ray.

The types that flow through a round (:class:`Federation`, :class:`RoundPlan`, :class:`RoundStats`, the
messages, ...) are defined in :mod:`lcfed.methods.round` and re-exported here, with
:func:`devices_per_round` (the config's) and the traffic pricing of :mod:`lcfed.methods.traffic`: this module
is the face a method imports from. What clustered methods share is in :mod:`lcfed.methods.clustered`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
import torch

from lcfed.config import ExperimentConfig, devices_per_round
from lcfed.learning.clustering import cluster_means, weighted_mean
from lcfed.methods.privacy import CentralDP
from lcfed.methods.round import (
    Arrival,
    DeviceContext,
    Federation,
    M,
    Message,
    ModelMessage,
    PersonalModel,
    RoundPlan,
    RoundStats,
    ServerReads,
    buffered_step,
    select_devices,
)
from lcfed.methods.traffic import tensor_bytes

#: the Strategy contract: what this module defines, and the round's types, device selection, the devices per
#: round and the traffic pricing it re-exports for methods
__all__ = [
    "D", "M", "P", "S", "Arrival", "DeviceContext", "Federation", "Message", "MethodSpec", "ModelMessage", "PersonalModel",
    "RoundPlan", "RoundStats", "ServerReads", "Strategy", "buffered_step", "devices_per_round", "updates_per_aggregation", "select_devices", "tensor_bytes",
]


#: a method's server state (a frozen dataclass), what :meth:`Strategy.init` and ``aggregate`` return
S = TypeVar("S")
#: a device's persistent state, held where the device lives (None for devices that keep nothing)
D = TypeVar("D")
#: the round's broadcast (:attr:`RoundPlan.payload`), what ``local`` receives
P = TypeVar("P")


class Strategy(Generic[S, D, M, P]):
    """Base class of every method. Subclasses override the hooks; the round loop never changes.

    A round ``rnd`` (0, 1, ..., ``train.rounds - 1``; the CLI and the summary print ``rnd + 1``) is
    ``configure -> local`` on each of the round's devices ``-> aggregate``; on evaluation rounds
    (``train.eval_every``, and always the last) the server's :meth:`eval_payload` goes to every device,
    which is scored with :meth:`personalized`. Server hooks (:meth:`init`, :meth:`configure`,
    :meth:`aggregate`, :meth:`aggregate_async`, :meth:`eval_payload`) run in the server's process (the
    driver in-process, the server actor on Ray); device hooks (:meth:`init_device`, :meth:`local`,
    :meth:`personalized`) where the device's data lives, on several threads at once and, on Ray, in other
    processes. Each process builds its own instance from the same ``cfg`` and ``fed``, so a hook must
    not keep anything on ``self``: what persists is the server state ``S`` (returned by the server
    hooks) and each device's state ``D`` (returned by :meth:`local`).

    Generic over the method's server state ``S``, device state ``D``, message ``M`` and round payload
    ``P``: a built-in declares them (``class FedAvg(Strategy[FedAvgState, None, ModelMessage, Tensor])``)
    so that each hook's override is checked against the others. A subclass that names none (``class
    Mine(Strategy)``) gets ``Any`` for each. Per-device instructions and the evaluation payload are
    typed by each method's own hooks.

    State objects are frozen dataclasses of tensors, arrays and scalars; hooks return new ones and never
    mutate their arguments (checkpoints, retries and the Ray engine rely on it; ``lcfed check`` tests it
    as ``pure``). Checkpoints store them without pickle and rebuild dataclasses only of lcfed's modules and
    of the strategy's own module (and its submodules).

    A subclass declares its hyper-parameters as a frozen dataclass ``Params`` (every field with a type and
    a default), read here as ``self.params``; its optional method ``validate(self, cfg, prefix)`` checks
    them before any work, raising :class:`lcfed.config.ConfigError` through :func:`lcfed.config.require`
    (``prefix`` is ``"method"``: name the field as ``f"{prefix}.lam"``). ``compare_space`` (a class
    attribute) may give the path of a YAML search space that ``lcfed compare`` tunes the method over.

    Args:
        cfg: the run's validated config (``cfg.method.params`` is this method's ``Params``).
        fed: what the server may know about the federation (:class:`Federation`).
    """

    #: registry name, e.g. ``"lcfed"``
    name: ClassVar[str] = ""

    #: the round's devices when the device model decides them (``devices.simulate``): set by the server around
    #: :meth:`configure`, returned by :meth:`participants`
    scheduled: tuple[int, ...] | None = None

    #: whether the method aggregates asynchronously (``devices.aggregation: async``, FedBuff): it implements
    #: :meth:`aggregate_async`
    supports_async: ClassVar[bool] = False

    #: the model (a ``model.name``) a config that names none runs this method with, ``lcfed check`` included;
    #: None: the config's default (``lenet5``)
    model: ClassVar[str | None] = None

    #: the only models (``model.name``\ s) the method can run with, e.g. those with the head it personalizes;
    #: a config naming another is refused before any work. Empty: any model
    models: ClassVar[tuple[str, ...]] = ()

    #: what the server reads of each device (:class:`ServerReads`): by default whole models, one by one, which
    #: ``privacy.mode: central`` refuses; a method that aggregates through :meth:`private_mean` /
    #: :meth:`private_means` and privatizes what else it reads declares it
    reads: ClassVar[ServerReads] = ServerReads()

    #: whether a device reads its training samples only through ``ctx.local_update`` (the shared local SGD, which
    #: ``privacy.sample_noise`` makes DP-SGD), so that sample-level DP covers all it sends; others are refused with it
    samples_in_sgd_only: ClassVar[bool] = False

    def __init__(self, cfg: ExperimentConfig, fed: Federation) -> None:
        self.cfg = cfg
        self.fed = fed
        self.params = cfg.method.params
        self.seed = cfg.seed
        #: the private aggregation under ``privacy.mode: central`` (None when off), built from cfg once
        self.dp = CentralDP.of(cfg, fed, self.reads)

    # --- server side -------------------------------------------------------------------------
    def init(self) -> S:
        """The server state before round 0, made once per run (and again when a lost server restarts
        without a checkpoint).

        Returns:
            The initial server state, typically built from ``self.fed.init`` (the seeded initial weights,
                one flat float32 vector laid out by ``self.fed.spec``).
        """
        raise NotImplementedError

    def configure(self, state: S, rnd: int) -> RoundPlan:
        """The round's plan: which devices train, what is broadcast to them and what each is told.

        Called once per round on the server, before any device trains.

        Args:
            state: the server state after round ``rnd - 1`` (:meth:`init`'s before round 0). Read only.
            rnd: the round, counted from 0.

        Returns:
            A :class:`RoundPlan`, built with :meth:`plan`: ``devices`` from :meth:`participants` (never a
                selection of the method's own, so that the device model of ``devices.simulate`` can decide who
                is online), the ``payload`` every device receives as :meth:`local`'s ``payload`` (one object,
                shipped once), ``instructions`` mapping a device to its own small value (a cluster id; a device
                without one gets ``None``), and ``downlink``: what the devices really download, as
                ``(object, number of receivers)`` pairs, which prices ``bytes_down``.
        """
        raise NotImplementedError

    def aggregate(self, state: S, plan: RoundPlan, msgs: Sequence[M]) -> tuple[S, RoundStats]:
        """The new server state from the round's messages.

        Called once per round on the server, after every device of ``plan.devices`` has trained (with the
        device model, those that finished in time). The loop stops the run before this hook if a message's
        loss is not finite.

        Args:
            state: the state :meth:`configure` saw. Read only.
            plan: the round's plan, as :meth:`configure` returned it (its ``downlink`` emptied).
            msgs: one message per trained device, sorted by device id. Read only.

        Returns:
            The new server state and the round's :class:`RoundStats`: the sample-weighted training loss
                (:meth:`mean_loss`), ``bytes_up`` (:meth:`upload_bytes`, the tensors the messages carry),
                ``bytes_down`` (``plan.down_bytes``) and, for a clustered method, every device's cluster
                (``assignment``, -1 for none) and the cluster count (:meth:`clustered_stats` fills all of it).
        """
        raise NotImplementedError

    def aggregate_async(self, state: S, plan: RoundPlan, arrivals: Sequence[Arrival[M]]) -> tuple[S, RoundStats]:
        """The new server state from a buffer of updates that arrived (sorted by arrival), each trained from the
        payload ``arrival.start`` of a server version ``arrival.staleness`` aggregations ago; only where
        :attr:`supports_async`. ``plan`` is the round whose devices started training (its downlink is the
        round's)."""
        raise NotImplementedError(f"method {self.name!r} does not aggregate asynchronously")

    def eval_payload(self, state: S) -> Any:
        """What devices need to build their personalized model for evaluation.

        Called on the server on evaluation rounds, after :meth:`aggregate`, and at the end of the run for
        the final models; the result goes to every device's :meth:`personalized`. The default is None.

        Args:
            state: the server state after the round. Read only.
        """
        return None

    # --- device side -------------------------------------------------------------------------
    def init_device(self, device: int, init: torch.Tensor) -> D:
        """A device's persistent state before its first round, held where the device lives.

        Called where the device lives whenever a device that has not trained yet is read (its first
        :meth:`local`, or :meth:`personalized` before it ever trained); the result is not stored until
        :meth:`local` returns a new one, so it must depend on its arguments only. The default is None, for
        methods whose devices keep nothing between rounds (``D`` = None).

        Args:
            device: the device's id, 0 .. ``fed.num_devices - 1``.
            init: the seeded initial flat weights, the same on every process. Read only: clone it to keep it.
        """
        return cast(D, None)

    def local(self, ctx: DeviceContext, dev: D, payload: P, instruction: Any) -> tuple[D, M]:
        """One device's local work for the round: its new state and the message it sends.

        Called where the device lives, for each device of the round's plan, concurrently with other
        devices (threads and, on Ray, processes): it must not write to ``self``.

        Args:
            ctx: the device's id, data, model, local budget and the round (``ctx.rnd``, from 0).
                ``ctx.local_update(start, proximal)`` is the shared local SGD on the round's batches
                (stream 0 of :func:`lcfed.learning.local_update.batch_rng`); a second, independent batch sequence in
                the same round comes from ``batch_rng(ctx.seed, ctx.device, ctx.rnd, stream=1)``.
            dev: the device's state from its previous :meth:`local` (:meth:`init_device`'s before its first).
                Read only.
            payload: the plan's ``payload``, shared by every device of the round. Read only.
            instruction: the plan's ``instructions[ctx.device]``, or None.

        Returns:
            The device's new state (the same object when nothing changed) and its :class:`Message`:
                ``num_samples`` (``ctx.data.num_train``, the aggregation weight), ``loss`` (the mean training
                loss) and the tensors it uploads, which ``bytes_up`` prices. Tensors go back on the CPU.
        """
        raise NotImplementedError

    def personalized(self, ctx: DeviceContext, dev: D, payload: Any) -> torch.Tensor:
        """The flat weights this device is evaluated with, and its final model.

        Called where the device lives, for every device on evaluation rounds (also those that have not
        trained yet: the accuracy metrics count only those that have) and for the final models. It must
        not change the device's state.

        Args:
            ctx: as in :meth:`local`, with ``ctx.rnd`` = -1 (evaluation is not a round's training).
            dev: the device's state (:meth:`init_device`'s if it never trained). Read only.
            payload: :meth:`eval_payload`'s result. Read only.

        Returns:
            One flat float32 vector laid out by ``self.fed.spec``.
        """
        raise NotImplementedError

    # --- helpers shared by methods -----------------------------------------------------------
    @staticmethod
    def plan(
        rnd: int,
        devices: tuple[int, ...],
        payload: Any,
        instructions: Mapping[int, Any] | None = None,
        downlink: Sequence[tuple[Any, int]] = (),
    ) -> RoundPlan:
        """A round plan whose ``down_bytes`` is the size of ``downlink`` ((object, receivers) pairs)."""
        down = tuple((obj, int(n)) for obj, n in downlink if n)
        return RoundPlan(rnd, devices, payload, dict(instructions or {}), sum(tensor_bytes(o) * n for o, n in down), down)

    def participants(self, rnd: int) -> tuple[int, ...]:
        """The round's devices: those the device model kept (``devices.simulate``), else a seeded sample of
        ``train.participation`` of the training devices. Methods select through this, never on their own."""
        if self.scheduled is not None:
            return self.scheduled
        return select_devices(self.fed.num_devices, self.cfg.train.participation, self.seed, rnd, self.fed.held_out)

    def private_mean(self, rnd: int, models: torch.Tensor, weights: torch.Tensor, previous: torch.Tensor,
                     stream: int = 0) -> torch.Tensor:
        """The server's mean of one sum over devices: ``weighted_mean(models, weights)``, or under ``privacy.mode:
        central`` ``previous + (Σ clipped updates + noise) / expected cohort`` (unweighted: a device's weight
        would be its sensitivity); ``stream`` tells apart two sums of one round."""
        if self.dp is None:
            return weighted_mean(models, weights)
        return self.dp.mean(rnd, models, previous, stream)

    def private_means(self, rnd: int, models: torch.Tensor, labels: np.ndarray, previous: torch.Tensor,
                      weights: torch.Tensor | None = None, public_labels: bool = False, stream: int = 0) -> torch.Tensor:
        """Each cluster's mean: ``cluster_means``, or under ``privacy.mode: central`` each cluster's clipped and
        noised sum of updates against ``previous[k]``; ``public_labels``: the labels are a function of what is
        already private (locally noised codes), so the clusters' counts may divide."""
        if self.dp is None:
            return cluster_means(models, labels, previous, weights)
        return self.dp.means(rnd, models, labels, previous, public_labels, stream)

    @staticmethod
    def mean_loss(msgs: Sequence[Message]) -> float:
        """Sample-weighted mean of the devices' training losses."""
        n = sum(m.num_samples for m in msgs)
        return float(sum(m.loss * m.num_samples for m in msgs) / n) if n else float("nan")

    @staticmethod
    def upload_bytes(msgs: Sequence[Message]) -> int:
        return sum(tensor_bytes(m) for m in msgs)

    def clustered_stats(self, plan: RoundPlan, msgs: Sequence[Message], assignment: np.ndarray) -> RoundStats:
        """The round's stats for a clustered method: loss, bytes, the assignment and its cluster count."""
        return RoundStats(
            self.mean_loss(msgs),
            self.upload_bytes(msgs),
            plan.down_bytes,
            assignment=assignment,
            num_clusters=int(len(np.unique(assignment[assignment >= 0]))),
        )


@dataclass(frozen=True)
class MethodSpec:
    """A registry entry: the strategy class and its typed hyper-parameters."""

    strategy: type[Strategy]
    params: type


def updates_per_aggregation(cfg: ExperimentConfig) -> tuple[int, str]:
    """How many updates one aggregation takes, and what that number is called in an error: the devices per
    round, or asynchronously ``devices.async_buffer``."""
    if cfg.devices.simulate and cfg.devices.aggregation == "async":
        return cfg.devices.async_buffer, "updates per aggregation (devices.async_buffer)"
    return devices_per_round(cfg), "devices per round"
