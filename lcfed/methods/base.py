"""The Strategy interface every method implements, and the types that flow through a round.

A round is ``configure -> local (per device, where its data lives) -> aggregate``; evaluation asks
each device for its personalized model. The round loop exists once (:mod:`lcfed.run.loop`) and only
calls these hooks, in-process or on Ray.

What clustered methods share is in :mod:`lcfed.methods.clustered`; pricing what a round moves in
:mod:`lcfed.methods.traffic` (its three functions stay importable from here, where the engines take them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import numpy as np
import torch

from lcfed.learning.local_update import DeviceData, LocalResult, LocalWork, Proximal, batch_rng, local_update
from lcfed.learning.models import Model, ParamSpec
from lcfed.methods.traffic import tensor_bytes

if TYPE_CHECKING:  # annotations only: lcfed.config finds the methods through the registry
    from lcfed.config import ExperimentConfig
    from lcfed.data.sources import Scaling
    from lcfed.devices.fleet import Fleet
    from lcfed.devices.schedule import RoundTiming

__all__ = [
    "D", "M", "P", "S", "Arrival", "DeviceContext", "Federation", "Message", "MethodSpec", "ModelMessage", "PersonalModel",
    "RoundPlan", "RoundStats", "Strategy", "buffered_step", "devices_per_round", "updates_per_aggregation", "select_devices", "tensor_bytes",
]


@dataclass(frozen=True)
class Federation:
    """What the server may know about the federation: sizes and model layout, never samples."""

    num_devices: int
    train_sizes: np.ndarray
    groups: np.ndarray
    spec: ParamSpec
    init: torch.Tensor
    num_classes: int
    seed: int
    flops_per_sample: float = 0.0  # forward pass of one sample; prices simulated compute time
    # sizes and classes per device, min / median / max (lcfed.data.partition_stats): logged, not used
    partition_stats: Mapping[str, float] = field(default_factory=dict)
    # each device's label distribution over its training samples: cluster-quality metrics only
    label_dist: np.ndarray | None = None
    input_shape: tuple[int, ...] = ()  # one sample's (C, H, W): rebuilds the model skeleton (e.g. to log models)
    # devices kept out of every round (data.holdout_fraction), sorted: they join only after the last one
    held_out: tuple[int, ...] = ()
    # the testbed whose true clusters ``groups`` are (data.testbed); "": a label-skew proxy
    group_kind: str = ""
    # how stored samples become model inputs (the training pool's per-channel mean/std: statistics, no
    # samples); the logged models apply it, so they take samples as the dataset stores them
    scaling: Scaling | None = None
    # each device's speed, links and availability (devices.simulate); None: ideal devices
    fleet: Fleet | None = None

    def training_devices(self) -> tuple[int, ...]:
        """The devices rounds may select: all but the held-out ones."""
        held = set(self.held_out)
        return tuple(d for d in range(self.num_devices) if d not in held)


@dataclass(frozen=True)
class DeviceContext:
    """Everything a device-side hook may use: its id, data, the network and the round's budget.

    Attributes:
        device: the device's id.
        rnd: the round, from 0; -1 when the device is evaluated (:meth:`Strategy.personalized`).
        data: the device's samples, already on the device that trains them (standardized float inputs,
            int64 labels): ``x_train``/``y_train``, ``x_test``/``y_test``, and ``x_val``/``y_val`` with
            ``data.val_fraction``.
        net: the model as a function of flat weights: ``net(w, x)`` gives logits (see :mod:`lcfed.learning.models`).
        work: the local budget of ``train``: ``lr``, ``batch_size``, and ``steps`` or ``epochs``.
        seed: the run's seed, for :func:`lcfed.learning.local_update.batch_rng` streams of the method's own.
    """

    device: int
    rnd: int
    data: DeviceData
    net: Model
    work: LocalWork
    seed: int

    def local_update(self, start: torch.Tensor, proximal: Sequence[Proximal] = ()) -> LocalResult:
        """The shared local SGD (:func:`lcfed.learning.local_update.local_update`) of this device in this round, from
        ``start`` (not modified), on its data and budget, with its round's batches (stream 0)."""
        return local_update(self.net, start.to(self.data.x_train.device), self.data, self.work,
                            batch_rng(self.seed, self.device, self.rnd), proximal)


@dataclass(frozen=True)
class Message:
    """What a device sends back. Methods subclass it (a frozen dataclass) with the tensors they upload:
    every tensor a message carries counts in ``bytes_up``.

    Attributes:
        device: the sender's id.
        num_samples: its training samples (``ctx.data.num_train``), the usual aggregation weight.
        loss: its mean training loss this round (``LocalResult.loss``); a non-finite one stops the run.
    """

    device: int
    num_samples: int
    loss: float


@dataclass(frozen=True)
class ModelMessage(Message):
    """A device's whole trained model (flat weights), what most methods upload."""

    weights: torch.Tensor


@dataclass(frozen=True)
class RoundPlan:
    """The server's instructions for one round; build it with :meth:`Strategy.plan`.

    Attributes:
        rnd: the round, from 0.
        devices: the round's participants, sorted (from :meth:`Strategy.participants`).
        payload: broadcast once to every participant (one ``ray.put`` on Ray): :meth:`Strategy.local`'s ``payload``.
        instructions: small per-device values (a cluster id): :meth:`Strategy.local`'s ``instruction``.
        down_bytes: the size of ``downlink``.
        downlink: what the participants really receive, as ``(object, number of receivers)`` pairs (a
            device that downloads only its cluster's model counts one model, not the whole payload).
        layers_down: ``downlink`` per layer, filled by the server.
        timing: the round on the simulated clock (``devices.simulate``), filled by the server.
    """

    rnd: int
    devices: tuple[int, ...]
    payload: Any
    instructions: Mapping[int, Any] = field(default_factory=dict)
    down_bytes: int = 0
    downlink: tuple[tuple[Any, int], ...] = ()
    layers_down: Mapping[str, int] = field(default_factory=dict)  # the server fills it from ``downlink``
    timing: RoundTiming | None = None  # the round on the simulated clock (devices.simulate), filled by the server


@dataclass(frozen=True)
class RoundStats:
    """Server-side outcome of a round, small enough to report every round.

    Attributes:
        train_loss: the participants' sample-weighted mean training loss (:meth:`Strategy.mean_loss`).
        bytes_up: what the messages carry (:meth:`Strategy.upload_bytes`).
        bytes_down: what the devices downloaded (``plan.down_bytes``).
        assignment: a clustered method's cluster of every device, (m,) int, -1 for none; None otherwise.
        num_clusters: the cluster count (0 for a method that does not cluster).
        layers_up: ``bytes_up`` per layer, filled by the server.
        layers_down: ``bytes_down`` per layer, filled by the server.
        participants: how many updates the round aggregated, filled by the server when 0.
    """

    train_loss: float
    bytes_up: int
    bytes_down: int
    assignment: np.ndarray | None = None
    num_clusters: int = 0
    layers_up: Mapping[str, int] = field(default_factory=dict)  # filled by the server from the messages
    layers_down: Mapping[str, int] = field(default_factory=dict)  # and from the plan's downlink
    participants: int = 0


@dataclass(frozen=True)
class PersonalModel:
    """A device's own model, held where the device lives; ``trained`` once it has had a round."""

    weights: torch.Tensor
    trained: bool = False


def select_devices(
    num_devices: int, fraction: float, seed: int, rnd: int, exclude: Sequence[int] = ()
) -> tuple[int, ...]:
    """The round's participants: ``ceil(fraction * m)`` devices, sorted, a pure function of (seed, round),
    where ``m`` counts only the devices not in ``exclude`` (the held-out ones), which are never chosen."""
    if not exclude:  # the draw as it always was, so runs without held-out devices stay the same
        count = max(1, int(np.ceil(fraction * num_devices - 1e-9)))
        if count >= num_devices:
            return tuple(range(num_devices))
        rng = np.random.default_rng([seed, rnd, 0x5E1EC7])
        return tuple(sorted(int(i) for i in rng.choice(num_devices, size=count, replace=False)))
    skip = set(exclude)
    pool = np.array([d for d in range(num_devices) if d not in skip], dtype=np.int64)
    count = max(1, int(np.ceil(fraction * len(pool) - 1e-9)))
    if count >= len(pool):
        return tuple(int(d) for d in pool)
    rng = np.random.default_rng([seed, rnd, 0x5E1EC7])
    return tuple(sorted(int(i) for i in rng.choice(pool, size=count, replace=False)))


#: a method's server state (a frozen dataclass), what :meth:`Strategy.init` and ``aggregate`` return
S = TypeVar("S")
#: a device's persistent state, held where the device lives (None for devices that keep nothing)
D = TypeVar("D")
#: what a device sends back
M = TypeVar("M", bound=Message)
#: the round's broadcast (:attr:`RoundPlan.payload`), what ``local`` receives
P = TypeVar("P")


@dataclass(frozen=True)
class Arrival(Generic[M]):
    """An update an asynchronous server aggregates: the message, how many aggregations happened since the
    device fetched its start (``staleness``), that start (the payload it trained from) and the update's weight,
    ``devices.staleness`` of the staleness (FedBuff: 1/sqrt(1 + s))."""

    message: M
    staleness: int
    start: Any
    weight: float


def buffered_step(current: torch.Tensor, arrivals: Sequence[Arrival[Any]], start_of: Any = None) -> torch.Tensor:
    """FedBuff's server step: ``current + sum_i (n_i / sum n) * weight_i * (w_i - start_i)`` over the arrivals'
    models ``w_i`` (``message.weights``) and the models they started from (``start_of(arrival)``, default
    ``arrival.start``), sample-weighted. Fresh updates (weight 1) of one version give the sync average."""
    n = torch.tensor([a.message.num_samples for a in arrivals], dtype=torch.float64)
    scale = (n / n.sum()) * torch.tensor([a.weight for a in arrivals], dtype=torch.float64)
    step = torch.zeros_like(current, dtype=torch.float64)
    for a, c in zip(arrivals, scale, strict=True):
        start = start_of(a) if start_of is not None else a.start
        step += c * (a.message.weights.to(torch.float64) - start.to(torch.float64))
    return (current.to(torch.float64) + step).to(current.dtype)


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

    def __init__(self, cfg: ExperimentConfig, fed: Federation) -> None:
        self.cfg = cfg
        self.fed = fed
        self.params = cfg.method.params
        self.seed = cfg.seed

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


def devices_per_round(cfg: ExperimentConfig) -> int:
    """How many devices a round selects: ``train.participation`` of the training devices, at least one
    (as :func:`select_devices` counts them)."""
    return max(1, int(np.ceil(cfg.train.participation * cfg.data.training_devices - 1e-9)))


