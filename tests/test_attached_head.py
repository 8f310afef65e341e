"""A run attached to a cluster whose head dies: one line, exit 3 and a FAILED MLflow run, before Ray's minute.

What the driver probes (the GCS and its own node's raylet, never a worker node's) and the grace a blip gets
are checked in-process against sockets of the test's own; the real thing against a real cluster:

The cluster is what a user gets from ``ray start --head`` (token auth on, its own ports and temp dir:
:class:`tests.raycluster.LocalCluster`); ``lcfed run --engine ray`` attaches to it through ``RAY_ADDRESS``
as a driver on the head, checkpointing every round. Once round 3 is logged the head's raylet is killed
(SIGKILL; ``ray start --block`` then takes the head's other processes down): the run must say what was
lost, the last checkpoint and the command that continues it, exit 3 and be FAILED with that line, well
within the 60 s after which Ray's C++ side ends a driver that lost its GCS (actors/liveness.py).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import ray

from actors import liveness
from lcfed.run.faults import ClusterLost
from tests.raycluster import LocalCluster

EXPERIMENT = "attached"


def _listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.fixture
def attached(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[socket.socket, socket.socket]]:
    """This process as a driver attached to a cluster (Ray's node object faked) whose GCS and raylet are
    two listening sockets of the test's; the head's grace is 0.5 s."""
    gcs, raylet = _listener(), _listener()
    node = SimpleNamespace(all_processes={}, dead_processes=list, gcs_address=f"127.0.0.1:{gcs.getsockname()[1]}",
                           node_id="n-head", node_ip_address="127.0.0.1", node_manager_port=raylet.getsockname()[1])
    monkeypatch.setattr(ray._private.worker, "_global_node", node, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "n-worker", "Resources": {"CPU": 1.0}},
                                               {"NodeID": "n-head", "Resources": {"node:__internal_head__": 1.0}}])
    monkeypatch.setattr(liveness, "HEAD_GRACE_S", 0.5)
    monkeypatch.setattr(liveness, "_head", None)
    liveness.watch()
    try:
        yield gcs, raylet
    finally:
        gcs.close()
        raylet.close()
        liveness._lost = None


def test_an_attached_driver_probes_the_gcs_and_its_own_raylet(attached, monkeypatch):
    gcs, raylet = attached
    head = liveness._watched()
    assert head is not None and head.on_head
    assert (head.gcs, head.raylet) == (f"127.0.0.1:{gcs.getsockname()[1]}", f"127.0.0.1:{raylet.getsockname()[1]}")
    t = time.monotonic()
    for _ in range(10):
        liveness.check_cluster(wait=True)
    assert time.monotonic() - t < 1 and not liveness.cluster_lost()
    # a private Ray's processes are watched as processes (lost_processes), not probed
    monkeypatch.setattr(ray._private.worker._global_node, "all_processes", {"raylet": [object()]})
    assert liveness._watched() is None


def test_a_head_that_stops_answering_is_lost_after_the_grace_and_a_blip_is_not(attached):
    gcs, raylet = attached
    port = gcs.getsockname()[1]
    gcs.close()
    liveness.check_cluster()  # only just stopped answering
    blip = _listener(port)  # back within the grace: forgotten
    try:
        time.sleep(0.6)
        liveness.check_cluster()
        assert liveness._head is not None and liveness._head.down_since is None
    finally:
        blip.close()
    t = time.monotonic()
    liveness.check_cluster()
    with pytest.raises(ClusterLost) as info:
        liveness.check_cluster(wait=True)  # after an error from Ray: probed until the grace is over
    assert 0.4 < time.monotonic() - t < 2
    assert info.value.what == (f"the head of the Ray cluster this run attached to is unreachable: its GCS at "
                               f"127.0.0.1:{port} has not answered for 0.5 s")
    assert liveness.cluster_lost()
    with pytest.raises(ClusterLost):  # from now on, at once
        liveness.check_cluster()
    raylet.close()
    liveness.watch()  # a new engine: watched afresh
    assert not liveness.cluster_lost()


def test_what_a_lost_head_or_driver_node_is_called():
    head = liveness._Head(("g:1", "n"), "10.0.0.1:6379", "10.0.0.2:4000", on_head=False)
    assert liveness._describe(head, ["raylet"]) == (
        "the raylet at 10.0.0.2:4000 of the node this driver runs on has not answered for 3 s, and the driver "
        "cannot go on without it")
    assert liveness._describe(head, ["gcs", "raylet"]) == (
        "the head of the Ray cluster this run attached to is unreachable: its GCS at 10.0.0.1:6379 and the raylet "
        "at 10.0.0.2:4000 of this driver's node have not answered for 3 s")
    head.on_head = True
    assert liveness._describe(head, ["raylet"]) == (
        "the head of the Ray cluster this run attached to is unreachable: its raylet at 10.0.0.2:4000 (this "
        "driver's node) has not answered for 3 s")


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A head of its own (1 CPU: the run's one device actor; no dashboard), stopped through its process group."""
    c = LocalCluster.start(1, [], dashboard=False)
    try:
        yield c
    finally:
        c.stop()


def _runs(uri: str) -> list[Any]:
    from lcfed.tracking.store import open_client

    client = open_client(uri)  # under the store's lock: the run may be creating the database now
    exp = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs([exp.experiment_id]) if exp else []


def _wait_for_checkpoint(proc: subprocess.Popen[str], ck: Path, uri: str, rounds: int, timeout: float = 180) -> None:
    """Until round ``rounds`` (from 1) is checkpointed and logged: round ``rounds + 1`` logged (a round's checkpoint
    is written before the next round plays). The store is asked, not the checkpoint: a reader of a checkpoint
    loses the race to the next round's write when rounds are quick, and one client serves every poll (opening
    the store each time costs a CPU-second)."""
    from lcfed.tracking.store import open_client

    db = Path(uri.removeprefix("sqlite:///"))
    client = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(Exception):  # the store half-made
            if client is None and db.is_file() and ck.is_file():
                client = open_client(uri)  # under the store's lock: the run may be creating the database now
            exp = client.get_experiment_by_name(EXPERIMENT) if client is not None else None
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if runs and len(client.get_metric_history(runs[0].info.run_id, "loss/train_loss")) > rounds:
                return
        time.sleep(0.5)
    _, err = proc.communicate(timeout=5) if proc.poll() is not None else ("", "")
    raise AssertionError(f"round {rounds} not checkpointed (exit {proc.poll()}): {err[-3000:]}")


@pytest.mark.timeout(300)
@pytest.mark.cluster
@pytest.mark.subprocess
def test_a_killed_head_is_one_line_exit_3_and_failed_with_the_reason_within_seconds(cluster: LocalCluster, tmp_path,
                                                                                   tracking_uri):
    from lcfed.run import checkpoint

    assert cluster.head is not None
    rounds = 500  # never all played: the head dies a few rounds after round 3
    uri = tracking_uri
    args = ["run", "--engine", "ray", "-q"]
    for s in ("data.dataset=digits", "data.num_devices=4", f"train.rounds={rounds}", "train.local_steps=1",
              "method.name=fedavg", "engine.torch_threads=1", "checkpoint.dir=ck", "checkpoint.every=1",
              "engine.num_actors=1",  # one device actor: a process less
              f"tracking.uri={uri}", f"tracking.experiment={EXPERIMENT}"):
        args += ["--set", s]
    env = cluster.client_env(RAY_ADDRESS=cluster.gcs, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tune_jobs", *args], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_for_checkpoint(proc, tmp_path / "ck" / "latest.pt", uri, 3)
        head = psutil.Process(cluster.head.proc.pid)
        raylets = [p for p in head.children(recursive=True) if p.name() == "raylet"]
        assert len(raylets) == 1, [(p.pid, p.name()) for p in head.children(recursive=True)]
        killed = time.monotonic()
        raylets[0].kill()
        _, err = proc.communicate(timeout=55)  # Ray's own GCS timeout ends the driver after 60 s
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    print(f"\nkill of the head's raylet -> exit {proc.returncode}: {took:.1f} s")
    assert proc.returncode == 3, err[-5000:]
    assert took < 30, (took, err[-3000:])
    assert "Traceback" not in err, err[-5000:]

    done = checkpoint.load(tmp_path / "ck" / "latest.pt").next_round
    assert 3 <= done < rounds
    last = err.strip().splitlines()[-1]
    reason = last.removeprefix("lcfed: run failed: ")
    assert reason != last, err[-3000:]
    gcs_host = cluster.gcs.rpartition(":")[0]
    lost = (f"the Ray cluster under this run was lost in round {done + 1} (the head of the Ray cluster this run "
            "attached to is unreachable: ")
    assert reason.startswith(lost), reason
    named = reason[len(lost):]
    assert named.startswith(f"its GCS at {cluster.gcs}") or named.startswith(
        f"its raylet at {gcs_host}:{cluster.head.manager_port} (this driver's node)"), reason
    assert f"); the last checkpoint holds rounds 1-{done} (ck/latest.pt): continue with `lcfed run " in reason, reason
    command = shlex.split(reason[reason.index("`") + 1: -1])
    assert reason.endswith("`") and command == ["lcfed", *args, "--resume"], reason

    (run,) = _runs(uri)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == reason, (run.info.status, run.data.tags)
