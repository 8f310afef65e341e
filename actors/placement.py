"""Where a federation's device actors go: the pure arithmetic that sizes the actor pool and checks it
against the nodes' resources. No Ray here (the Ray engine, :mod:`actors.ray_engine`, asks Ray for the
nodes and reserves what this plans), so it is tested on plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lcfed.config import EngineConfig


@dataclass(frozen=True)
class PoolLayout:
    """How devices are spread over actors and what each actor asks Ray for."""

    blocks: tuple[range, ...]  # consecutive devices: ranges, O(1) at any m (tuples of 10^6 ints took 36 MB)
    cpus_per_actor: float
    gpus_per_actor: float

    def bundles(self) -> list[dict[str, float]]:
        """One placement-group bundle per device actor."""
        one = {"CPU": self.cpus_per_actor, **({"GPU": self.gpus_per_actor} if self.gpus_per_actor > 0 else {})}
        return [dict(one) for _ in self.blocks]


@dataclass(frozen=True)
class NodeResources:
    """What one alive Ray node has in all (CPUs, GPUs)."""

    cpus: float
    gpus: float


def _floor4(x: float) -> float:
    return math.floor(x * 1e4) / 1e4  # Ray takes resource fractions with at most 4 decimals


def pool_layout(engine: EngineConfig, num_devices: int, cpus: float, gpus: float) -> PoolLayout:
    """Size the actor pool for a budget of ``cpus`` and ``gpus`` (e.g. a Tune trial's bundles).

    ``devices_per_actor`` wins over ``num_actors``; with neither, one actor per CPU. Actors ask for
    at most their share of the CPUs so the whole pool always fits; with GPUs each actor takes a
    fraction ``gpus / actors`` (at most 1) unless ``gpus_per_actor`` says otherwise.
    """
    n_actors = _explicit_actors(engine, num_devices) or max(1, min(num_devices, int(cpus // engine.cpus_per_actor) or 1))
    blocks = _blocks(num_devices, n_actors)
    n_actors = len(blocks)
    cpu = min(engine.cpus_per_actor, cpus / n_actors) if cpus > 0 else engine.cpus_per_actor
    if engine.gpus_per_actor >= 0:
        gpu = engine.gpus_per_actor
    else:
        gpu = min(1.0, gpus / n_actors) if gpus > 0 else 0.0
    return PoolLayout(blocks, _floor4(cpu), _floor4(gpu))


def cluster_layout(engine: EngineConfig, num_devices: int, nodes: Sequence[NodeResources]) -> PoolLayout:
    """Size the actor pool for a cluster whose nodes may differ (e.g. a CPU head and GPU workers).

    With GPUs (``engine.gpus``, or auto: every GPU the nodes have), device actors go on GPU nodes
    only, ``actors_per_gpu`` to a GPU, spread over the GPU nodes in proportion to their GPUs, each
    asking for the CPUs and GPU fraction that let the tightest node hold its share; CPU-only nodes
    are left to drivers and the server. ``engine.gpus`` stated while no GPU node is up yet still
    plans GPU actors: the pending placement is what makes an autoscaler start GPU workers.
    Without GPUs, actors fill the nodes' CPUs.
    """
    cpa = engine.cpus_per_actor
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    want = 0.0 if engine.gpus_per_actor == 0 else engine.gpus if engine.gpus >= 0 else sum(n.gpus for n in gpu_nodes)
    if want <= 0:
        slots = sum(int(n.cpus // cpa) for n in nodes)
        blocks = _blocks(num_devices, _explicit_actors(engine, num_devices) or max(1, min(num_devices, slots)))
        cpu = cpa if slots >= len(blocks) else cpa * max(slots, 1) / len(blocks)
        return PoolLayout(blocks, _floor4(cpu), 0.0)
    if gpu_nodes:
        planned = sum(max(1, round(n.gpus * engine.actors_per_gpu)) for n in gpu_nodes)
        if engine.gpus >= 0:
            planned = min(planned, max(1, math.ceil(want * engine.actors_per_gpu)))
        blocks = _blocks(num_devices, _explicit_actors(engine, num_devices) or min(num_devices, planned))
        total = sum(n.gpus for n in gpu_nodes)
        share = [max(1, math.ceil(len(blocks) * n.gpus / total)) for n in gpu_nodes]  # actors per node, rounded up
        cpu = min(cpa, *(n.cpus / k for n, k in zip(gpu_nodes, share, strict=True)))
        gpu = min(1.0, want / len(blocks), *(n.gpus / k for n, k in zip(gpu_nodes, share, strict=True)))
    else:  # no GPU node up yet: the ask itself is what scales the cluster
        planned = max(1, math.ceil(want * engine.actors_per_gpu))
        blocks = _blocks(num_devices, _explicit_actors(engine, num_devices) or min(num_devices, planned))
        cpu, gpu = cpa, min(1.0, want / len(blocks))
    if engine.gpus_per_actor > 0:
        gpu = engine.gpus_per_actor
    return PoolLayout(blocks, _floor4(cpu), _floor4(gpu))


def _explicit_actors(engine: EngineConfig, num_devices: int) -> int:
    if engine.devices_per_actor:
        return math.ceil(num_devices / engine.devices_per_actor)
    if engine.num_actors:
        return min(engine.num_actors, num_devices)
    return 0


def _blocks(num_devices: int, n_actors: int) -> tuple[range, ...]:
    per = math.ceil(num_devices / n_actors)
    return tuple(range(s, min(s + per, num_devices)) for s in range(0, num_devices, per))


def fits(layout: PoolLayout, nodes: Sequence[NodeResources]) -> bool:
    """Whether the nodes' totals can hold every actor's bundle (identical bundles: count per node)."""
    eps = 1e-9

    def holds(n: NodeResources) -> int:
        by_cpu = math.floor(n.cpus / layout.cpus_per_actor + eps) if layout.cpus_per_actor > 0 else len(layout.blocks)
        by_gpu = math.floor(n.gpus / layout.gpus_per_actor + eps) if layout.gpus_per_actor > 0 else by_cpu
        return min(by_cpu, by_gpu)

    return sum(holds(n) for n in nodes) >= len(layout.blocks)
