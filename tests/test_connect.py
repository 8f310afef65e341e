"""Ray connection rules (actors/connect.py) against one real, token-auth Ray head.

The head is what a user gets from ``ray start --head``: token auth on and Ray's address file
(``<ray temp dir>/ray_current_cluster``) pointing at it. It is the test process's shared head
(:func:`tests.conftest.shared_head`: these checks only attach to it, and count nothing but its CPUs); it uses its
own temp dir ``BASE/ray``, and the checks run with ``RAY_TMPDIR=BASE`` so that this is Ray's default temp dir for
them, exactly like ``/tmp/ray`` after a real ``ray start --head``. The checks run in two fresh ``python -c``
(ray.init state must not leak into pytest; two, not one per check: each costs an interpreter and Ray's start or
attach) without ``RAY_AUTH_MODE`` and with ``RAY_AUTH_TOKEN_PATH`` at the head's token. The head is stopped through its process group, never ``ray stop``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.raycluster import ROOT, LocalCluster, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_TMPDIR")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def head(shared_head: LocalCluster) -> LocalCluster:
    return shared_head


PRELUDE = """
import json, os, sys, time
from lcfed.config import EngineConfig
from actors.connect import ClusterError, ensure_ray
import ray
assert "RAY_AUTH_MODE" not in os.environ
def result(**kw):
    print("RESULT " + json.dumps(kw))
"""


def run_py(code: str, head: LocalCluster, timeout: float = 120.0) -> tuple[dict[str, Any], str]:
    """Run PRELUDE + code in a fresh interpreter with the head's token; (its RESULT, its stderr)."""
    env = {**_clean_env(), "RAY_AUTH_TOKEN_PATH": str(head.token), "RAY_TMPDIR": str(head.base), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):]), proc.stderr


@pytest.fixture(scope="module")
def private_ray(head: LocalCluster) -> dict[str, Any]:
    """One fresh interpreter (each costs a private Ray's start): first with a stale address file (what a ``ray
    start --head`` stopped by killing its process group leaves: a GCS that is gone) as Ray's default, where a plain
    ``ray.init(num_cpus=...)`` follows it and the suite's :func:`tests.conftest.start_test_ray` starts a private Ray;
    then with the head's live address file, ``engine.address: null``: what ensure_ray did, and every TCP socket
    its Ray listens on (this process and all it spawned)."""
    assert (head.base / "ray" / "ray_current_cluster").read_text().strip() == head.gcs
    stale = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's unix sockets live under it
    try:
        (stale / "ray").mkdir()
        dead = f"127.0.0.1:{free_port()}"
        (stale / "ray" / "ray_current_cluster").write_text(dead)
        info, _ = run_py(f"""
            import psutil
            from tests.conftest import start_test_ray
            os.environ["RAY_TMPDIR"] = {str(stale)!r}  # Ray reads it at each call
            try:
                ray.init(num_cpus=1, include_dashboard=False)
                plain = "attached"
            except ValueError as exc:
                plain = str(exc)
            start_test_ray(num_cpus=1)  # 1, not its 2: a CPU is an idle worker Ray starts
            fixture = [ray.get_runtime_context().gcs_address, ray.cluster_resources().get("CPU")]
            ray.shutdown()
            os.environ["RAY_TMPDIR"] = {str(head.base)!r}
            t = time.monotonic()
            started = ensure_ray(EngineConfig(kind="ray", num_cpus=1))
            elapsed = time.monotonic() - t
            gcs = ray.get_runtime_context().gcs_address
            ray.get(ray.remote(lambda: 1).remote())  # a worker is up and listening too
            me = psutil.Process()
            listening = [[p.name(), c.laddr.ip, c.laddr.port] for p in [me, *me.children(recursive=True)]
                         for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            cpus = ray.cluster_resources().get("CPU")
            ray.shutdown()
            result(started=started, gcs=gcs, cpus=cpus, listening=listening, elapsed=elapsed, plain=plain,
                   fixture=fixture)
        """, head, timeout=180)
    finally:
        shutil.rmtree(stale, ignore_errors=True)
    print(f"\nprivate Ray started in {info['elapsed']:.1f} s")
    return {**info, "dead": dead}


def test_null_address_starts_a_private_ray_despite_the_address_file(head, private_ray):
    assert private_ray["started"] is True
    assert private_ray["gcs"] != head.gcs and private_ray["cpus"] == 1


def test_private_ray_listens_on_loopback_only(private_ray):
    names = {name for name, _, _ in private_ray["listening"]}
    assert {"gcs_server", "raylet"} <= names, private_ray["listening"]

    def loopback(ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        mapped = getattr(addr, "ipv4_mapped", None)
        return (mapped or addr).is_loopback

    assert [x for x in private_ray["listening"] if not loopback(x[1])] == []


def test_a_stale_address_file_is_ignored_by_the_suite_and_the_product(private_ray):
    """A plain ``ray.init(num_cpus=...)`` follows a stale address file and refuses our resources; the suite's
    fixtures (:func:`tests.conftest.start_test_ray`) start a private Ray instead. The product's ``engine.address:
    null`` never reads the file (``address="local"``): checked above against the head's live one, which a plain
    init would attach to."""
    info = private_ray
    assert "num_cpus" in info["plain"], info  # the file is live: a plain init follows it
    assert info["fixture"][0] != info["dead"] and info["fixture"][1] == 1, info


@pytest.fixture(scope="module")
def attached(head: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """The attach rules in one fresh interpreter (one process, not one per rule): an unreachable address, a
    rejected token (both refused before ``ray.init``), then the head attached, detached and attached again by
    engine.address host:port, ``auto`` (Ray's address file) and $RAY_ADDRESS (as inside a Ray job); while
    attached, which actor options the head's workers need. (its RESULT, its stderr)"""
    wrong = tmp_path_factory.mktemp("token") / "token"
    wrong.write_text("not-the-cluster-token")
    unreachable = f"127.0.0.1:{free_port()}"
    return run_py(f"""
        from actors.hosts import Hosts
        from actors.nodes import workers_start_with
        from lcfed import numerics
        from lcfed.config import from_dict
        out = {{}}
        t = time.monotonic()
        try:
            ensure_ray(EngineConfig(kind="ray", address={unreachable!r}))
            out["unreachable"] = dict(error=None)
        except ClusterError as exc:
            out["unreachable"] = dict(error=str(exc), elapsed=time.monotonic() - t, initialized=ray.is_initialized(),
                                      address={unreachable!r})
        right = os.environ["RAY_AUTH_TOKEN_PATH"]
        os.environ["RAY_AUTH_TOKEN_PATH"] = {str(wrong)!r}
        try:
            ensure_ray(EngineConfig(kind="ray", address={head.gcs!r}))
            out["token"] = dict(error=None)
        except ClusterError as exc:
            out["token"] = dict(error=str(exc), initialized=ray.is_initialized())
        os.environ["RAY_AUTH_TOKEN_PATH"] = right
        for how, address in [("address", {head.gcs!r}), ("auto", "auto"), ("RAY_ADDRESS", None)]:
            if how == "RAY_ADDRESS":
                os.environ["RAY_ADDRESS"] = {head.gcs!r}
            t = time.monotonic()
            started = ensure_ray(EngineConfig(kind="ray", address=address))
            out[how] = dict(started=started, cpus=ray.cluster_resources().get("CPU"),
                            gcs=ray.get_runtime_context().gcs_address, elapsed=time.monotonic() - t)
            if how != "RAY_ADDRESS":
                ray.shutdown()
        env = numerics.worker_env("portable")
        cfg = from_dict({{"engine": {{"kind": "ray"}}}})
        out["profile"] = dict(same=workers_start_with(env),
                              other=workers_start_with({{**env, "OPENBLAS_CORETYPE": "Sandybridge"}}),
                              options=Hosts.actor_options(cfg, attached=True),
                              private=Hosts.actor_options(cfg, attached=False))
        result(**out)
    """, head)


@pytest.mark.parametrize("how", ["address", "auto", "RAY_ADDRESS"])
def test_explicit_address_attaches_with_the_token_file(head, attached, how):
    """engine.address host:port, ``auto`` (Ray's address file), or $RAY_ADDRESS (as inside a Ray job)."""
    info, stderr = attached
    info = info[how]
    print(f"\nattached ({how}) in {info['elapsed']:.2f} s")
    assert info["started"] is False and info["cpus"] == 2 and info["gcs"] == head.gcs
    assert "InvalidAuthToken" not in stderr and "Traceback" not in stderr


def test_unreachable_address_is_a_cluster_error_naming_it(attached):
    info = attached[0]["unreachable"]
    print(f"\nunreachable address failed in {info.get('elapsed', 0):.3f} s")
    assert info["error"] and info["address"] in info["error"] and not info["initialized"]


def test_rejected_token_is_a_cluster_error(head, attached):
    info, stderr = attached
    info = info["token"]
    assert info["error"] and head.gcs in info["error"] and "rejected the auth token" in info["error"]
    assert not info["initialized"] and "InvalidAuthToken" not in stderr


def test_actors_skip_the_runtime_env_on_a_cluster_whose_workers_start_with_the_profile(attached):
    """The head here was started from this suite's environment, which ``import lcfed`` pinned to the portable
    profile (as ``lcfed head`` starts its head): its workers start with the profile's variables (read from
    /proc, not ``os.environ``, which importing lcfed changes), so actors need no runtime env (Ray would start
    fresh workers for one). A cluster whose workers start otherwise keeps it."""
    assert attached[0]["profile"] == {"same": True, "other": False, "options": {}, "private": {}}
