"""The cluster as Ray reports it, and the reservation of a federation's device actors on it (the
arithmetic of what fits where is :mod:`actors.placement`, which does not import Ray)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.connect import ClusterError
from actors.placement import NodeResources, PoolLayout, fits
from lcfed.data.cache import size_and_mtime


def alive_nodes_info() -> list[dict[str, Any]]:
    """Ray's record of each alive node (``ray.nodes()``: id, address, resources)."""
    return [n for n in ray.nodes() if n.get("Alive")]


def head_node_id() -> str | None:
    """The head node's id (Ray gives the head the resource ``node:__internal_head__``)."""
    for n in alive_nodes_info():
        if "node:__internal_head__" in n.get("Resources", {}):
            return str(n["NodeID"])
    return None


@ray.remote(num_cpus=0)
def _start_env(keys: list[str]) -> dict[str, str] | None:
    """``keys`` of this worker's environment as it started (importing lcfed changes ``os.environ`` afterwards);
    None where the start's environment cannot be read."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = (item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            start = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    except OSError:
        return None
    return {k: start[k] for k in keys if k in start}


def workers_start_with(env: Mapping[str, str], timeout: float = 30.0) -> bool:
    """Whether the workers of every alive node start with ``env`` (nodes started from lcfed's environment, as
    ``lcfed head`` starts its head, carry its numerics profile): one worker per node is asked."""
    if not env:
        return True
    keys = sorted(env)
    refs = [_start_env.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(keys)
            for n in alive_nodes_info()]
    try:
        got = ray.get(refs, timeout=timeout)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return False
    return bool(got) and all(g == dict(env) for g in got)


@ray.remote(num_cpus=0)
def _file_version(path: str) -> tuple[int, int] | None:
    try:
        return size_and_mtime(path)
    except OSError:
        return None


def nodes_missing(path: str, stamp: tuple[int, int], nodes: Sequence[Mapping[str, Any]] | None = None,
                  timeout: float = 30.0) -> list[str]:
    """The ``nodes`` (default: the alive ones at another address than this driver's, which shares its files) that
    do not see ``path`` as the version ``stamp`` (size, mtime), by address. Each is asked by a 0-CPU task (a
    worker's start: ~1 s); one that does not answer within ``timeout`` counts as not seeing it."""
    if nodes is None:
        here = ray.util.get_node_ip_address()
        nodes = [n for n in alive_nodes_info() if n["NodeManagerAddress"] != here]
    refs = [_file_version.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(path)
            for n in nodes]
    try:
        got = ray.get(refs, timeout=timeout)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        got = [None] * len(nodes)
    return [str(n["NodeManagerAddress"]) for n, v in zip(nodes, got, strict=True) if v is None or tuple(v) != tuple(stamp)]


class PlacementError(ClusterError):
    """The cluster cannot place the federation's actors: what was asked, what the cluster has."""


def alive_nodes() -> list[NodeResources]:
    return [NodeResources(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0))
            for n in alive_nodes_info()]


def _describe_cluster() -> str:
    nodes = alive_nodes_info()
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
