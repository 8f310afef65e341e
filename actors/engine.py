"""The Ray engine: a pool of DeviceActors hosting virtual devices, and a ServerActor.

No algorithm lives here: actors wrap :class:`lcfed.runner.HostedDevices` and
:class:`lcfed.runner.LocalServer`, and the round loop is :func:`lcfed.engine.run_rounds`. What moves:
the server ``ray.put``\\ s each round's broadcast once and actors resolve that one object; device
messages go from the actors straight to the ServerActor as object refs, never through the driver.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray
import torch

from lcfed.checkpoint import Snapshot
from lcfed.config import EngineConfig, ExperimentConfig
from lcfed.engine import HostFailure, Observer, RunResult, run_rounds
from lcfed.federation import Setup, make_strategy, prepare, resolve_device
from lcfed.local import EvalResult
from lcfed.methods.base import Message, RoundPlan, RoundStats
from lcfed.runner import HostedDevices, LocalServer, auto_workers

_NUMPY_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
)


def _tensor_to_wire(t: torch.Tensor) -> Any:
    """A CPU tensor as a numpy array, which Ray ships as one out-of-band buffer; torch's own pickling
    goes through ``torch.save`` per storage, which costs ~15 ms more for a round's 25 LeNet-5 models.
    Anything else (CUDA, autograd, bfloat16, sparse) keeps torch's pickling."""
    if t.device.type == "cpu" and not t.requires_grad and t.layout == torch.strided and t.dtype in _NUMPY_DTYPES:
        return t.contiguous().numpy()
    return pickle.dumps(t)


def _tensor_from_wire(obj: Any) -> torch.Tensor:
    if isinstance(obj, bytes):
        return pickle.loads(obj)
    return torch.from_numpy(obj.copy())  # a writable copy: the buffer is the read-only object store


def fast_tensor_transfer() -> None:
    """Ship CPU tensors through Ray as numpy buffers from this process (registration is per process;
    the receiving side needs nothing, the deserializer travels with the data)."""
    ray.util.register_serializer(torch.Tensor, serializer=_tensor_to_wire, deserializer=_tensor_from_wire)


@ray.remote
class DeviceActor:
    """Hosts a block of virtual devices: their data (loaded here, on the GPU if one is assigned)
    and their personal states, which never leave the actor."""

    def __init__(self, cfg: ExperimentConfig, setup: Setup, devices: Sequence[int], cpus: float = 1.0) -> None:
        fast_tensor_transfer()
        self.devices = tuple(devices)
        workers = auto_workers(cfg, cpus, resolve_device(cfg.engine.device))
        self.hosted = HostedDevices(cfg, setup, self.devices, workers=workers)

    def info(self) -> dict[str, Any]:
        return {
            "devices": len(self.devices),
            "torch_device": str(self.hosted.where),
            "workers": self.hosted.workers,
            "gpu_ids": ray.get_gpu_ids(),
            "pid": os.getpid(),
        }

    def train(self, rnd: int, devices: Sequence[int], payload: Any, instructions: dict[int, Any]) -> list[Message]:
        return self.hosted.train(rnd, devices, payload, instructions)

    def evaluate(self, payload: Any) -> dict[int, EvalResult]:
        return self.hosted.evaluate(payload)

    def get_states(self) -> dict[int, Any]:
        return self.hosted.get_states()

    def set_states(self, states: dict[int, Any]) -> None:
        self.hosted.set_states(states)

    def recover(self, states: dict[int, Any] | None) -> None:
        self.hosted.reset()
        if states is not None:
            self.hosted.set_states(states)


@ray.remote
class ServerActor:
    """Holds the strategy's server state; does the clustering and aggregation."""

    def __init__(self, cfg: ExperimentConfig, setup: Setup) -> None:
        fast_tensor_transfer()
        torch.set_num_threads(cfg.engine.torch_threads)
        self.server = LocalServer(make_strategy(cfg, setup.federation))

    def configure(self, rnd: int) -> tuple[RoundPlan, Any]:
        plan = self.server.configure(rnd)
        # the broadcast is stored once; every device actor resolves the same object
        return replace(plan, payload=None), [ray.put(plan.payload)]

    def aggregate(self, plan: RoundPlan, *msg_lists: list[Message]) -> RoundStats:
        msgs = [m for batch in msg_lists for m in batch]
        return self.server.aggregate(plan, msgs)

    def eval_payload(self) -> list[Any]:
        return [ray.put(self.server.eval_payload())]

    def get_state(self) -> Any:
        return self.server.get_state()

    def set_state(self, state: Any) -> None:
        self.server.set_state(state)

    def recover(self, state: Any | None) -> None:
        self.server.recover(state)


@dataclass(frozen=True)
class PoolLayout:
    """How devices are spread over actors and what each actor asks Ray for."""

    blocks: tuple[tuple[int, ...], ...]
    cpus_per_actor: float
    gpus_per_actor: float


def pool_layout(engine: EngineConfig, num_devices: int, cpus: float, gpus: float) -> PoolLayout:
    """Size the actor pool from the config and the resources Ray reports.

    ``devices_per_actor`` wins over ``num_actors``; with neither, one actor per CPU. Actors ask for
    at most their share of the CPUs so the whole pool always fits; with GPUs each actor takes a
    fraction ``gpus / actors`` (at most 1) unless ``gpus_per_actor`` says otherwise.
    """
    if engine.devices_per_actor:
        n_actors = math.ceil(num_devices / engine.devices_per_actor)
    elif engine.num_actors:
        n_actors = min(engine.num_actors, num_devices)
    else:
        n_actors = max(1, min(num_devices, int(cpus // engine.cpus_per_actor) or 1))
    per = math.ceil(num_devices / n_actors)
    blocks = tuple(tuple(range(s, min(s + per, num_devices))) for s in range(0, num_devices, per))
    n_actors = len(blocks)
    cpu = min(engine.cpus_per_actor, cpus / n_actors) if cpus > 0 else engine.cpus_per_actor
    if engine.gpus_per_actor >= 0:
        gpu = engine.gpus_per_actor
    else:
        gpu = min(1.0, gpus / n_actors) if gpus > 0 else 0.0
    # Ray accepts resource fractions with at most 4 decimals
    return PoolLayout(blocks, math.floor(cpu * 1e4) / 1e4, math.floor(gpu * 1e4) / 1e4)


@dataclass(frozen=True)
class RayPlan:
    plan: RoundPlan
    payload_ref: Any


class Hosts:
    """The federation's actors, with the means to notice lost ones and start them again."""

    def __init__(self, cfg: ExperimentConfig, setup_ref: Any, layout: PoolLayout) -> None:
        self.cfg = cfg
        self.setup_ref = setup_ref
        self.layout = layout
        self.server = self._new_server()
        self.devices = [self._new_device(block) for block in layout.blocks]

    def _new_server(self) -> Any:
        return ServerActor.options(num_cpus=0).remote(self.cfg, self.setup_ref)

    def _new_device(self, block: Sequence[int]) -> Any:
        opts = {"num_cpus": self.layout.cpus_per_actor, "num_gpus": self.layout.gpus_per_actor}
        return DeviceActor.options(**opts).remote(self.cfg, self.setup_ref, block, self.layout.cpus_per_actor)

    @staticmethod
    def _alive(actor: Any) -> bool:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=60)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    def call(self, fn: Any) -> Any:
        """Run ``fn`` (which does ``ray.get``); a lost actor becomes :class:`HostFailure`."""
        try:
            return fn()
        except ray.exceptions.RayError as exc:
            lost = [i for i, a in enumerate(self.devices) if not self._alive(a)]
            server_lost = not self._alive(self.server)
            if not lost and not server_lost:
                raise
            what = (["server actor"] if server_lost else []) + [f"device actor {i}" for i in lost]
            raise HostFailure(f"lost {', '.join(what)} ({type(exc).__name__})") from exc

    def restart_lost(self) -> None:
        if not self._alive(self.server):
            self.server = self._new_server()
        for i, actor in enumerate(self.devices):
            if not self._alive(actor):
                self.devices[i] = self._new_device(self.layout.blocks[i])


class RayServer:
    """Driver-side handle on the ServerActor (implements :class:`lcfed.engine.Server`)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    def configure(self, rnd: int) -> RayPlan:
        plan, (ref,) = self.hosts.call(lambda: ray.get(self.hosts.server.configure.remote(rnd)))
        return RayPlan(plan, ref)

    def aggregate(self, plan: RayPlan, msgs: list[Any]) -> RoundStats:
        return self.hosts.call(lambda: ray.get(self.hosts.server.aggregate.remote(plan.plan, *msgs)))

    def eval_payload(self) -> Any:
        (ref,) = self.hosts.call(lambda: ray.get(self.hosts.server.eval_payload.remote()))
        return ref

    def get_state(self) -> Any:
        return self.hosts.call(lambda: ray.get(self.hosts.server.get_state.remote()))

    def set_state(self, state: Any) -> None:
        self.hosts.call(lambda: ray.get(self.hosts.server.set_state.remote(state)))

    def recover(self, state: Any | None) -> None:
        self.hosts.restart_lost()
        ray.get(self.hosts.server.recover.remote(state))


class RayPool:
    """Driver-side handle on the DeviceActors (implements :class:`lcfed.engine.DevicePool`)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.blocks = [frozenset(b) for b in hosts.layout.blocks]

    def train(self, plan: RayPlan) -> list[Any]:
        p = plan.plan
        refs = []
        for actor, block in zip(self.hosts.devices, self.blocks, strict=True):
            mine = tuple(d for d in p.devices if d in block)
            if mine:
                instr = {d: p.instructions[d] for d in mine if d in p.instructions}
                refs.append(actor.train.remote(p.rnd, mine, plan.payload_ref, instr))
        return refs

    def _gather(self, method: str, *args: Any) -> dict[int, Any]:
        def run() -> dict[int, Any]:
            out: dict[int, Any] = {}
            for part in ray.get([getattr(a, method).remote(*args) for a in self.hosts.devices]):
                out.update(part)
            return out

        return self.hosts.call(run)

    def evaluate(self, payload_ref: Any) -> dict[int, EvalResult]:
        return self._gather("evaluate", payload_ref)

    def get_states(self) -> dict[int, Any]:
        return self._gather("get_states")

    def _split(self, states: dict[int, Any] | None, block: frozenset[int]) -> dict[int, Any] | None:
        return None if states is None else {d: s for d, s in states.items() if d in block}

    def set_states(self, states: dict[int, Any]) -> None:
        self.hosts.call(lambda: ray.get([
            a.set_states.remote(self._split(states, b)) for a, b in zip(self.hosts.devices, self.blocks, strict=True)
        ]))

    def recover(self, states: dict[int, Any] | None) -> None:
        self.hosts.restart_lost()
        ray.get([a.recover.remote(self._split(states, b)) for a, b in zip(self.hosts.devices, self.blocks, strict=True)])


def ensure_ray(engine: EngineConfig) -> bool:
    """Connect to (or start) Ray; return True if this call started it and should shut it down."""
    if ray.is_initialized():
        return False
    if engine.address or os.environ.get("RAY_ADDRESS"):
        # an existing cluster (e.g. inside a submitted job, which sets RAY_ADDRESS): it owns the resources
        ray.init(address=engine.address or None, log_to_driver=False)
    else:
        ray.init(
            num_cpus=engine.num_cpus or os.cpu_count(),
            include_dashboard=False,
            object_store_memory=engine.object_store_mb * 1024 * 1024,
            log_to_driver=False,
        )
    return True


class RayFederation:
    """A federation deployed on Ray: the actors exist until :meth:`close`."""

    def __init__(
        self, cfg: ExperimentConfig, setup: Setup | None = None, resources: tuple[float, float] | None = None
    ) -> None:
        """``resources`` = (CPUs, GPUs) the pool may use, e.g. a Tune trial's placement group;
        default: what the Ray cluster has available."""
        self.cfg = cfg
        self.started_ray = ensure_ray(cfg.engine)
        fast_tensor_transfer()
        self.setup = setup if setup is not None else prepare(cfg)
        if resources is None:
            res = ray.available_resources()
            resources = (res.get("CPU", 0.0), res.get("GPU", 0.0))
        self.layout = pool_layout(cfg.engine, self.setup.federation.num_devices, *resources)
        self.hosts = Hosts(cfg, ray.put(self.setup), self.layout)
        self.actor_info = ray.get([a.info.remote() for a in self.hosts.devices])

    def run(self, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
        server, pool = RayServer(self.hosts), RayPool(self.hosts)
        return run_rounds(self.cfg, self.setup.federation, server, pool, observers, resume)

    def close(self) -> None:
        for actor in [*self.hosts.devices, self.hosts.server]:
            ray.kill(actor)
        if self.started_ray:
            ray.shutdown()


def run_ray(cfg: ExperimentConfig, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
    """Run the whole federation on Ray (starting a local Ray if none is connected)."""
    fed = RayFederation(cfg)
    try:
        return fed.run(observers, resume)
    finally:
        fed.close()
