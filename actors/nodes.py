"""The cluster as Ray reports it, and the reservation of a federation's device actors on it (the
arithmetic of what fits where is :mod:`actors.placement`, which does not import Ray)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.connect import ClusterError
from actors.feasibility import Ask, Bundle, judge, known_cluster
from actors.placement import NodeResources, PoolLayout, fits
from lcfed import logs
from lcfed.data.cache import file_version


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
def _file_version(path: str) -> tuple[int, int, str] | None:
    try:
        return file_version(path)
    except OSError:
        return None


def nodes_without(path: str, version: tuple[int, int, str], node_ids: Sequence[str], timeout: float = 30.0
                  ) -> list[str]:
    """Those of ``node_ids`` that do not see ``path`` as the driver's ``version`` (size, mtime, hash). The driver's
    own node sees it; each other one is asked by a 0-CPU task (a worker's start: ~1 s), on whatever address it
    has: nodes on one machine may still see other files (containers, mount namespaces). A node that does not
    answer within ``timeout`` counts as not seeing it."""
    here = ray.get_runtime_context().get_node_id()
    ask = sorted(set(node_ids) - {here})
    refs = [_file_version.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(path)
            for n in ask]
    try:
        got = ray.get(refs, timeout=timeout)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        got = [None] * len(ask)
    return [n for n, v in zip(ask, got, strict=True) if v is None or tuple(v) != tuple(version)]


def node_address(node_id: str) -> str:
    """E.g. ``10.0.1.7 (3f2a1b0c)``: how a node is named to users."""
    addr = {n["NodeID"]: n["NodeManagerAddress"] for n in alive_nodes_info()}.get(node_id, "?")
    return f"{addr} ({node_id[:8]})"


def bundle_nodes(group: Any) -> list[str | None]:
    """The node of each bundle of the placement group ``group`` (None where Ray has not placed it)."""
    table = placement_group_table(group)
    where = table.get("bundles_to_node_id", {})
    return [where.get(i) for i in range(len(table.get("bundles", {})))]


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
    bundles; one that may (an autoscaler starting workers for the pending demand) gets ``timeout_s``, once
    its known node types (:func:`actors.feasibility.known_cluster`) are seen to hold them: which it waits for
    is said in one line, and an ask they never hold fails at once.
    """
    bundles = layout.bundles()
    ask = (f"{len(bundles)} device actor(s) x {{CPU: {layout.cpus_per_actor:g}"
           + (f", GPU: {layout.gpus_per_actor:g}" if layout.gpus_per_actor > 0 else "") + "}")
    fix = ("set engine.cpus_per_actor / engine.actors_per_gpu / engine.num_actors / engine.gpus to fit, "
           "or add nodes")
    if not can_grow and not fits(layout, alive_nodes()):
        raise PlacementError(f"cannot place the federation: asked for {ask}, more than the nodes hold; "
                             f"the cluster has {_describe_cluster()}; {fix}")
    cluster = known_cluster() if can_grow else None
    if cluster is not None:  # before waiting: an ask no node type holds would wait for nothing
        live = [Bundle(n.cpus, n.gpus) for n in alive_nodes()]
        verdict = judge(Ask("the federation", tuple(Bundle(b["CPU"], b.get("GPU", 0.0)) for b in bundles)), cluster,
                        live)
        if verdict.error is not None:
            raise PlacementError(verdict.error)
        if verdict.waits_for and logs.progress_shown():
            print(f"lcfed: {verdict.line}: waiting up to {timeout_s:g} s (engine.placement_timeout_s)", file=sys.stderr,
                  flush=True)
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
