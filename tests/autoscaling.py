"""Ray's autoscaler on this machine, for tests and benchmarks: a head on the fake multi-node provider whose node
types are ``cluster.yaml``'s (:func:`actors.fake_autoscaler.fake_autoscaling_config`), and what it does over time.

The head is a :class:`tests.raycluster.LocalCluster` head (its own ports, temp dir and token; stopped by its
process group and its token's marker, never ``ray stop``): ``RAY_FAKE_CLUSTER=1 ray start --head
--autoscaling-config=...``, with the head type's resources. Its monitor adds ``gpu_worker`` nodes (raylets with
``{CPU: 4, GPU: 1}``, logical GPUs) when demand asks for GPUs and removes them once idle. Ray's own
``ray.cluster_utils.AutoscalingCluster`` is not used: it runs ``ray stop --force`` (every Ray on the machine)
and reads the fake provider's ``example.yaml``, which Ray 2.60's wheel lacks. The workers share the head's temp
directory (the provider gives them none), so a job shipped with a working directory loses its driver's current
directory when a worker re-unpacks it there: submit jobs without one (docs/cluster.md).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from actors.fake_autoscaler import fake_autoscaling_config
from tests.raycluster import ROOT, LocalCluster

#: the fake provider's head node id (``FAKE_HEAD_NODE_ID``); its workers are ...00001, ...00002, ...
FAKE_HEAD_ID = "f" * 51 + "00000"


def start(idle_timeout_minutes: float, object_store_mb: int = 100, timeout: float = 180.0) -> LocalCluster:
    """A head with no worker, autoscaling ``cluster.yaml``'s node types; workers idle ``idle_timeout_minutes``
    are removed. Each worker's object store: ``object_store_mb``."""
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    return LocalCluster.start(0, [], timeout=timeout, object_store_mb=object_store_mb, autoscaling=lambda gcs: (
        fake_autoscaling_config(launcher, gcs, idle_timeout_minutes=idle_timeout_minutes,
                                object_store_memory=object_store_mb * 2**20)))


def listed(cluster: LocalCluster, kind: str, detail: bool = False) -> list[dict[str, Any]]:
    """Ray's state API through the head's dashboard: ``nodes``, ``placement_groups``, ``actors`` ... (``detail``:
    with the detail columns, e.g. a node's ``start_time_ms`` and ``end_time_ms``)."""
    query = "limit=10000" + ("&detail=true" if detail else "")
    request = urllib.request.Request(f"{cluster.dashboard}/api/v0/{kind}?{query}", headers=cluster._auth())
    with urllib.request.urlopen(request, timeout=20) as resp:
        return list(json.load(resp)["data"]["result"]["result"])


def workers(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The alive nodes other than the head."""
    return [n for n in listed(cluster, "nodes") if n.get("state") == "ALIVE" and n["node_id"] != FAKE_HEAD_ID]


def worker_times(cluster: LocalCluster) -> dict[str, tuple[float, float | None]]:
    """Every worker node the cluster had, alive or gone: its raylet's start and end (seconds since the epoch, as
    ``time.time()``; end None while alive), as Ray recorded them."""
    return {n["node_id"]: (n["start_time_ms"] / 1000, n["end_time_ms"] / 1000 if n.get("end_time_ms") else None)
            for n in listed(cluster, "nodes", detail=True) if n["node_id"] != FAKE_HEAD_ID}


def trial_groups(cluster: LocalCluster) -> tuple[int, int]:
    """(placed, pending) placement groups: each Tune trial has one (its driver's bundle and its device actors'),
    placed while the trial runs, pending while it waits for a node."""
    states = [g.get("state") for g in listed(cluster, "placement_groups")]
    return states.count("CREATED"), states.count("PENDING")


def monitor_log(cluster: LocalCluster) -> str:
    """The autoscaler's log (``Adding ... node(s) of type ...``, ``Terminating the node ... (idle)``)."""
    sessions = [d for d in (cluster.base / "ray").glob("session_*") if not d.is_symlink()]  # not session_latest
    return "\n".join(p.read_text(errors="replace") for d in sessions for p in d.glob("logs/monitor.log"))


@dataclass
class Timeline:
    """Samples, every ``every`` seconds from :meth:`begin` until :meth:`end`: (seconds, workers, trials placed,
    trials pending), and the worker node ids seen."""

    cluster: LocalCluster
    every: float = 1.0
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    seen: dict[str, dict[str, float]] = field(default_factory=dict)  # worker node id -> its resources
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    t0: float = 0.0

    def begin(self) -> Timeline:
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                up = workers(self.cluster)
                placed, pending = trial_groups(self.cluster)
            except (OSError, ValueError, KeyError) as exc:  # the dashboard busy: the next sample
                self.errors.append(repr(exc))
            else:
                for n in up:
                    self.seen.setdefault(n["node_id"], dict(n.get("resources_total", {})))
                self.samples.append((time.monotonic() - self.t0, len(up), placed, pending))
            self._stop.wait(self.every)

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def first(self, predicate: Any) -> float | None:
        """Seconds until the first sample where ``predicate(workers, placed, pending)`` holds."""
        return next((t for t, w, p, q in self.samples if predicate(w, p, q)), None)


def wait_for_workers(cluster: LocalCluster, count: int, timeout: float) -> float:
    """Seconds until exactly ``count`` workers are alive; RuntimeError after ``timeout``."""
    t0 = time.monotonic()
    while True:
        try:
            if len(workers(cluster)) == count:
                return time.monotonic() - t0
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"not {count} workers after {timeout:.0f} s:\n{monitor_log(cluster)[-3000:]}")
        time.sleep(1)


def write(path: Path, doc: Any) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path
