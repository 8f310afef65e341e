"""Noticing within a second that the private Ray under a run is gone, instead of after Ray's minute.

When the raylet (or the GCS) of the private Ray that ``lcfed run`` started dies, actor calls already
under way may still answer for a while; then Ray marks the node dead after missed health checks (~15 s)
and fails them as ``ActorDiedError`` ('its owner has died'), and whatever needs the GCS waits 60 s for it
to come back. Nothing can be restarted on a node without its raylet, so the driver watches the
processes it started: every ``ray.get`` of the engine waits in slices of :data:`POLL_S` and checks them
in between (:func:`get`), and an error from Ray is checked the same way before it is taken for a lost
actor. An attached cluster's processes are not ours to watch; its lost actors are restarted as before.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray._private import ray_constants

from lcfed.faults import ClusterLost

#: seconds a ``ray.get`` waits before the driver looks at the private Ray's processes again
POLL_S = 1.0

#: the private Ray's processes without which no task or actor runs (its dashboard, log monitor and
#: autoscaler monitor may die without harm)
ESSENTIAL = {ray_constants.PROCESS_TYPE_RAYLET: "raylet", ray_constants.PROCESS_TYPE_GCS_SERVER: "GCS server"}


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


def check_cluster() -> None:
    """Raise :class:`ClusterLost` if the private Ray under this process has lost its raylet or GCS."""
    lost = lost_processes()
    if lost:
        raise ClusterLost(f"the {' and '.join(lost)} of the private Ray this run started died")


def get(refs: Any) -> Any:
    """``ray.get(refs)``, checking between slices of :data:`POLL_S` that the private Ray still has its
    raylet and GCS (:func:`check_cluster`): a lost cluster is :class:`ClusterLost` within about a second."""
    while True:
        try:
            return ray.get(refs, timeout=POLL_S)
        except ray.exceptions.GetTimeoutError:
            check_cluster()


def alive(actor: Any, timeout: float) -> bool:
    """Whether ``actor`` answers within ``timeout`` seconds (the private Ray checked meanwhile)."""
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
