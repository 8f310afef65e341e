"""The federation's Ray processes: device actors hosting blocks of virtual devices, the server actor,
and :class:`Hosts`, which starts them in their placement and starts lost ones again.

No algorithm lives here: actors wrap :class:`lcfed.engines.hosted.HostedDevices` and
:class:`lcfed.engines.local.LocalServer`. CPU tensors cross Ray as numpy buffers
(:func:`fast_tensor_transfer`).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from actors.liveness import alive, check_cluster, get
from actors.nodes import bundle_nodes, head_node_id, nodes_without, workers_start_with
from actors.placement import PoolLayout
from lcfed import numerics
from lcfed.config import ExperimentConfig
from lcfed.data import Dataset, Partition, Scaling
from lcfed.data.cache import check_version
from lcfed.devices.clock import SimClock
from lcfed.engines.hosted import DeviceHost, HostedDevices, auto_workers
from lcfed.engines.local import LocalServer
from lcfed.methods.round import Message, RoundPlan, RoundStats
from lcfed.methods.traffic import tensor_bytes
from lcfed.numerics import fingerprint
from lcfed.run.loop import HostFailure
from lcfed.run.setup import Setup, scaling_rows
from lcfed.run.shards import FileShard, NodeShard, feature_pieces, node_facts, shard_scaling_rows

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
    Answers the pool's calls as :class:`lcfed.engines.hosted.DeviceHost` does in-process."""

    def __init__(self, setup: Setup | None, devices: Sequence[int],
                 shard: tuple[Dataset, Partition] | NodeShard | FileShard, cpus: float = 1.0) -> None:
        """``shard``: the devices' samples and partition, cut by the process that loaded the dataset; a
        :class:`FileShard` to read those samples here; or a :class:`NodeShard` to generate and partition them
        here. Without ``setup``, the actor reads its rows (a :class:`FileShard`: to count their pixels) or
        generates its samples (answering the driver's :class:`lcfed.run.shards.GeneratingHosts` calls) until
        :meth:`start`."""
        self.devices = tuple(devices)
        self.cpus = cpus
        # until start, when generating here: the samples, their split and lists, the scaling's rows
        self._generated: Any = None
        self._split: Any = None
        self._lists: Any = None
        self._rows: Any = None
        self._file: tuple[Dataset, Partition] | None = None  # read before the setup, to count its pixels
        if isinstance(shard, FileShard) and setup is None:
            self._file = shard.build()
        elif isinstance(shard, tuple) and setup is None:  # rows a driver read for this node, to count first
            self._file = shard
        elif setup is None:
            assert isinstance(shard, NodeShard)
            self._node, self._generated = shard, shard.generate()
        else:
            self.start(setup, shard)

    def start(self, setup: Setup, shard: tuple[Dataset, Partition] | NodeShard | FileShard) -> None:
        """Host the devices: their data from ``shard`` (generated and partitioned here if a :class:`NodeShard`)."""
        numerics.activate(setup.cfg.engine.numerics)
        fast_tensor_transfer()
        workers = auto_workers(setup.cfg, self.cpus, setup.torch_device())
        if self._file is not None:  # its rows, counted before the setup
            ds, part = self._file
            self._file = None
        elif isinstance(shard, NodeShard):  # the samples and lists made before the setup, if any
            ds, part = shard.build(self._generated, self._lists)
        elif isinstance(shard, FileShard):  # its rows, read here from the dataset's cache file
            ds, part = shard.build()
        else:
            ds, part = shard  # this actor's devices' samples, from the process that loaded the dataset
        self._generated = self._split = self._lists = self._rows = None
        self.hosted = HostedDevices(replace(setup, partition=part), self.devices, ds, workers=workers)

    def test_split(self) -> tuple[np.ndarray, np.ndarray]:
        """Its devices' train and test counts (:meth:`NodeShard.test_split`)."""
        self._split = self._node.test_split(self._generated)
        return self._split.counts(len(self.devices))

    def partition(self, shard: NodeShard, held_out: Sequence[int]) -> dict[str, Any]:
        """Partition its devices as ``shard`` says; their :func:`lcfed.run.shards.node_facts` and scaling rows."""
        self._node, ds = shard, self._generated
        self._lists = shard.lists(ds, self._split)
        self._rows = shard_scaling_rows(shard, self._lists[0], held_out)
        return {**node_facts(shard, ds, self._lists), "scaling_rows": len(self._rows)}

    def pixel_counts(self, held_out: Sequence[int]) -> np.ndarray:
        """Its devices' training pixels counted (:meth:`Scaling.pixel_counts`), held-out devices' excepted."""
        assert self._file is not None
        ds, part = self._file
        return Scaling.pixel_counts(ds.x, scaling_rows(part.train, held_out))

    def feature_pieces(self, before: int, total: int, mean: np.ndarray | None) -> Any:
        """Its part of the input scaling's chunks (:func:`lcfed.run.shards.feature_pieces`)."""
        return feature_pieces(self._generated.x, self._rows, before, total, mean)

    def info(self) -> dict[str, Any]:
        return {
            "devices": len(self.devices),
            "torch_device": str(self.hosted.where),
            "workers": self.hosted.workers,
            "gpu_ids": ray.get_gpu_ids(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "kernels": numerics.state()["level"],
            "fingerprint": fingerprint.for_process(self.hosted.cfg.engine.torch_threads).digest,
            "gpu": torch.cuda.get_device_name(self.hosted.where) if self.hosted.where.type == "cuda" else "",
        }

    def train(self, rnd: int, devices: Sequence[int], payload: Any, instructions: dict[int, Any]) -> list[Message]:
        return self.hosted.train(rnd, devices, payload, instructions)

    def holdings(self) -> dict[str, Any]:
        """Its devices' samples and states (:meth:`HostedDevices.holdings`) and where it runs."""
        return {**self.hosted.holdings(), "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


class ServerActor:
    """Holds the strategy's server state; does the clustering and aggregation."""

    def __init__(self, setup: Setup | None) -> None:
        """With ``setup`` None the actor waits for :meth:`start`: started beside device actors that read or
        generate their samples before the setup exists, its process is up by the first round."""
        if setup is not None:
            self.start(setup)

    def start(self, setup: Setup) -> None:
        numerics.activate(setup.cfg.engine.numerics)
        fast_tensor_transfer()
        torch.set_num_threads(setup.cfg.engine.torch_threads)
        self.server = LocalServer(setup.strategy())

    def configure(self, rnd: int, clock: SimClock | None = None, clip: float | None = None) -> tuple[RoundPlan, Any]:
        plan = self.server.configure(rnd, clock, clip)
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

    def recover(self, state: Any | None, pending: Any = None) -> None:
        self.server.recover(state, pending)

    def get_pending(self) -> Any:
        return self.server.get_pending()

    def set_pending(self, pending: Any) -> None:
        self.server.set_pending(pending)


#: the two actor classes as Ray starts them (what ``@ray.remote`` would make of the classes, named so
#: that type checkers see it: they do not apply class decorators)
RemoteDevice = ray.remote(DeviceActor)
RemoteServer = ray.remote(ServerActor)


def new_device(layout: PoolLayout, placement: Any, common: dict[str, Any], i: int, setup: Any, shard: Any) -> Any:
    """Device actor ``i`` started with its resources, ``common`` options and, in a placement group of ours, its
    bundle: hosting ``shard`` under ``setup`` (a ref), or, with ``setup`` None, generating its samples."""
    opts: dict[str, Any] = {"num_cpus": layout.cpus_per_actor, "num_gpus": layout.gpus_per_actor, **common}
    if placement is not None:
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=i)
    return RemoteDevice.options(**opts).remote(setup, layout.blocks[i], shard, layout.cpus_per_actor)


def new_server(placement: Any, common: dict[str, Any], setup: Any) -> Any:
    """The server actor with ``common`` options, hosting ``setup`` (a ref; None: waiting for its ``start``).
    In a placement group of ours (``placement``) it runs on the head."""
    opts: dict[str, Any] = {"num_cpus": 0, **common}
    if placement is not None:
        # hard: Ray's soft affinity was seen to spill a 0-CPU actor onto a worker under load; the
        # head outlives every federation (a cluster whose head is gone is gone)
        node = head_node_id()
        if node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return RemoteServer.options(**opts).remote(setup)


class Hosts:
    """The federation's actors, with the means to notice lost ones and start them again.

    Device actors live in the bundles of one placement group (``placement``; None inside a Tune
    trial, whose own group captures them); each receives its devices' samples as an object ref.
    The ServerActor asks for no CPU and, outside a trial, prefers the head node (where drivers run
    on a cluster; GPU workers are left to device actors).
    """

    def __init__(
        self, cfg: ExperimentConfig, setup_ref: Any, layout: PoolLayout, shard_refs: Sequence[Any],
        placement: Any = None, common: dict[str, Any] | None = None, generating: Sequence[Any] = (),
        file: tuple[str, tuple[int, int, str]] | None = None, reads: Sequence[bool] = (),
    ) -> None:
        """``generating``: the server and device actors already started without a setup (:meth:`generate`), which
        take it here, the device actors hosting their devices; a restarted one generates its shard again from its
        :class:`NodeShard`.
        ``file``: the path and version (size, mtime, hash) of the file the actors whose ``reads`` is true read
        their rows of (:class:`FileShard`), which a lost actor is restarted to read only if it is still that
        version, on a node that sees it."""
        self.cfg = cfg
        self.file = file
        self.reads = list(reads)
        self.common = dict(common or {})
        self.setup_ref = setup_ref
        self.layout = layout
        self.shard_refs = list(shard_refs)
        self.placement = placement
        if generating:
            # the server was started with the generating actors (:meth:`generate`): it takes the setup now
            self.server, *self.devices = generating
            get([self.server.start.remote(setup_ref)] +
                [a.start.remote(setup_ref, ref) for a, ref in zip(self.devices, self.shard_refs, strict=True)])
        else:
            self.server = self._new_server()
            self.devices = [self._new_device(i) for i in range(len(layout.blocks))]

    @staticmethod
    def actor_options(cfg: ExperimentConfig, attached: bool) -> dict[str, Any]:
        """Every actor's options (``common`` of :class:`Hosts`): on a cluster lcfed attached to, the workers
        may have been started by `ray start` without the profile's variables, and import numpy before lcfed:
        then they get them from their start through a runtime env, for which Ray starts fresh workers
        through its agent (~0.4 s more for two actors on 2 cores). Clusters whose nodes already start their
        workers with them (`lcfed head`'s) need none."""
        env = numerics.worker_env(cfg.engine.numerics) if attached else {}
        return {"runtime_env": {"env_vars": env}} if env and not workers_start_with(env) else {}

    @classmethod
    def generate(cls, layout: PoolLayout, shards: Sequence[Any], placement: Any = None,
                 common: dict[str, Any] | None = None) -> list[Any]:
        """The server actor, then device actors that generate (or read, or are sent) their devices' samples, all
        waiting for a setup: the server's process starts while the devices' samples are made, not in round 0."""
        return [new_server(placement, common or {}, None),
                *(new_device(layout, placement, common or {}, i, None, shard) for i, shard in enumerate(shards))]

    def _new_server(self) -> Any:
        return new_server(self.placement, self.common, self.setup_ref)

    def _new_device(self, i: int) -> Any:
        return new_device(self.layout, self.placement, self.common, i, self.setup_ref, self.shard_refs[i])

    @staticmethod
    def _alive(actor: Any) -> bool:
        return alive(actor, timeout=60)

    def call(self, fn: Any) -> Any:
        """Run ``fn`` (which does ``ray.get``); a lost actor becomes :class:`HostFailure`, a lost private
        Ray :class:`~lcfed.run.faults.ClusterLost`."""
        try:
            return fn()
        except ray.exceptions.RayError as exc:
            check_cluster(wait=True)  # a cluster without its head (or raylet) cannot restart actors: no HostFailure then
            lost = [i for i, a in enumerate(self.devices) if not self._alive(a)]
            server_lost = not self._alive(self.server)
            if not lost and not server_lost:
                raise
            what = (["server actor"] if server_lost else []) + [f"device actor {i}" for i in lost]
            raise HostFailure(f"lost {', '.join(what)} ({type(exc).__name__})") from exc

    def restart_lost(self) -> None:
        check_cluster(wait=True)  # starting an actor waits for the GCS: not on a cluster whose head is gone
        if not self._alive(self.server):
            self.server = self._new_server()
        for i, actor in enumerate(self.devices):
            if not self._alive(actor):
                if self.file is not None:  # its rows are read again: from the file the run partitioned
                    check_version(*self.file)
                    if self.reads and self.reads[i] and not self._node_reads(i):
                        self.shard_refs[i] = ray.put(ray.get(self.shard_refs[i]).build())
                        self.reads[i] = False
                self.devices[i] = self._new_device(i)

    def _node_reads(self, i: int) -> bool:
        """Whether the node of device actor ``i``'s bundle (which Ray moves with a lost node) sees the run's file:
        a bundle not placed again yet counts as not (its rows are then sent); inside a Tune trial (no group of
        ours) the decision made for all the trial's nodes stands."""
        assert self.file is not None
        if self.placement is None:
            return True
        node = bundle_nodes(self.placement)[i]
        return node is not None and not nodes_without(*self.file, [node])
