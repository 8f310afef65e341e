"""In-process execution: the reference engine every other engine must match number for number.

One host holds every device (:class:`~lcfed.engines.hosted.HostedDevices`, :mod:`lcfed.engines.hosted`); the
server runs in this process too (:class:`LocalServer`), and the round loop drives both.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from lcfed import _moved, numerics
from lcfed.config import ExperimentConfig
from lcfed.devices.buffered import BufferedRound, BufferedScheduler, Pending, fill_messages, staleness_weight
from lcfed.devices.clock import SimClock
from lcfed.devices.schedule import Scheduler
from lcfed.engines import run_closed
from lcfed.engines.hosted import DeviceHost, HostedDevices, auto_workers
from lcfed.methods.base import Strategy
from lcfed.methods.privacy import ClipTally
from lcfed.methods.round import Arrival, Message, RoundPlan, RoundStats
from lcfed.methods.traffic import downlink_traffic, layer_traffic
from lcfed.numerics import provenance
from lcfed.run.checkpoint import Snapshot
from lcfed.run.contracts import Observer
from lcfed.run.loop import DivergenceError, run_rounds
from lcfed.run.result import RunResult
from lcfed.run.setup import prepare
from lcfed.run.sources import load


class LocalServer:
    """Holds the strategy's server state and applies its hooks."""

    def __init__(self, strategy: Strategy, state: Any = None) -> None:
        self.strategy = strategy
        self.state = strategy.init() if state is None else state
        fleet, cfg = strategy.fed.fleet, strategy.cfg
        buffered = fleet is not None and cfg.devices.aggregation == "async"
        self.scheduler = Scheduler(cfg, strategy.fed, fleet) if fleet is not None and not buffered else None
        self.buffered = BufferedScheduler(cfg, strategy.fed, fleet) if fleet is not None and buffered else None
        self.pending: Pending | None = None  # asynchronous: the queue between aggregations
        self._round: tuple[BufferedRound, Any] | None = None  # asynchronous: the round planned, its payload

    def configure(self, rnd: int, clock: SimClock | None = None, clip: float | None = None) -> RoundPlan:
        """Round ``rnd``'s plan; with the device model (``clock`` given) only of the devices it keeps, or
        asynchronously of the devices that start from this version. ``clip``: adaptive clipping's clip for the
        round (the loop's, from the history), carried on the plan to :meth:`aggregate`."""
        if clock is not None and self.buffered is not None:
            plan = self._buffered(rnd, clock)
        elif clock is not None and self.scheduler is not None:
            plan = self._scheduled(rnd, clock)
        else:
            plan = self.strategy.configure(self.state, rnd)
        # the downlink's objects are priced here, per layer, and not shipped along with the plan
        return replace(plan, downlink=(), layers_down=downlink_traffic(self.strategy.fed.spec, plan.downlink), clip=clip)

    def _configure_for(self, rnd: int, devices: tuple[int, ...]) -> RoundPlan:
        """The strategy's plan for round ``rnd`` with ``devices`` as what ``Strategy.participants`` returns."""
        self.strategy.scheduled = devices
        try:
            return self.strategy.configure(self.state, rnd)
        finally:
            self.strategy.scheduled = None

    def _scheduled(self, rnd: int, clock: SimClock) -> RoundPlan:
        """The method's plan for the devices the schedule keeps. A method that chose its own devices this round
        (FLHC's clustering round, FedGroup's pretraining sample) keeps those of them the device model keeps."""
        assert self.scheduler is not None
        timing = self.scheduler.plan(rnd, clock)
        plan = self._configure_for(rnd, timing.kept)
        if tuple(plan.devices) != timing.kept:
            timing = self.scheduler.keep_among(rnd, clock, tuple(plan.devices))
            kept = set(timing.kept)
            plan = replace(plan, devices=timing.kept,
                           instructions={d: v for d, v in plan.instructions.items() if d in kept})
        return replace(plan, timing=timing)

    def _buffered(self, rnd: int, clock: SimClock) -> RoundPlan:
        """The asynchronous round: the method's plan for the devices that start from this version (not
        those lost on the way, whose work is never computed)."""
        assert self.buffered is not None
        planned = self.buffered.plan(rnd, clock, self.pending)
        trained = tuple(sorted(f.device for f in planned.starts if not f.lost))
        plan = self._configure_for(rnd, trained)
        if tuple(plan.devices) != trained:
            raise RuntimeError(f"method {self.strategy.name!r} chose its own devices in round {rnd}: "
                               "asynchronous aggregation needs a method that selects through Strategy.participants")
        self._round = (planned, plan.payload)
        return replace(plan, timing=planned.timing)

    def _aggregate_buffered(self, plan: RoundPlan, ordered: Sequence[Message]) -> tuple[RoundStats, list[Message]]:
        """Queue the starters' messages, then aggregate the B updates that arrived, staleness-weighted; the
        stats and the arrived messages (the round's uploads)."""
        assert self._round is not None
        planned, payload = self._round
        by_device = {m.device: m for m in ordered}
        kind = self.strategy.cfg.devices.staleness
        arrivals = [Arrival(by_device[f.device] if f.version == plan.rnd else f.message, plan.rnd - f.version,
                            payload if f.version == plan.rnd else f.start, staleness_weight(kind, plan.rnd - f.version))
                    for f in planned.arrivals]
        self.state, stats = self.strategy.aggregate_async(self.state, plan, arrivals)
        self.pending = fill_messages(planned.pending, plan.rnd, by_device, payload)
        self._round = None
        return replace(stats, participants=len(arrivals)), [a.message for a in arrivals]

    def _aggregate_clipped(self, plan: RoundPlan, ordered: Sequence[Message]) -> tuple[Any, RoundStats]:
        """The strategy's aggregate at the round's adaptive clip, and the noised fraction of updates within it.
        The strategy's private aggregation is swapped for the round's around the hook (as ``scheduled`` is
        around ``configure``), so the clip stays out of every method's state."""
        dp, tally = self.strategy.dp, ClipTally()
        assert dp is not None and plan.clip is not None
        self.strategy.dp = dp.at(plan.clip, tally)
        try:
            state, stats = self.strategy.aggregate(self.state, plan, ordered)
        finally:
            self.strategy.dp = dp
        fraction = None if tally.within is None else dp.fraction(plan.rnd, tally.within)
        return state, replace(stats, clip_fraction=fraction)

    def aggregate(self, plan: RoundPlan, msgs: Sequence[Message]) -> RoundStats:
        if not plan.devices and self._round is None:  # the device model kept no one: the state stays
            return RoundStats(float("nan"), 0, 0)
        ordered = sorted(msgs, key=lambda m: m.device)
        bad = [m.device for m in ordered if not math.isfinite(m.loss)]
        if bad:  # stop before non-finite models reach the clustering and the averages
            raise DivergenceError(
                f"round {plan.rnd}: training loss is nan/inf on {len(bad)} device(s) (first: {bad[0]}); "
                "lower train.lr or check the data"
            )
        uploaded: Sequence[Message] = ordered
        if self._round is not None:
            stats, uploaded = self._aggregate_buffered(plan, ordered)
        elif plan.clip is not None:
            self.state, stats = self._aggregate_clipped(plan, ordered)
        else:
            self.state, stats = self.strategy.aggregate(self.state, plan, ordered)
        spec = self.strategy.fed.spec
        layers_up: dict[str, int] = {}
        for m in uploaded:
            for k, v in layer_traffic(spec, m).items():
                layers_up[k] = layers_up.get(k, 0) + v
        return replace(stats, layers_up=layers_up, layers_down=dict(plan.layers_down),
                       participants=stats.participants or len(ordered))

    def eval_payload(self) -> Any:
        return self.strategy.eval_payload(self.state)

    def get_state(self) -> Any:
        return self.state

    def set_state(self, state: Any) -> None:
        self.state = state

    def recover(self, state: Any | None, pending: Pending | None = None) -> None:
        self.state = self.strategy.init() if state is None else state
        self.pending, self._round = pending, None

    def get_pending(self) -> Pending | None:
        """The asynchronous server's queue (None otherwise): checkpointed beside the state."""
        return self.pending

    def set_pending(self, pending: Pending | None) -> None:
        self.pending, self._round = pending, None


class LocalPool(DeviceHost):
    """All devices in this process."""

    def __init__(self, hosted: HostedDevices) -> None:
        self.hosted = hosted

    def train(self, plan: RoundPlan) -> list[Message]:
        return self.hosted.train(plan.rnd, plan.devices, plan.payload, dict(plan.instructions))

    def iter_states(self) -> Iterator[dict[int, Any]]:
        return self.hosted.iter_states()


class LocalEngine:
    """The in-process engine: the whole federation hosted in this process, on ``cpus`` CPUs (the same
    ``run`` / ``placement`` / ``close`` as the Ray engine's, so a Tune trial can run either)."""

    def __init__(self, cfg: ExperimentConfig, dataset: Any, cpus: int) -> None:
        numerics.activate(cfg.engine.numerics)
        self.cfg, self.cpus = cfg, cpus
        self.setup = prepare(cfg, dataset)
        workers = auto_workers(cfg, cpus, self.setup.torch_device())
        self.hosted = HostedDevices(self.setup, range(self.setup.federation.num_devices), dataset, workers)

    def placement(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "workers": self.hosted.workers, "torch_device": str(self.hosted.where),
                "devices": self.setup.federation.num_devices}

    def run(self, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
        server = LocalServer(self.setup.strategy())
        return run_rounds(self.cfg, self.setup.federation, server, LocalPool(self.hosted), observers, resume,
                          provenance.record(self.hosted.where, self.cfg.engine.torch_threads))

    def close(self) -> None:
        self.hosted.close()


def open_local(cfg: ExperimentConfig, dataset: Any = None, resources: tuple[float, float] | None = None) -> LocalEngine:
    """The in-process engine's opener (:data:`lcfed.engines.ENGINES`): on ``resources``' CPUs (a Tune
    trial's), else ``engine.num_cpus`` or every CPU this process may use."""
    numerics.activate(cfg.engine.numerics)  # before load(), the first tensor op
    cpus = max(1, int(resources[0])) if resources is not None else cfg.engine.num_cpus or len(os.sched_getaffinity(0))
    return LocalEngine(cfg, load(cfg) if dataset is None else dataset, cpus)


def run_local(cfg: ExperimentConfig, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
    """Run the whole federation in this process (continuing from ``resume`` if given)."""
    return run_closed(open_local(cfg), observers, resume)


def __getattr__(name: str) -> Any:
    """A name split off to :mod:`lcfed.engines.hosted`, read here: found there, with a DeprecationWarning."""
    return _moved.split_off(__name__, name)
