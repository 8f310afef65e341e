"""Noticing within seconds that the cluster under a run is gone, instead of after Ray's minute.

When the raylet (or the GCS) under a run dies, actor calls already under way may still answer for a
while; then Ray marks the node dead after missed health checks (~15 s) and fails them as
``ActorDiedError`` ('its owner has died'), and whatever needs the GCS waits 60 s for it to come back
(after which Ray's C++ side ends the process). Nothing can be restarted without them, so every
``ray.get`` of the engine waits in slices of :data:`POLL_S` and checks the cluster in between
(:func:`get`), and an error from Ray is checked the same way before it is taken for a lost actor:

* the private Ray that ``lcfed run`` started: the driver watches the processes it started (its raylet
  and GCS server); a dead one is :class:`~lcfed.run.faults.ClusterLost` at once;
* a cluster the run attached to (``engine.address``, ``$RAY_ADDRESS``): its processes are not ours, so
  the driver probes its head's GCS and the raylet of the driver's own node (a TCP connect to their
  ports, :data:`PROBE_TIMEOUT_S`); unanswered for :data:`HEAD_GRACE_S` (a restart's blip passes), they
  are :class:`~lcfed.run.faults.ClusterLost`. Other nodes are not probed: a lost worker node's actors are
  restarted on the nodes left, as before.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray._private import ray_constants

from actors.connect import ClusterError, answers
from lcfed.errors import DataError
from lcfed.run.faults import ClusterLost

#: seconds a ``ray.get`` waits before the driver looks at the cluster again
POLL_S = 1.0

#: the private Ray's processes without which no task or actor runs (its dashboard, log monitor and
#: autoscaler monitor may die without harm)
ESSENTIAL = {ray_constants.PROCESS_TYPE_RAYLET: "raylet", ray_constants.PROCESS_TYPE_GCS_SERVER: "GCS server"}

#: seconds an attached cluster's head (its GCS, or the raylet this driver is connected to) may stay
#: unreachable before the run takes it for lost: a blip passes, and it is well within the 60 s after
#: which Ray ends a process that lost its GCS (``gcs_rpc_server_reconnect_timeout_s``)
HEAD_GRACE_S = 3.0

#: seconds one probe (a TCP connect) may take: a port nobody listens on refuses at once, a machine that is
#: gone does not answer
PROBE_TIMEOUT_S = 0.5


@dataclass
class _Head:
    """What a driver attached to a cluster probes: the GCS and the raylet of the node it runs on."""

    key: tuple[str, str]  # (GCS address, this node's id): another session is another watch
    gcs: str  # host:port
    raylet: str  # host:port of this node's raylet (its node manager); "" if Ray did not say
    on_head: bool | None  # whether this node is the head (None: not known)
    down_since: float | None = None  # monotonic time of the first failed probe in a row


_head: _Head | None = None
_lost: str | None = None  # what this process found lost (ClusterLost's ``what``); None while it stands


def lost_processes() -> list[str]:
    """The essential processes of the private Ray this process started that have died, e.g.
    ``["raylet (pid 4242, killed by signal 9)"]``; empty when they live, or when this process attached to a
    cluster it did not start (Ray lists no processes of its own then)."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not ray.is_initialized():
        return []
    lost = []
    for kind, process in node.dead_processes():
        if kind in ESSENTIAL:
            code = process.poll()
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            lost.append(f"{ESSENTIAL[kind]} (pid {process.pid}, {how})")
    return lost


def _attached_node() -> Any:
    """Ray's node object of this process when it attached to a cluster it did not start; else None
    (no Ray, Ray Client, or a private Ray, whose processes :func:`lost_processes` watches)."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not ray.is_initialized() or any(node.all_processes.values()):
        return None
    return node


def watch() -> None:
    """Start watching the cluster this process is connected to (the Ray engine calls it once Ray is up): an
    attached cluster's head is learned now, while the GCS answers (:func:`check_cluster` probes it)."""
    global _lost
    _lost = None
    _watched()


def _watched() -> _Head | None:
    """The attached cluster's head as this process watches it (learned on the first call per session)."""
    global _head
    node = _attached_node()
    if node is None:
        return None
    try:
        key = (str(node.gcs_address), str(node.node_id))
    except AssertionError:  # no GCS address: not connected after all
        return None
    if _head is None or _head.key != key:
        raylet = f"{node.node_ip_address}:{node.node_manager_port}" if node.node_manager_port else ""
        _head = _Head(key, key[0], raylet, _is_head(key[1]))
    return _head


def _is_head(node_id: str) -> bool | None:
    try:
        for n in ray.nodes():
            if n.get("NodeID") == node_id:
                return "node:__internal_head__" in n.get("Resources", {})
    except Exception:  # the GCS does not answer: the wording only is less precise
        return None
    return None


def _unreachable(head: _Head) -> list[str]:
    """What of ``head`` does not answer now: ``"gcs"``, ``"raylet"``."""
    down = [] if answers(head.gcs, PROBE_TIMEOUT_S) else ["gcs"]
    if head.raylet and not answers(head.raylet, PROBE_TIMEOUT_S):
        down.append("raylet")
    return down


def _describe(head: _Head, down: list[str]) -> str:
    """E.g. ``the head of the Ray cluster this run attached to is unreachable: its GCS at 127.0.0.1:6379 and
    its raylet at 127.0.0.1:41000 (this driver's node) have not answered for 3 s``."""
    waited = f"for {HEAD_GRACE_S:g} s"
    if "gcs" not in down and head.on_head is False:  # the raylet of a worker node the driver runs on
        return (f"the raylet at {head.raylet} of the node this driver runs on has not answered {waited}, and the "
                "driver cannot go on without it")
    parts = [f"its GCS at {head.gcs}"] if "gcs" in down else []
    if "raylet" in down:
        parts.append(f"its raylet at {head.raylet} (this driver's node)" if head.on_head
                     else f"the raylet at {head.raylet} of this driver's node")
    verb = "has" if len(parts) == 1 else "have"
    return f"the head of the Ray cluster this run attached to is unreachable: {' and '.join(parts)} {verb} not answered {waited}"


def head_lost(wait: bool = False) -> str | None:
    """What of an attached cluster's head has not answered for :data:`HEAD_GRACE_S` (a line for
    :class:`ClusterLost`), or None: it answers, part of it only just stopped (``wait``: probed again until it
    answers or the grace is over), or this process did not attach to a cluster."""
    head = _watched()
    if head is None:
        return None
    while True:
        down = _unreachable(head)
        now = time.monotonic()
        if not down:
            head.down_since = None
            return None
        if head.down_since is None:
            head.down_since = now
        if now - head.down_since >= HEAD_GRACE_S:
            return _describe(head, down)
        if not wait:
            return None
        time.sleep(min(0.25, head.down_since + HEAD_GRACE_S - now))


def check_cluster(wait: bool = False) -> None:
    """Raise :class:`ClusterLost` if the private Ray under this process has lost its raylet or GCS, or the
    head of the cluster it attached to has not answered for :data:`HEAD_GRACE_S`. ``wait``: a head that only
    just stopped answering is probed until it answers or the grace is over (after an error from Ray, which
    must not be taken for a lost actor while the head may be gone)."""
    global _lost
    if _lost is None:
        lost = lost_processes()
        if lost:
            _lost = f"the {' and '.join(lost)} of the private Ray this run started died"
        else:
            _lost = head_lost(wait)
    if _lost is not None:
        raise ClusterLost(_lost)


def cluster_lost() -> bool:
    """Whether this process found its cluster lost (:func:`check_cluster` raised): then nothing should wait
    for the cluster's GCS any more (e.g. to kill actors or remove a placement group)."""
    return _lost is not None


class ActorStartError(ClusterError):
    """An actor raised in its ``__init__``: what it raised, not a lost node (CLI: one line, exit 2)."""


#: the last line of a creation task's traceback: ``module.ErrorClass: message``
_RAISED = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.M)


def start_failure(exc: ray.exceptions.RayActorError) -> Exception | None:
    """What an actor that failed in its ``__init__`` raised, as this process's error (a :class:`DataError` as
    itself, anything else as :class:`ActorStartError`); None for an actor that died
    otherwise (a lost process or node, which a restart may cure)."""
    if not exc.actor_init_failed:
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    where = re.search(r"ray::(\w+)\.__init__", text)
    last = list(_RAISED.finditer(text))
    kind, why = (last[-1].group(1), last[-1].group(2).strip()) if last else ("", text.strip().splitlines()[-1])
    name = kind.rsplit(".", 1)[-1]
    if name == "DataError":
        return DataError(why)
    actor = where.group(1) if where else "an actor"
    return ActorStartError(f"{actor} could not start: {name + ': ' if name else ''}{why}")


def get(refs: Any) -> Any:
    """``ray.get(refs)``, checking between slices of :data:`POLL_S` that the cluster is still there
    (:func:`check_cluster`): a lost private Ray is :class:`ClusterLost` within about a second, an attached
    cluster's lost head within :data:`HEAD_GRACE_S` and a second. An actor that failed in its ``__init__`` is
    what it raised (:func:`start_failure`)."""
    while True:
        try:
            return ray.get(refs, timeout=POLL_S)
        except ray.exceptions.GetTimeoutError:
            check_cluster()
        except ray.exceptions.RayActorError as exc:
            failure = start_failure(exc)
            if failure is None:
                raise
            raise failure from None


def alive(actor: Any, timeout: float) -> bool:
    """Whether ``actor`` answers within ``timeout`` seconds (the cluster checked meanwhile)."""
    deadline = time.monotonic() + timeout
    ref = actor.__ray_ready__.remote()
    while True:
        try:
            ray.get(ref, timeout=min(POLL_S, max(deadline - time.monotonic(), 0.0)))
            return True
        except ray.exceptions.RayActorError:
            return False
        except ray.exceptions.GetTimeoutError:
            check_cluster()
            if time.monotonic() >= deadline:
                return False
