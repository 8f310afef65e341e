r"""The Ray engine: a pool of DeviceActors hosting virtual devices, and a ServerActor.

The actors and their restarts are :mod:`actors.hosts`, the nodes and the reservation :mod:`actors.nodes`,
the placement arithmetic :mod:`actors.placement`; this module is the driver's side: the handles that
implement the round loop's seams (:func:`lcfed.run.loop.run_rounds`) and the federation's life. What moves:
the server ``ray.put``\ s each round's broadcast once and actors resolve that one object; device
messages go from the actors straight to the ServerActor as object refs, never through the driver.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import ray
import torch
from ray.util.placement_group import get_current_placement_group, remove_placement_group

from actors.connect import ensure_ray
from actors.handles import ActorHosts, RayPool, RayServer
from actors.hosts import Hosts, fast_tensor_transfer
from actors.liveness import cluster_lost, get, watch
from actors.nodes import alive_nodes, alive_nodes_info, bundle_nodes, node_address, nodes_without, place_pool
from actors.placement import cluster_layout, pool_layout
from lcfed import numerics
from lcfed.config import ExperimentConfig
from lcfed.data import DataError, Dataset, Partition, Scaling
from lcfed.data.cache import file_version
from lcfed.engines import run_closed
from lcfed.methods.round import Federation
from lcfed.numerics import fingerprint, provenance
from lcfed.run.checkpoint import Snapshot
from lcfed.run.contracts import Observer
from lcfed.run.loop import run_rounds
from lcfed.run.result import RunResult
from lcfed.run.setup import finish_setup, input_scaling, partitioned
from lcfed.run.shards import FileShard, NodeShard, NodeSplit, check_generated, node_generated, setup_on_hosts, shard
from lcfed.run.sources import load

#: the engine's own names (the cluster's nodes are :mod:`actors.nodes`'s, the placement :mod:`actors.placement`'s)
__all__ = ["RayEngine", "open_ray", "run_ray"]


class RayEngine:
    """The Ray engine: a federation deployed on Ray's actors, which exist until :meth:`close`.

    This process loads the dataset (``dataset``, or from ``data.data_dir`` here) and partitions it. A
    dataset read from its cache file is read again by each device actor, its own rows only, where its
    node sees that file (``engine.data_reads``); otherwise this process sends each actor its devices'
    samples. Generated data is generated on the nodes.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        resources: tuple[float, float] | None = None,
        dataset: Dataset | None = None,
    ) -> None:
        """The experiment is prepared here from ``cfg`` and handed whole to every actor, which builds its part
        from it. ``resources`` = (CPUs, GPUs)
        the pool may use inside an enclosing placement group (a Tune trial's): the actors join that group.
        Default: a placement group of our own on the cluster."""
        numerics.activate(cfg.engine.numerics)  # before Ray starts: its workers inherit the environment
        self.cfg = cfg
        self.group = None
        self.hosts: Hosts | None = None
        self._generating: list[Any] = []
        #: who read the devices' samples: the driver (which sent them), each device actor on its node, or mixed
        self.data_reads = "driver"
        #: per device actor, whether it reads its rows of the dataset's cache file on its node
        self.reads: list[bool] = []
        #: seconds of each start-up phase and, after :meth:`close`, of the shutdown (where a start goes)
        self.timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(phase: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            self.timings[phase] = now - clock
            clock = now

        self.started_ray = ensure_ray(cfg.engine)
        lap("ray_start" if self.started_ray else "ray_attach")
        self.node_local = dataset is None and node_generated(cfg) is not None
        try:
            watch()  # a lost cluster is ClusterLost within seconds (actors.liveness)
            fast_tensor_transfer()
            self.common = Hosts.actor_options(cfg, attached=not self.started_ray)
            n = cfg.data.num_devices if self.node_local else None
            ds = file = None
            counting = False  # whether the actors count their pixels for the input scaling
            if n is None:
                ds = dataset if dataset is not None else load(cfg)
                part, fed = partitioned(cfg, ds)
                file = self._file_reads(cfg, ds)
                counting = file is not None and ds.is_image and cfg.data.normalize == "standardize"
                if not counting:
                    self.setup = finish_setup(cfg, fed, part, input_scaling(cfg, ds, part, fed.held_out))
                n = fed.num_devices
                lap("data")
            if resources is not None:
                self.layout = pool_layout(cfg.engine, n, *resources)
            else:
                self.layout = cluster_layout(cfg.engine, n, alive_nodes())
                self.group = place_pool(self.layout, cfg.engine.placement_timeout_s, can_grow=not self.started_ray)
            lap("placement")
            generating: list[Any] = []
            if ds is None:
                generating, shards = self._generate_on_nodes(cfg)
            elif file is not None:
                cut = [FileShard.cut(ds, part, block, file[1]) for block in self.layout.blocks]
                del ds
                self.reads = self._node_reads(cfg, file[0], file[1])
                # the driver reads the rows of the blocks whose node does not see its file, and sends them
                shards = [ray.put(sh if here else sh.build()) for sh, here in zip(cut, self.reads, strict=True)]
                self.data_reads = "nodes" if all(self.reads) else "mixed" if any(self.reads) else "driver"
                if counting:
                    generating = self._scale_on_hosts(cfg, part, fed, shards)
            else:
                shards = [ray.put(shard(ds, part, block)) for block in self.layout.blocks]
                del ds
            lap("shards" if self.data_reads == "driver" else "data_on_nodes")
            # each device actor's partition comes with its shard: the setup every actor gets holds none (at
            # m = 10^6 the whole partition is 2 x 10^6 index arrays, which each actor would unpickle)
            shared = replace(self.setup, partition=Partition((), (), np.zeros(0, dtype=np.int64)))
            # the driver's fingerprint first: actors on this machine then read it from the disk cache
            fingerprint.for_process(cfg.engine.torch_threads)
            self.hosts = Hosts(cfg, ray.put(shared), self.layout, shards, self.group, common=self.common,
                               generating=generating, file=file, reads=self.reads)
            self.actor_info = get([a.info.remote() for a in self.hosts.devices])
            lap("actors")
        except BaseException:
            self.close()
            raise

    def _file_reads(self, cfg: ExperimentConfig, ds: Dataset) -> tuple[str, tuple[int, int, str]] | None:
        """The dataset's cache file and the version it was read as (:func:`file_version`) when device actors may
        read their rows there (``engine.data_reads`` not ``driver``), or None when this process sends every actor
        its samples: also where this process (a Tune trial on another node than the sweep's driver, which loaded
        the dataset) does not see that version itself."""
        path = ds.x_file if cfg.engine.data_reads != "driver" else None
        if path is None:
            return None
        try:
            here = file_version(path)
        except OSError:
            here = None
        if here is None or ds.x_version is not None and here != ds.x_version:
            if cfg.engine.data_reads == "nodes":
                raise DataError(f"engine.data_reads=nodes: {path} is not here as the process that loaded the "
                                "dataset read it: put data.data_dir on storage every node reaches, at the same path, "
                                "or set engine.data_reads=auto or driver")
            return None
        return path, here

    def _node_reads(self, cfg: ExperimentConfig, path: str, version: tuple[int, int, str]) -> list[bool]:
        """Per device actor: whether its node sees the driver's version of the file (decided per node, once the
        pool is placed: an autoscaler's workers join only then). Inside a Tune trial an actor takes any bundle of
        the trial's group, so all of that group's nodes must see it. ``engine.data_reads=nodes`` requires every
        one to (:class:`DataError` naming the others, before any actor starts)."""
        where: list[set[str | None]]
        if self.group is not None:
            where = [{node} for node in bundle_nodes(self.group)]
        else:
            trial = get_current_placement_group()
            pool = bundle_nodes(trial) if trial is not None else [m["NodeID"] for m in alive_nodes_info()]
            where = [set(pool)] * len(self.layout.blocks)
        without = set(nodes_without(path, version, sorted({m for w in where for m in w if m})))
        reads = [None not in w and not w & without for w in where]
        if cfg.engine.data_reads == "nodes" and not all(reads):
            names = ", ".join(node_address(m) for m in sorted(without)) or "not yet placed"
            raise DataError(f"engine.data_reads=nodes: node(s) {names} do not see {path} as the driver does (the "
                            "same size, mtime and hash): put data.data_dir on storage every node reaches, at the same "
                            "path, or set engine.data_reads=auto (the driver sends the samples of those nodes' "
                            "actors) or driver")
        return reads

    def _scale_on_hosts(self, cfg: ExperimentConfig, part: Partition, fed: Federation, shards: list[Any]) -> list[Any]:
        """Device actors that read their rows of the file (or got them from this process: ``shards`` are refs) and
        count their training pixels, from which the input scaling is fitted (the same counts as
        :meth:`Scaling.fit`'s here, so the same bits). Returns the server and device actors (:meth:`Hosts.generate`),
        which wait for the setup."""
        actors = Hosts.generate(self.layout, shards, self.group, self.common)
        self._generating = actors  # closed with the engine if setting up fails
        counts = get([a.pixel_counts.remote(list(fed.held_out)) for a in actors[1:]])  # the server's first
        self.setup = finish_setup(cfg, fed, part, Scaling.from_counts(np.sum(counts, axis=0)))
        self._generating = []
        return actors

    def _generate_on_nodes(self, cfg: ExperimentConfig) -> tuple[list[Any], list[Any]]:
        """Generated data, built and partitioned where it is used: each device actor generates its devices'
        samples on its node and partitions them as the driver would the whole dataset
        (:func:`lcfed.run.shards.setup_on_hosts`); the driver holds no sample and no partition, only the
        federation's facts. Returns the server and device actors (:meth:`Hosts.generate`) and each device actor's
        :class:`NodeShard` (from which a restarted actor generates and partitions its devices again)."""
        spec = node_generated(cfg)
        assert spec is not None
        check_generated(cfg, spec)  # before any actor starts
        shards = [NodeShard(spec, block[0], block[-1] + 1, NodeSplit.of(cfg)) for block in self.layout.blocks]
        actors = Hosts.generate(self.layout, shards, self.group, self.common)
        self._generating = actors  # closed with the engine if setting up fails
        self.setup, done = setup_on_hosts(cfg, spec, shards, ActorHosts(actors[1:]))  # the server's first
        self._generating = []
        self.data_reads = "nodes"
        return actors, [ray.put(sh) for sh in done]

    def placement(self) -> dict[str, Any]:
        """Where the federation runs: each device actor's node (with that node's resources), GPU ids, ask,
        device count and who read its samples (``samples``: its ``node`` or the ``driver``), and the server's node."""
        assert self.hosts is not None
        nodes = {n["NodeID"]: n for n in alive_nodes_info()}

        def node(node_id: str) -> dict[str, Any]:
            res = nodes.get(node_id, {}).get("Resources", {})
            return {"node_id": node_id, "node_cpus": res.get("CPU", 0.0), "node_gpus": res.get("GPU", 0.0)}

        server_node = get(self.hosts.server.node_id.remote())
        actors = [{"actor": i, **node(info["node_id"]), "gpu_ids": info["gpu_ids"], "devices": info["devices"],
                   "cpus": self.layout.cpus_per_actor, "gpus": self.layout.gpus_per_actor,
                   "torch_device": info["torch_device"],
                   "samples": "node" if self.reads and self.reads[i] or self.data_reads == "nodes" else "driver"}
                  for i, info in enumerate(self.actor_info)]
        return {"device_actors": actors, "server": node(server_node), "data_reads": self.data_reads}

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
        return {"device_actors": hosts.call(lambda: get([a.holdings.remote() for a in hosts.devices])),
                "server": hosts.call(lambda: get(hosts.server.holdings.remote()))}

    def provenance(self) -> dict[str, str]:
        """This process's record (:func:`lcfed.numerics.provenance.record`), with the device actors' kernel levels
        where one differs from it (an actor whose kernels were chosen before lcfed pinned them)."""
        out = provenance.record(threads=self.cfg.engine.torch_threads)  # the actors' threads, not the driver's
        gpus = sorted({str(info.get("gpu", "")) for info in self.actor_info} - {""})
        if gpus:  # the actors' GPUs (the driver may have none)
            out.update(gpu=", ".join(gpus), cuda=str(torch.version.cuda))
        levels = sorted({str(info["kernels"]) for info in self.actor_info} | {out["kernels"]})
        if len(levels) > 1:
            out["kernels"] = ", ".join(levels)
            out["numerics_note"] = "the device actors ran other kernels than the driver: " + out["kernels"]
        prints = sorted({str(info.get("fingerprint", "")) for info in self.actor_info} - {"", out["fingerprint"]})
        if prints:  # a node whose CPU gives other bits: the run's numbers are that mix's
            out["fingerprint"] = ", ".join([out["fingerprint"], *prints])
            out["numerics_note"] = ("device actors ran on machines with other kernel fingerprints than the driver's: "
                                    + out["fingerprint"])
        return out

    def close(self) -> None:
        # a lost cluster's GCS would hold these calls for Ray's minute (then end the process): the actors and
        # the placement group went with the cluster, or are the cluster's to reap when its head comes back
        t = time.perf_counter()
        lost = cluster_lost()
        for actor in self._generating if not lost else []:
            ray.kill(actor)
        self._generating = []
        if self.hosts is not None:
            for actor in [*self.hosts.devices, self.hosts.server] if not lost else []:
                ray.kill(actor)
            self.hosts = None
        if self.group is not None:
            if not lost:
                remove_placement_group(self.group)
            self.group = None
        self.timings["close"] = time.perf_counter() - t
        if self.started_ray:
            t = time.perf_counter()
            ray.shutdown()
            self.started_ray = False
            self.timings["ray_shutdown"] = time.perf_counter() - t


def open_ray(cfg: ExperimentConfig, dataset: Dataset | None = None, resources: tuple[float, float] | None = None
             ) -> RayEngine:
    """The Ray engine's opener (:data:`lcfed.engines.ENGINES`): a placement group of its own on the cluster,
    or inside an enclosing reservation (a Tune trial's) of ``resources`` (CPUs, GPUs)."""
    return RayEngine(cfg, resources=resources, dataset=dataset)


def run_ray(cfg: ExperimentConfig, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
    """Run the whole federation on Ray (starting a local Ray if none is connected)."""
    return run_closed(open_ray(cfg), observers, resume)
