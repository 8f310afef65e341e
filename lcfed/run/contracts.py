"""What the round loop calls, in one place: the engines' two seams, the observers' hooks, and what an engine
deploys (:class:`Engine`, the contract of :data:`lcfed.engines.ENGINES`).

``Server`` and ``DevicePool`` are the two seams: :mod:`lcfed.engines.local` implements them in-process,
:mod:`actors.ray_engine` with Ray actors. Observers (progress bar, MLflow, Tune) receive each round's
metrics; the loop itself never knows about them. Everything the loop calls on these objects is in
the Protocols below; an observer's optional hooks are Protocols of their own, with the default the
loop applies when an observer has not got one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import torch

from lcfed.config import ExperimentConfig
from lcfed.learning.local_update import EvalResult
from lcfed.methods.round import Federation, RoundStats

if TYPE_CHECKING:  # annotations only: the results module is the loop's, not the contracts'
    from lcfed.devices.clock import RoundTiming, SimClock
    from lcfed.run.checkpoint import Snapshot
    from lcfed.run.result import Newcomer, RunResult


class Plan(Protocol):
    """What the loop reads of a round's plan (a :class:`~lcfed.methods.base.RoundPlan`, or an engine's
    handle on one): the participants, and with the device model the round on the simulated clock."""

    @property
    def devices(self) -> tuple[int, ...]: ...

    @property
    def timing(self) -> RoundTiming | None: ...


PlanT = TypeVar("PlanT", bound=Plan)
PlanIn = TypeVar("PlanIn", bound=Plan, contravariant=True)


class Server(Protocol[PlanT]):
    """Holds the server state and applies the strategy's server-side hooks; ``PlanT`` is what its
    ``configure`` hands the device pool."""

    def configure(self, rnd: int, clock: SimClock | None = None, clip: float | None = None) -> PlanT: ...
    def aggregate(self, plan: PlanT, msgs: Any) -> RoundStats: ...
    def eval_payload(self) -> Any: ...
    def get_state(self) -> Any: ...
    def set_state(self, state: Any) -> None: ...
    def recover(self, state: Any | None, pending: Any = None) -> None: ...
    def get_pending(self) -> Any: ...
    def set_pending(self, pending: Any) -> None: ...


class DevicePool(Protocol[PlanIn]):
    """Hosts the devices: trains the round's participants (whatever ``train`` returns goes to the
    server's ``aggregate``), evaluates, and gives their states and personalized models.

    States go in and out a part at a time (``iter_states``; ``set_states`` and ``recover`` read a
    checkpoint's :class:`~lcfed.run.checkpoint.StateParts` part by part): a checkpoint never gathers
    every device's state in the driver."""

    def train(self, plan: PlanIn) -> Any: ...
    def evaluate(self, payload: Any, devices: Sequence[int] | None = None) -> dict[int, EvalResult]: ...
    def personalized(self, payload: Any) -> dict[int, torch.Tensor]: ...
    def get_states(self) -> dict[int, Any]: ...
    def iter_states(self) -> Iterator[dict[int, Any]]: ...
    def set_states(self, states: Mapping[int, Any]) -> None: ...
    def recover(self, states: Mapping[int, Any] | None) -> None: ...
    def join(self, devices: Sequence[int], newcomer: Newcomer) -> dict[int, EvalResult]: ...


class Observer(Protocol):
    """Hears a run: its start, every round's metrics and its result (the three hooks every observer has).

    An observer may also implement any of :class:`ErrorObserver`, :class:`LocatingObserver` and
    :class:`ModelsObserver`; where it does not, the loop uses the default each names.
    """

    def on_start(self, cfg: ExperimentConfig, fed: Federation) -> None: ...
    def on_round(self, rnd: int, metrics: dict[str, float], stats: RoundStats) -> None: ...
    def on_end(self, result: RunResult) -> None: ...


@runtime_checkable
class ErrorObserver(Protocol):
    """Optional: told when the run fails, before the exception propagates (MLflow marks its run FAILED).
    Default: not told."""

    def on_error(self, exc: BaseException) -> None: ...


@runtime_checkable
class LocatingObserver(Protocol):
    """Optional: where it logs the run (e.g. the MLflow run id), saved with every checkpoint so that a
    resumed run logs there too. Default: nothing."""

    def location(self) -> dict[str, str]: ...


@runtime_checkable
class ModelsObserver(Protocol):
    """Optional: whether it wants the final models in ``RunResult.models`` (read after the last round,
    so ``on_start`` may decide). Default: False."""

    wants_models: bool


@runtime_checkable
class PersonalLimit(Protocol):
    """Optional, beside ``wants_models``: the most bytes of personal models (m models of float32) the
    observer will use; past it the engine builds none (a model per device of 10^5 devices is GBs).
    Default: no limit."""

    max_personal_bytes: float


#: the personal models' size past which observers with a :class:`PersonalLimit` get none
MAX_PERSONAL_BYTES = 512 * 2**20


class Engine(Protocol):
    """A federation deployed on an engine (:data:`lcfed.engines.ENGINES`), from its opener until ``close``:
    ``LocalEngine`` in this process, ``RayEngine`` on actors."""

    def run(self, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
        """The rounds from the first (or ``resume``'s next) to the last, each reported to ``observers``."""
        ...

    def placement(self) -> dict[str, Any]:
        """Where it runs (hosts, CPUs, GPUs, nodes): a sweep trial reports it."""
        ...

    def close(self) -> None:
        """Release its hosts (threads, actors, the placement group, a private Ray it started)."""
        ...
