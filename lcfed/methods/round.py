"""The types that flow through a round, between the server, the devices and the round loop: what the server
may know of the federation (:class:`Federation`), what a device-side hook may use (:class:`DeviceContext`),
a device's message (:class:`Message`), the round's plan (:class:`RoundPlan`) and outcome
(:class:`RoundStats`), an asynchronous arrival (:class:`Arrival`), and the two server steps every method
may share: the seeded device selection and FedBuff's buffered step.

Frozen dataclasses of tensors, arrays and scalars, below the :class:`~lcfed.methods.base.Strategy` that
produces and consumes them and the loop (:mod:`lcfed.run.loop`) that carries them; :mod:`lcfed.methods.base`
re-exports them, the plugin face a method imports from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import torch

from lcfed.learning.local_update import DeviceData, LocalResult, LocalWork, Proximal, batch_rng, local_update
from lcfed.learning.models import Model, ParamSpec

if TYPE_CHECKING:  # annotations only
    from lcfed.data.sources import Scaling
    from lcfed.devices.clock import RoundTiming
    from lcfed.devices.fleet import Fleet

__all__ = ["Arrival", "DeviceContext", "Federation", "M", "Message", "ModelMessage", "PersonalModel", "RoundPlan",
           "RoundStats", "ServerReads", "buffered_step", "select_devices"]

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
        clip: the round's clip under adaptive clipping (``privacy.clip_quantile``), filled by the server; else None.
    """

    rnd: int
    devices: tuple[int, ...]
    payload: Any
    instructions: Mapping[int, Any] = field(default_factory=dict)
    down_bytes: int = 0
    downlink: tuple[tuple[Any, int], ...] = ()
    layers_down: Mapping[str, int] = field(default_factory=dict)  # the server fills it from ``downlink``
    timing: RoundTiming | None = None  # the round on the simulated clock (devices.simulate), filled by the server
    clip: float | None = None  # adaptive clipping's clip this round, filled by the server


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
        clip_fraction: under adaptive clipping, the noised fraction of updates within the round's clip (b̄),
            filled by the server; None otherwise.
    """

    train_loss: float
    bytes_up: int
    bytes_down: int
    assignment: np.ndarray | None = None
    num_clusters: int = 0
    layers_up: Mapping[str, int] = field(default_factory=dict)  # filled by the server from the messages
    layers_down: Mapping[str, int] = field(default_factory=dict)  # and from the plan's downlink
    participants: int = 0
    clip_fraction: float | None = None


@dataclass(frozen=True)
class ServerReads:
    """What a method's server reads of each device (``Strategy.reads``), which decides what ``privacy.mode:
    central`` can guarantee (docs/privacy.md).

    Attributes:
        sums: what the server only ever sums over devices (``"models"``, ``"embeddings"``): under ``central``
            each device's part is clipped and every sum noised.
        per_device: what it reads one device at a time (``"codes"``, ``"models"``, ``"update directions"``,
            ``"losses"``, ``"cluster choices"``), beyond those sums.
        private: whether the method privatizes all of it under ``central``: its sums go through
            :meth:`Strategy.private_mean` / :meth:`Strategy.private_means`, and each ``per_device`` read is
            noised on the device or hidden in the sums. A method without it is refused under ``central``.
    """

    sums: tuple[str, ...] = ("models",)
    per_device: tuple[str, ...] = ("models",)
    private: bool = False


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


#: what a device sends back
M = TypeVar("M", bound=Message)


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
