"""In-process execution: the reference engine every other engine must match number for number."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import torch

from lcfed import numerics
from lcfed.config import ExperimentConfig
from lcfed.devices.buffered import BufferedRound, BufferedScheduler, Pending, fill_messages, staleness_weight
from lcfed.devices.clock import SimClock
from lcfed.devices.schedule import Scheduler
from lcfed.engines import run_closed
from lcfed.engines.device_states import DeviceStates
from lcfed.learning.local_update import EvalResult, batch_rng, evaluate, local_update
from lcfed.learning.vectorized import BatchedNet, StepBatcher
from lcfed.methods.base import Strategy
from lcfed.methods.round import Arrival, DeviceContext, Message, RoundPlan, RoundStats
from lcfed.methods.traffic import downlink_traffic, layer_traffic, tensor_bytes
from lcfed.numerics import provenance
from lcfed.run.checkpoint import PART_DEVICES, Snapshot, state_chunks
from lcfed.run.contracts import Observer
from lcfed.run.loop import DivergenceError, run_rounds
from lcfed.run.result import Newcomer, RunResult
from lcfed.run.setup import Setup, prepare
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

    def configure(self, rnd: int, clock: SimClock | None = None) -> RoundPlan:
        """Round ``rnd``'s plan; with the device model (``clock`` given) only of the devices it keeps, or
        asynchronously of the devices that start from this version."""
        if clock is not None and self.buffered is not None:
            plan = self._buffered(rnd, clock)
        elif clock is not None and self.scheduler is not None:
            plan = self._scheduled(rnd, clock)
        else:
            plan = self.strategy.configure(self.state, rnd)
        # the downlink's objects are priced here, per layer, and not shipped along with the plan
        return replace(plan, downlink=(), layers_down=downlink_traffic(self.strategy.fed.spec, plan.downlink))

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


#: devices a host evaluates per batch of work handed to its threads
EVAL_CHUNK = 1024

T = TypeVar("T")
R = TypeVar("R")


def auto_workers(cfg: ExperimentConfig, cpus: float, where: torch.device) -> int:
    """Training threads for a host with ``cpus`` CPUs: ``engine.workers``, else one per CPU
    (each running ``torch_threads`` intra-op threads); one on a GPU, where kernels queue anyway."""
    if cfg.engine.workers:
        return cfg.engine.workers
    if where.type != "cpu":
        return 1
    return max(1, int(cpus) // cfg.engine.torch_threads)


class HostedDevices:
    """A set of virtual devices living in one process: their data and persistent states, built from the
    experiment's ``setup`` (its config included) and ``dataset`` (default: the config's, loaded here).

    Used directly in-process, and inside each Ray device actor. Devices train on ``workers``
    threads (torch releases the GIL inside its kernels), each with its own model skeleton since a
    functional call swaps the skeleton's parameters; a device's numbers do not depend on the thread.
    """

    def __init__(self, setup: Setup, devices: Sequence[int], dataset: Any = None, workers: int = 1) -> None:
        cfg = setup.cfg
        torch.set_num_threads(cfg.engine.torch_threads)
        self.cfg = cfg
        self.setup = setup
        self.where = setup.torch_device()
        ds = dataset if dataset is not None else load(cfg)
        self.devices = tuple(devices)
        self.data = setup.device_data(ds, self.devices, self.where)
        self.net = self._new_net()
        self.strategy = setup.strategy()
        self.init = setup.federation.init
        # a device's state is stored from its first training; before, it is the strategy's initial state
        self.states = DeviceStates(lambda d: self.strategy.init_device(d, self.init),
                                   int(cfg.engine.state_memory_mb * 2**20), cfg.engine.spill_dir)
        self.work = setup.local_work()
        self.workers = max(1, min(workers, len(self.devices)))
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="lcfed-device") if self.workers > 1 else None
        self._local = threading.local()
        self._local.net = self.net
        self._build = threading.Lock()  # building a skeleton forks torch's global RNG
        vec = cfg.engine.vectorize
        self.vectorize = vec == "always" or (vec == "auto" and self.where.type == "cuda")
        self.vectorize_max = max(1, min(cfg.engine.vectorize_max, len(self.devices)))
        self._vpool: ThreadPoolExecutor | None = None
        self._batch_net = self._new_net() if self.vectorize else None

    def _new_net(self) -> Any:
        return self.setup.network(self.where)

    def _net(self) -> Any:
        """The calling thread's model skeleton (a functional call swaps a skeleton's parameters)."""
        net = getattr(self._local, "net", None)
        if net is None:
            with self._build:
                net = self._new_net()
            self._local.net = net
        return net

    def _map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        if self._pool is None:
            return [fn(x) for x in items]
        return list(self._pool.map(fn, items))

    def context(self, device: int, rnd: int, net: Any = None) -> DeviceContext:
        """``net`` defaults to the calling thread's model skeleton."""
        return DeviceContext(device, rnd, self.data[device], self._net() if net is None else net, self.work, self.cfg.seed)

    def train(self, rnd: int, devices: Sequence[int], payload: Any, instructions: dict[int, Any]) -> list[Message]:
        todo = [d for d in devices if d in self.data]
        if self.vectorize:
            results = self._train_vectorized(rnd, todo, payload, instructions)
        else:

            def one(dev: int) -> tuple[Any, Message]:
                return self.strategy.local(self.context(dev, rnd), self.states.get(dev), payload, instructions.get(dev))

            results = self._map(one, todo)
        msgs = []
        for dev, (state, msg) in zip(todo, results, strict=True):
            self.states.put(dev, state)
            msgs.append(msg)
        return msgs

    def _train_vectorized(
        self, rnd: int, todo: list[int], payload: Any, instructions: dict[int, Any]
    ) -> list[tuple[Any, Message]]:
        """Every device in a thread of its own, their gradients batched by a :class:`StepBatcher`
        (which orders each batch by device id, so batches are reproducible); at most
        ``vectorize_max`` devices at a time."""
        assert self._batch_net is not None
        if self._vpool is None:
            self._vpool = ThreadPoolExecutor(self.vectorize_max, thread_name_prefix="lcfed-vdevice")
        out: list[tuple[Any, Message]] = []
        for start in range(0, len(todo), self.vectorize_max):
            chunk = todo[start : start + self.vectorize_max]
            batcher = StepBatcher(self._batch_net, chunk)

            def one(dev: int, batcher: StepBatcher = batcher) -> tuple[Any, Message]:
                try:
                    # a thread builds its own skeleton only if the strategy calls the model directly
                    ctx = self.context(dev, rnd, BatchedNet(self._net, batcher, dev))
                    return self.strategy.local(ctx, self.states.get(dev), payload, instructions.get(dev))
                finally:
                    batcher.leave(dev)

            out.extend(self._vpool.map(one, chunk))
        return out

    def get_states(self) -> dict[int, Any]:
        """The states of the hosted devices that have trained (the others hold their initial state)."""
        return self.states.stored()

    def iter_states(self) -> Iterator[dict[int, Any]]:
        """:meth:`get_states` in parts of :data:`~lcfed.run.checkpoint.PART_DEVICES` devices (spilled ones
        read back only for their part)."""
        ids = sorted(self.states.stored_ids())
        for start in range(0, len(ids), PART_DEVICES):
            yield {d: self.states.get(d) for d in ids[start : start + PART_DEVICES]}

    def set_states(self, states: Mapping[int, Any]) -> None:
        for chunk in state_chunks(states):
            self.states.update({d: s for d, s in chunk.items() if d in self.data})

    def reset(self) -> None:
        """Every hosted device back to its state before round 0."""
        self.states.clear()

    def recover(self, states: Mapping[int, Any] | None) -> None:
        """After a lost host: every hosted device back to its state before round 0, then to ``states``
        (a checkpoint's) where given."""
        self.reset()
        if states is not None:
            self.set_states(states)

    def evaluate(self, payload: Any, devices: Sequence[int] | None = None) -> dict[int, EvalResult]:
        """Each of ``devices`` hosted here (all if None) on its test (and validation) set with its
        personalized model, in chunks of :data:`EVAL_CHUNK` devices so that a host's models are never
        all built at once."""
        def one(dev: int) -> EvalResult:
            ctx = self.context(dev, -1)
            w = self.strategy.personalized(ctx, self.states.get(dev), payload).to(self.where)
            data = ctx.data
            test = evaluate(ctx.net, w, data.x_test, data.y_test)
            if data.x_val is None or data.y_val is None:
                return test
            return replace(test, val=evaluate(ctx.net, w, data.x_val, data.y_val))

        todo = list(self.devices) if devices is None else [d for d in devices if d in self.data]
        out: dict[int, EvalResult] = {}
        for start in range(0, len(todo), EVAL_CHUNK):
            chunk = todo[start : start + EVAL_CHUNK]
            out.update(zip(chunk, self._map(one, chunk), strict=True))
        return out

    def join(self, devices: Sequence[int], newcomer: Newcomer) -> dict[int, EvalResult]:
        """The hosted ``devices`` (held out of training) join after the last round, each evaluated on
        its test set with the model it adopts: of the server's models, the one with the lowest loss on
        its own training data (a newcomer picks the cluster that fits it best, as IFCA and LCFed assign
        devices); without any, the initial model (its embedding replaced by the server's, if it holds
        one) trained for one round's local work."""
        def one(dev: int) -> EvalResult:
            ctx = self.context(dev, -1)
            data = ctx.data
            if newcomer.models is not None:
                models = newcomer.models.to(self.where)
                losses = [evaluate(ctx.net, w, data.x_train, data.y_train).loss_sum for w in models]
                w = models[int(np.argmin(losses))]  # ties: the lowest index
            else:
                start = self.init.clone()
                if newcomer.embedding is not None:
                    start[: newcomer.embedding.numel()] = newcomer.embedding
                rng = batch_rng(self.cfg.seed, dev, self.cfg.train.rounds)  # the round after the last
                w = local_update(ctx.net, start.to(self.where), data, self.work, rng).weights
            return evaluate(ctx.net, w, data.x_test, data.y_test)

        todo = [d for d in devices if d in self.data]
        return dict(zip(todo, self._map(one, todo), strict=True))

    def personalized(self, payload: Any) -> dict[int, torch.Tensor]:
        """Each device's personalized weights (on the CPU): the model :meth:`evaluate` evaluates."""
        return {dev: self.strategy.personalized(self.context(dev, -1), self.states.get(dev), payload).cpu()
                for dev in self.devices}

    def holdings(self) -> dict[str, Any]:
        """What this host holds, device by device (to check that a host keeps only its own devices):
        the devices whose samples it has (``data_devices``: those with indices in its partition) and
        their rows and bytes, and the devices whose state is stored (``state_devices``) with the bytes
        in memory and how many are spilled."""
        part = self.setup.partition
        with_data = sorted({d for idx in (part.train, part.test, part.val) for d, a in enumerate(idx) if len(a)})
        ds = getattr(self.data, "ds", None)  # the CPU's lazy data keeps its shard's rows
        rows = len(ds.y) if ds is not None else sum(self.data[d].num_train + len(self.data[d].y_test) for d in self.data)
        data_bytes = int(ds.x.nbytes + ds.y.nbytes) if ds is not None else tensor_bytes(dict(self.data))
        return {"devices": list(self.devices), "data_devices": with_data, "data_rows": int(rows), "data_bytes": data_bytes,
                "state_devices": sorted(self.states.stored_ids()), "state_memory_bytes": self.states.memory_bytes,
                "states_spilled": self.states.spilled}

    def close(self) -> None:
        for pool in (self._pool, self._vpool):
            if pool is not None:
                pool.shutdown()
        self.states.close()


class DeviceHost:
    """The device-pool calls (:class:`lcfed.run.contracts.DevicePool`) a process answers from the devices it
    hosts (``self.hosted``): written once for :class:`LocalPool` and the Ray engine's ``DeviceActor``.

    ``train`` is each one's own: the in-process pool takes the round's plan, an actor its parts (Ray
    resolves the broadcast's object ref only when it is an argument of its own).
    """

    hosted: HostedDevices

    def evaluate(self, payload: Any, devices: Sequence[int] | None = None) -> dict[int, EvalResult]:
        return self.hosted.evaluate(payload, devices)

    def personalized(self, payload: Any) -> dict[int, torch.Tensor]:
        return self.hosted.personalized(payload)

    def join(self, devices: Sequence[int], newcomer: Newcomer) -> dict[int, EvalResult]:
        return self.hosted.join(devices, newcomer)

    def get_states(self) -> dict[int, Any]:
        return self.hosted.get_states()

    def set_states(self, states: Mapping[int, Any]) -> None:
        self.hosted.set_states(states)

    def recover(self, states: Mapping[int, Any] | None) -> None:
        self.hosted.recover(states)


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
