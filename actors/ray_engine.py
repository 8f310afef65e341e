"""The Ray engine: a pool of DeviceActors hosting virtual devices, and a ServerActor.

No algorithm lives here: actors wrap :class:`lcfed.engines.local.HostedDevices` and
:class:`lcfed.engines.local.LocalServer`, and the round loop is :func:`lcfed.loop.run_rounds`. What moves:
the server ``ray.put``\\ s each round's broadcast once and actors resolve that one object; device
messages go from the actors straight to the ServerActor as object refs, never through the driver.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from actors.connect import ClusterError, ensure_ray
from actors.liveness import alive, check_cluster, get
from actors.placement import NodeResources, PoolLayout, cluster_layout, fits, pool_layout
from lcfed import numerics
from lcfed.checkpoint import Snapshot, state_chunks
from lcfed.config import ExperimentConfig
from lcfed.data import Dataset, Partition
from lcfed.engines.local import DeviceHost, HostedDevices, LocalServer, auto_workers
from lcfed.federation import Setup, load, make_strategy, prepare, resolve_device, shard
from lcfed.local_update import EvalResult
from lcfed.loop import HostFailure, Newcomer, Observer, RunResult, run_rounds
from lcfed.methods.base import Message, RoundPlan, RoundStats, tensor_bytes

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


class DeviceActor(DeviceHost):
    """Hosts a block of virtual devices: their data (sent once by the process that loaded the
    dataset, placed on the GPU if one is assigned) and their personal states, which never leave the actor.
    Answers the pool's calls as :class:`lcfed.engines.local.DeviceHost` does in-process."""

    def __init__(
        self, cfg: ExperimentConfig, setup: Setup, devices: Sequence[int], shard: tuple[Dataset, Partition],
        cpus: float = 1.0,
    ) -> None:
        numerics.activate(cfg.engine.numerics)
        fast_tensor_transfer()
        self.devices = tuple(devices)
        workers = auto_workers(cfg, cpus, resolve_device(cfg.engine.device))
        ds, part = shard  # this actor's devices' samples, from the process that loaded the dataset
        self.hosted = HostedDevices(cfg, replace(setup, partition=part), self.devices, ds, workers=workers)

    def info(self) -> dict[str, Any]:
        return {
            "devices": len(self.devices),
            "torch_device": str(self.hosted.where),
            "workers": self.hosted.workers,
            "gpu_ids": ray.get_gpu_ids(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "kernels": numerics.state()["level"],
            "gpu": torch.cuda.get_device_name(self.hosted.where) if self.hosted.where.type == "cuda" else "",
        }

    def train(self, rnd: int, devices: Sequence[int], payload: Any, instructions: dict[int, Any]) -> list[Message]:
        return self.hosted.train(rnd, devices, payload, instructions)

    def holdings(self) -> dict[str, Any]:
        """Its devices' samples and states (:meth:`HostedDevices.holdings`) and where it runs."""
        return {**self.hosted.holdings(), "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


class ServerActor:
    """Holds the strategy's server state; does the clustering and aggregation."""

    def __init__(self, cfg: ExperimentConfig, setup: Setup) -> None:
        numerics.activate(cfg.engine.numerics)
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

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def holdings(self) -> dict[str, Any]:
        """Where it runs, the server state's tensor bytes, and the state's fields with one row per device
        (``per_device``: name -> bytes; e.g. an assignment, never a model per device)."""
        state, m = self.server.state, self.server.strategy.fed.num_devices
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)} if dataclasses.is_dataclass(state) else {}
        per_device = {k: tensor_bytes(v) for k, v in fields.items()
                      if isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim and v.shape[0] == m}
        return {"node_id": self.node_id(), "pid": os.getpid(), "state_bytes": tensor_bytes(state),
                "per_device": per_device}

    def get_state(self) -> Any:
        return self.server.get_state()

    def set_state(self, state: Any) -> None:
        self.server.set_state(state)

    def recover(self, state: Any | None) -> None:
        self.server.recover(state)


#: the two actor classes as Ray starts them (what ``@ray.remote`` would make of the classes, named so
#: that type checkers see it: they do not apply class decorators)
RemoteDevice = ray.remote(DeviceActor)
RemoteServer = ray.remote(ServerActor)


@dataclass(frozen=True)
class RayPlan:
    plan: RoundPlan
    payload_ref: Any

    @property
    def devices(self) -> tuple[int, ...]:
        """The round's participants, as :class:`RoundPlan` names them (the engine counts coverage)."""
        return self.plan.devices


class Hosts:
    """The federation's actors, with the means to notice lost ones and start them again.

    Device actors live in the bundles of one placement group (``placement``; None inside a Tune
    trial, whose own group captures them); each receives its devices' samples as an object ref.
    The ServerActor asks for no CPU and, outside a trial, prefers the head node (where drivers run
    on a cluster; GPU workers are left to device actors).
    """

    def __init__(
        self, cfg: ExperimentConfig, setup_ref: Any, layout: PoolLayout, shard_refs: Sequence[Any],
        placement: Any = None,
    ) -> None:
        self.cfg = cfg
        self.setup_ref = setup_ref
        self.layout = layout
        self.shard_refs = list(shard_refs)
        self.placement = placement
        self.server = self._new_server()
        self.devices = [self._new_device(i) for i in range(len(layout.blocks))]

    def _new_server(self) -> Any:
        opts: dict[str, Any] = {"num_cpus": 0}
        if self.placement is not None:
            # hard: Ray's soft affinity was seen to spill a 0-CPU actor onto a worker under load; the
            # head outlives every federation (a cluster whose head is gone is gone)
            node = head_node_id()
            if node is not None:
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return RemoteServer.options(**opts).remote(self.cfg, self.setup_ref)

    def _new_device(self, i: int) -> Any:
        opts: dict[str, Any] = {"num_cpus": self.layout.cpus_per_actor, "num_gpus": self.layout.gpus_per_actor}
        if self.placement is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=i)
        block = self.layout.blocks[i]
        return RemoteDevice.options(**opts).remote(self.cfg, self.setup_ref, block, self.shard_refs[i],
                                                   self.layout.cpus_per_actor)

    @staticmethod
    def _alive(actor: Any) -> bool:
        return alive(actor, timeout=60)

    def call(self, fn: Any) -> Any:
        """Run ``fn`` (which does ``ray.get``); a lost actor becomes :class:`HostFailure`, a lost private
        Ray :class:`~lcfed.faults.ClusterLost`."""
        try:
            return fn()
        except ray.exceptions.RayError as exc:
            check_cluster()  # an actor on a node without its raylet cannot be restarted: no HostFailure then
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
                self.devices[i] = self._new_device(i)


class RayServer:
    """Driver-side handle on the ServerActor (implements :class:`lcfed.loop.Server`)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    def configure(self, rnd: int) -> RayPlan:
        plan, (ref,) = self.hosts.call(lambda: get(self.hosts.server.configure.remote(rnd)))
        return RayPlan(plan, ref)

    def aggregate(self, plan: RayPlan, msgs: list[Any]) -> RoundStats:
        return self.hosts.call(lambda: get(self.hosts.server.aggregate.remote(plan.plan, *msgs)))

    def eval_payload(self) -> Any:
        (ref,) = self.hosts.call(lambda: get(self.hosts.server.eval_payload.remote()))
        return ref

    def get_state(self) -> Any:
        return self.hosts.call(lambda: get(self.hosts.server.get_state.remote()))

    def set_state(self, state: Any) -> None:
        self.hosts.call(lambda: get(self.hosts.server.set_state.remote(state)))

    def recover(self, state: Any | None) -> None:
        self.hosts.restart_lost()
        get(self.hosts.server.recover.remote(state))


class RayPool:
    """Driver-side handle on the DeviceActors (implements :class:`lcfed.loop.DevicePool`)."""

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
            for part in get([getattr(a, method).remote(*args) for a in self.hosts.devices]):
                out.update(part)
            return out

        return self.hosts.call(run)

    def evaluate(self, payload_ref: Any, devices: Sequence[int] | None = None) -> dict[int, EvalResult]:
        if devices is None:
            return self._gather("evaluate", payload_ref)
        wanted = set(devices)

        def run() -> dict[int, EvalResult]:  # only the actors hosting a sampled device
            parts = [(a, tuple(sorted(b & wanted))) for a, b in zip(self.hosts.devices, self.blocks, strict=True)]
            out: dict[int, EvalResult] = {}
            for part in ray.get([a.evaluate.remote(payload_ref, mine) for a, mine in parts if mine]):
                out.update(part)
            return out

        return self.hosts.call(run)

    def personalized(self, payload_ref: Any) -> dict[int, torch.Tensor]:
        return self._gather("personalized", payload_ref)

    def join(self, devices: Sequence[int], newcomer: Newcomer) -> dict[int, EvalResult]:
        ref = ray.put(newcomer)  # one copy of the final models for every actor
        return self._gather("join", tuple(devices), ref)

    def get_states(self) -> dict[int, Any]:
        return self._gather("get_states")

    def iter_states(self) -> Iterator[dict[int, Any]]:
        """One actor's stored states at a time: the driver never holds every device's."""
        for actor in self.hosts.devices:
            yield self.hosts.call(lambda actor=actor: get(actor.get_states.remote()))

    def _send(self, states: Mapping[int, Any]) -> None:
        """``states`` to the actors hosting them, a part (of a checkpoint's) at a time."""
        for chunk in state_chunks(states):
            get([a.set_states.remote(mine) for a, b in zip(self.hosts.devices, self.blocks, strict=True)
                 if (mine := {d: s for d, s in chunk.items() if d in b})])

    def set_states(self, states: Mapping[int, Any]) -> None:
        self.hosts.call(lambda: self._send(states))

    def recover(self, states: Mapping[int, Any] | None) -> None:
        self.hosts.restart_lost()
        get([a.recover.remote(None) for a in self.hosts.devices])
        if states is not None:
            self._send(states)


def _alive_nodes_info() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def head_node_id() -> str | None:
    """The head node's id (Ray gives the head the resource ``node:__internal_head__``)."""
    for n in _alive_nodes_info():
        if "node:__internal_head__" in n.get("Resources", {}):
            return str(n["NodeID"])
    return None


class PlacementError(ClusterError):
    """The cluster cannot place the federation's actors: what was asked, what the cluster has."""


def alive_nodes() -> list[NodeResources]:
    return [NodeResources(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0))
            for n in _alive_nodes_info()]


def _describe_cluster() -> str:
    nodes = _alive_nodes_info()
    avail = ray.available_resources()
    per_node = "; ".join(
        f"node {n['NodeManagerAddress']} {n['NodeID'][:8]}: CPU {n['Resources'].get('CPU', 0):g}, GPU {n['Resources'].get('GPU', 0):g}"
        for n in nodes
    )
    return (f"{len(nodes)} alive node(s) [{per_node}]; available now: CPU {avail.get('CPU', 0):g}, "
            f"GPU {avail.get('GPU', 0):g}")


def place_pool(layout: PoolLayout, timeout_s: float, can_grow: bool) -> Any:
    """Reserve every device actor's bundle at once (all or nothing), or raise :class:`PlacementError`.

    A cluster that cannot grow (a private local Ray) fails at once when its nodes cannot hold the
    bundles; one that may (an autoscaler starting workers for the pending demand) gets ``timeout_s``.
    """
    bundles = layout.bundles()
    ask = (f"{len(bundles)} device actor(s) x {{CPU: {layout.cpus_per_actor:g}"
           + (f", GPU: {layout.gpus_per_actor:g}" if layout.gpus_per_actor > 0 else "") + "}")
    fix = ("set engine.cpus_per_actor / engine.actors_per_gpu / engine.num_actors / engine.gpus to fit, "
           "or add nodes")
    if not can_grow and not fits(layout, alive_nodes()):
        raise PlacementError(f"cannot place the federation: asked for {ask}, more than the nodes hold; "
                             f"the cluster has {_describe_cluster()}; {fix}")
    pg = placement_group(bundles, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise PlacementError(
            f"cannot place the federation within {timeout_s:g} s (engine.placement_timeout_s): asked for {ask}; "
            f"the cluster has {_describe_cluster()}; {fix}"
        ) from None
    return pg


class RayFederation:
    """A federation deployed on Ray: the actors exist until :meth:`close`.

    This process loads the dataset (``dataset``, or from ``data.data_dir`` here) and ships each
    device actor its devices' samples; no other node reads data files.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        setup: Setup | None = None,
        resources: tuple[float, float] | None = None,
        dataset: Dataset | None = None,
    ) -> None:
        """``resources`` = (CPUs, GPUs) the pool may use inside an enclosing placement group (a Tune
        trial's): the actors join that group. Default: a placement group of our own on the cluster."""
        numerics.activate(cfg.engine.numerics)  # before Ray starts: its workers inherit the environment
        self.cfg = cfg
        self.group = None
        self.hosts: Hosts | None = None
        self.started_ray = ensure_ray(cfg.engine)
        try:
            fast_tensor_transfer()
            ds = dataset if dataset is not None else load(cfg)
            self.setup = setup if setup is not None else prepare(cfg, ds)
            n = self.setup.federation.num_devices
            if resources is not None:
                self.layout = pool_layout(cfg.engine, n, *resources)
            else:
                self.layout = cluster_layout(cfg.engine, n, alive_nodes())
                self.group = place_pool(self.layout, cfg.engine.placement_timeout_s, can_grow=not self.started_ray)
            shards = [ray.put(shard(ds, self.setup.partition, block)) for block in self.layout.blocks]
            self.hosts = Hosts(cfg, ray.put(self.setup), self.layout, shards, self.group)
            self.actor_info = get([a.info.remote() for a in self.hosts.devices])
        except BaseException:
            self.close()
            raise

    def placement(self) -> dict[str, Any]:
        """Where the federation runs: each device actor's node (with that node's resources), GPU ids,
        ask and device count, and the server's node."""
        assert self.hosts is not None
        nodes = {n["NodeID"]: n for n in _alive_nodes_info()}

        def node(node_id: str) -> dict[str, Any]:
            res = nodes.get(node_id, {}).get("Resources", {})
            return {"node_id": node_id, "node_cpus": res.get("CPU", 0.0), "node_gpus": res.get("GPU", 0.0)}

        server_node = get(self.hosts.server.node_id.remote())
        actors = [{"actor": i, **node(info["node_id"]), "gpu_ids": info["gpu_ids"], "devices": info["devices"],
                   "cpus": self.layout.cpus_per_actor, "gpus": self.layout.gpus_per_actor,
                   "torch_device": info["torch_device"]}
                  for i, info in enumerate(self.actor_info)]
        return {"device_actors": actors, "server": node(server_node)}

    def run(self, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
        assert self.hosts is not None
        server, pool = RayServer(self.hosts), RayPool(self.hosts)
        result = run_rounds(self.cfg, self.setup.federation, server, pool, observers, resume, self.provenance())
        result.placement = self.placement()
        return result

    def holdings(self) -> dict[str, Any]:
        """What each process of the federation holds: ``device_actors`` (one
        :meth:`DeviceActor.holdings` each) and ``server`` (:meth:`ServerActor.holdings`)."""
        assert self.hosts is not None
        hosts = self.hosts
        return {"device_actors": hosts.call(lambda: ray.get([a.holdings.remote() for a in hosts.devices])),
                "server": hosts.call(lambda: ray.get(hosts.server.holdings.remote()))}

    def provenance(self) -> dict[str, str]:
        """This process's record (:func:`lcfed.numerics.provenance`), with the device actors' kernel levels
        where one differs from it (an actor whose kernels were chosen before lcfed pinned them)."""
        out = numerics.provenance()
        gpus = sorted({str(info.get("gpu", "")) for info in self.actor_info} - {""})
        if gpus:  # the actors' GPUs (the driver may have none)
            out.update(gpu=", ".join(gpus), cuda=str(torch.version.cuda))
        levels = sorted({str(info["kernels"]) for info in self.actor_info} | {out["kernels"]})
        if len(levels) > 1:
            out["kernels"] = ", ".join(levels)
            out["numerics_note"] = "the device actors ran other kernels than the driver: " + out["kernels"]
        return out

    def close(self) -> None:
        if self.hosts is not None:
            for actor in [*self.hosts.devices, self.hosts.server]:
                ray.kill(actor)
            self.hosts = None
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def run_ray(cfg: ExperimentConfig, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
    """Run the whole federation on Ray (starting a local Ray if none is connected)."""
    fed = RayFederation(cfg)
    try:
        return fed.run(observers, resume)
    finally:
        fed.close()
