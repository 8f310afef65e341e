"""The devices one host holds, on any engine: their data, model skeletons and states, trained on worker threads
(or vmapped together on a GPU), evaluated in chunks, joined by newcomers after the last round
(:class:`HostedDevices`), and the host-side calls every engine's device host shares (:class:`DeviceHost`).
The in-process engine (:mod:`lcfed.engines.local`) holds all of them in one; the Ray engine's device actors
(:mod:`actors.hosts`) hold one each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import torch

from lcfed.config import ExperimentConfig
from lcfed.engines.device_states import DeviceStates
from lcfed.learning.local_update import EvalResult, batch_rng, evaluate, local_update
from lcfed.learning.vectorized import BatchedNet, StepBatcher
from lcfed.methods.round import DeviceContext, Message
from lcfed.methods.traffic import tensor_bytes
from lcfed.run.checkpoint import PART_DEVICES, state_chunks
from lcfed.run.result import Newcomer
from lcfed.run.setup import Setup
from lcfed.run.sources import load

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
        # DP-SGD's per-sample gradients run device by device (config refuses "always" with them)
        self.vectorize = (vec == "always" or (vec == "auto" and self.where.type == "cuda")) and not cfg.privacy.sample_on
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
        ``vectorize_max`` devices at a time, and a device twice in ``todo`` (asynchronous rounds give a fast one
        two jobs) in two batches, each job from the state it had before the round, as unbatched."""
        assert self._batch_net is not None
        if self._vpool is None:
            self._vpool = ThreadPoolExecutor(self.vectorize_max, thread_name_prefix="lcfed-vdevice")
        out: list[tuple[Any, Message]] = []
        for chunk in _batches(todo, self.vectorize_max):
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


def _batches(todo: Sequence[int], size: int) -> Iterator[list[int]]:
    """``todo`` in order, cut into runs of at most ``size`` devices, none of them twice in a run."""
    chunk: list[int] = []
    for dev in todo:
        if len(chunk) == size or dev in chunk:
            yield chunk
            chunk = []
        chunk.append(dev)
    if chunk:
        yield chunk
