"""Whether a run's resource ask can ever be placed: its bundles against the live nodes and the node types an
autoscaler may add (a cluster launcher config's ``available_node_types``), before anything waits.

Ray's autoscaler only logs an ask that no node type can hold, and the ask then waits forever (design, section
12). This module is the arithmetic, without Ray: :func:`judge` says whether the ask fits the live nodes now,
fits once the autoscaler adds nodes of named types, or never fits. :func:`load_cluster` reads the node types
from a ``cluster.yaml``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: where the cluster launcher leaves its config on the head (read when a run attaches there)
BOOTSTRAP = "~/ray_bootstrap_config.yaml"

#: the environment variable through which ``--cluster`` reaches the engine, Tune trials and job drivers
CLUSTER_ENV = "LCFED_CLUSTER"

_EPS = 1e-9


@dataclass(frozen=True)
class Bundle:
    """One placement-group bundle (or one node's whole resources): CPUs and GPUs."""

    cpus: float
    gpus: float = 0.0

    def within(self, other: Bundle) -> bool:
        return self.cpus <= other.cpus + _EPS and self.gpus <= other.gpus + _EPS

    def __str__(self) -> str:
        return f"{{CPU: {self.cpus:g}" + (f", GPU: {self.gpus:g}" if self.gpus else "") + "}"


@dataclass(frozen=True)
class NodeType:
    """A kind of node the cluster may have: its resources and at most how many the autoscaler runs
    (``max_workers``; the head type: 0, it is always there)."""

    name: str
    size: Bundle
    max_workers: int


@dataclass(frozen=True)
class Cluster:
    """What a cluster can ever hold: its head's type, the worker types, and ``max_workers`` (all types)."""

    head: NodeType
    workers: tuple[NodeType, ...]
    max_workers: int
    source: str = ""  # the file it was read from

    def largest(self) -> NodeType:
        return max((self.head, *self.workers), key=lambda t: (t.size.gpus, t.size.cpus))


@dataclass(frozen=True)
class Ask:
    """What one run (a federation, or one trial of a sweep) asks for at once: ``bundles``, placed together
    (``strategy`` as Ray's placement groups: PACK and SPREAD may span nodes, STRICT_PACK may not)."""

    what: str
    bundles: tuple[Bundle, ...]
    strategy: str = "PACK"


@dataclass(frozen=True)
class Verdict:
    """:func:`judge`'s answer: ``error`` (never fits: the one line to show), else the node types the autoscaler
    must add first (``waits_for``: empty when the live nodes hold it), with ``line`` saying so."""

    error: str | None = None
    waits_for: tuple[str, ...] = ()
    line: str = ""

    @property
    def fits_now(self) -> bool:
        return self.error is None and not self.waits_for


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    """The node types of a cluster launcher config (``cluster.yaml``). ValueError where it has none, or a type
    does not state its ``resources`` (an autoscaler that infers them from the instance type is not judged)."""
    import yaml

    file = Path(path).expanduser()
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{file}: cannot be read as a cluster config ({exc})") from None
    return cluster_from(doc if isinstance(doc, Mapping) else {}, str(file))


def known_cluster() -> Cluster | None:
    """The cluster ``$LCFED_CLUSTER`` names (``--cluster``), or the launcher's config on a head it left; None
    where neither is readable (nothing is judged then)."""
    for found in (os.environ.get(CLUSTER_ENV, ""), os.path.expanduser(BOOTSTRAP)):
        if found and os.path.isfile(found):
            try:
                return load_cluster(found)
            except ValueError:
                continue
    return None


def cluster_from(doc: Mapping[str, Any], source: str = "") -> Cluster:
    """:func:`load_cluster` on the parsed config."""
    types = doc.get("available_node_types")
    head_name = doc.get("head_node_type")
    if not isinstance(types, Mapping) or head_name not in types:
        raise ValueError(f"{source or 'the cluster config'}: no available_node_types with its head_node_type")
    total = int(doc.get("max_workers", 2))  # Ray's default
    found = []
    for name, spec in types.items():
        res = (spec or {}).get("resources")
        if not isinstance(res, Mapping) or "CPU" not in res:
            raise ValueError(f"{source or 'the cluster config'}: node type {name!r} states no resources "
                             "(resources: {CPU: ..., GPU: ...}), so what it holds is not known here")
        cap = 0 if name == head_name else int(spec.get("max_workers", total))
        found.append(NodeType(str(name), Bundle(float(res.get("CPU", 0)), float(res.get("GPU", 0))), cap))
    head = next(t for t in found if t.name == head_name)
    return Cluster(head, tuple(t for t in found if t.name != head_name), total, source)


def judge(ask: Ask, cluster: Cluster, live: Sequence[Bundle] = ()) -> Verdict:
    """Whether ``ask`` fits the ``live`` nodes (default: the head alone, as before a cluster starts), or
    once the autoscaler adds worker nodes, or never: each bundle must fit a node type, and all of them the
    cluster at its largest (``max_workers`` in all, each type's own cap)."""
    given, live = list(live), list(live) or [cluster.head.size]
    kinds = [("a live node", n) for n in live] + [(t.name, t.size) for t in cluster.workers if t.max_workers > 0]
    for b in dict.fromkeys(ask.bundles):
        if not any(b.within(size) for _, size in kinds):
            big = cluster.largest()
            return Verdict(error=f"{ask.what} asks for a bundle {b} that no node can hold, now or after scaling: "
                                 f"the largest node type is {big.name} {big.size} ({cluster.source or 'cluster'}); "
                                 "ask for less per actor or trial (engine.cpus_per_actor, engine.gpus_per_actor, "
                                 "--gpus-per-trial) or add a larger node type")
    added = _pack(ask, cluster, live)
    if added is None:
        return Verdict(error=f"{ask.what} asks for {summary(ask)}, more than the cluster holds at its largest "
                             f"({_capacity(cluster, given)}; {cluster.source or 'cluster'}): ask for less "
                             "(engine.num_actors, --gpus-per-trial) or raise max_workers")
    if not added:
        return Verdict()
    counts = {name: added.count(name) for name in dict.fromkeys(added)}
    types = ", ".join(f"{k} x {name} {_size(cluster, name)}" for name, k in counts.items())
    return Verdict(waits_for=tuple(counts),
                   line=f"{ask.what} ({summary(ask)}) fits only once the autoscaler adds {types}")


def in_flight(ask: Ask, cluster: Cluster, live: Sequence[Bundle] = (), cap: int = 1000) -> int:
    """How many copies of ``ask`` (trials) the cluster at its largest holds at once."""
    n = 0
    while n < cap and _pack(Ask(ask.what, ask.bundles * (n + 1), ask.strategy), cluster, live or ()) is not None:
        n += 1
    return n


def _pack(ask: Ask, cluster: Cluster, live: Sequence[Bundle]) -> list[str] | None:
    """First fit, largest bundles first, onto the live nodes and then onto new nodes of the smallest worker type
    that holds the bundle: the names of the types added, or None where the cluster at its largest cannot hold
    them. STRICT_PACK: all bundles on one node."""
    live = list(live) or [cluster.head.size]
    if ask.strategy == "STRICT_PACK":
        one = Bundle(sum(b.cpus for b in ask.bundles), sum(b.gpus for b in ask.bundles))
        if any(one.within(n) for n in live):
            return []
        fit = [t for t in cluster.workers if t.max_workers > 0 and one.within(t.size)]
        return [min(fit, key=lambda t: (t.size.gpus, t.size.cpus)).name] if fit and cluster.max_workers > 0 else None
    free = [[n.cpus, n.gpus] for n in live]
    added: list[str] = []
    budget = max(0, cluster.max_workers - (len(live) - 1))  # the live workers count against max_workers
    for b in sorted(ask.bundles, key=lambda b: (b.gpus, b.cpus), reverse=True):
        spot = next((f for f in free if b.cpus <= f[0] + _EPS and b.gpus <= f[1] + _EPS), None)
        if spot is None:
            fit = [t for t in cluster.workers if added.count(t.name) < t.max_workers and b.within(t.size)]
            if not fit or len(added) >= budget:
                return None
            kind = min(fit, key=lambda t: (t.size.gpus, t.size.cpus))
            added.append(kind.name)
            spot = [kind.size.cpus, kind.size.gpus]
            free.append(spot)
        spot[0] -= b.cpus
        spot[1] -= b.gpus
    return added


def summary(ask: Ask) -> str:
    """E.g. ``1 x {CPU: 0.5} + 2 x {CPU: 1, GPU: 0.5}``."""
    counts = {str(b): ask.bundles.count(b) for b in dict.fromkeys(ask.bundles)}
    return " + ".join(f"{k} x {b}" for b, k in counts.items())


def _size(cluster: Cluster, name: str) -> str:
    return str(next(t.size for t in cluster.workers if t.name == name))


def _capacity(cluster: Cluster, live: Sequence[Bundle]) -> str:
    workers = ", ".join(f"{t.name} {t.size} x {t.max_workers}" for t in cluster.workers)
    now = (f"{len(live)} live node(s) CPU {math.fsum(n.cpus for n in live):g}, GPU {math.fsum(n.gpus for n in live):g}"
           if live else f"the head {cluster.head.size}")
    return f"{now}; at most {cluster.max_workers} workers of {workers or 'no worker type'}"
