"""Ray connection rules (actors/connect.py) against one real, token-auth Ray head.

The head is what a user gets from ``ray start --head``: token auth on and Ray's address file
(``<ray temp dir>/ray_current_cluster``) pointing at it. It is the test process's shared head
(:func:`tests.conftest.shared_head`: these checks only attach to it, and count nothing but its CPUs); it uses its
own temp dir ``BASE/ray``, and the checks run with ``RAY_TMPDIR=BASE`` so that this is Ray's default temp dir for
them, exactly like ``/tmp/ray`` after a real ``ray start --head``. Each check runs in a fresh ``python -c``
(ray.init state must not leak into pytest) without ``RAY_AUTH_MODE`` and with ``RAY_AUTH_TOKEN_PATH`` at the
head's token. The head is stopped through its process group, never ``ray stop``.
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
    """``engine.address: null`` with the head's address file in place: what ensure_ray did, and
    every TCP socket its Ray listens on (this process and all it spawned)."""
    assert (head.base / "ray" / "ray_current_cluster").read_text().strip() == head.gcs
    info, _ = run_py("""
        import psutil
        t = time.monotonic()
        started = ensure_ray(EngineConfig(kind="ray", num_cpus=2))
        elapsed = time.monotonic() - t
        gcs = ray.get_runtime_context().gcs_address
        ray.get(ray.remote(lambda: 1).remote())  # a worker is up and listening too
        me = psutil.Process()
        listening = [[p.name(), c.laddr.ip, c.laddr.port] for p in [me, *me.children(recursive=True)]
                     for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        cpus = ray.cluster_resources().get("CPU")
        ray.shutdown()
        result(started=started, gcs=gcs, cpus=cpus, listening=listening, elapsed=elapsed)
    """, head)
    print(f"\nprivate Ray started in {info['elapsed']:.1f} s")
    return info


def test_null_address_starts_a_private_ray_despite_the_address_file(head, private_ray):
    assert private_ray["started"] is True
    assert private_ray["gcs"] != head.gcs and private_ray["cpus"] == 2


def test_private_ray_listens_on_loopback_only(private_ray):
    names = {name for name, _, _ in private_ray["listening"]}
    assert {"gcs_server", "raylet"} <= names, private_ray["listening"]

    def loopback(ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        mapped = getattr(addr, "ipv4_mapped", None)
        return (mapped or addr).is_loopback

    assert [x for x in private_ray["listening"] if not loopback(x[1])] == []


@pytest.mark.parametrize("how", ["address", "auto", "RAY_ADDRESS"])
def test_explicit_address_attaches_with_the_token_file(head, how):
    """engine.address host:port, ``auto`` (Ray's address file), or $RAY_ADDRESS (as inside a Ray job)."""
    address = {"address": head.gcs, "auto": "auto", "RAY_ADDRESS": None}[how]
    env = f"os.environ['RAY_ADDRESS'] = {head.gcs!r}" if how == "RAY_ADDRESS" else ""
    info, stderr = run_py(f"""
        {env}
        t = time.monotonic()
        started = ensure_ray(EngineConfig(kind="ray", address={address!r}))
        result(started=started, cpus=ray.cluster_resources().get("CPU"), gcs=ray.get_runtime_context().gcs_address,
               elapsed=time.monotonic() - t)
    """, head)
    print(f"\nattached ({how}) in {info['elapsed']:.2f} s")
    assert info["started"] is False and info["cpus"] == 2 and info["gcs"] == head.gcs
    assert "InvalidAuthToken" not in stderr and "Traceback" not in stderr


def test_unreachable_address_is_a_cluster_error_naming_it(head):
    address = f"127.0.0.1:{free_port()}"
    info, _ = run_py(f"""
        t = time.monotonic()
        try:
            ensure_ray(EngineConfig(kind="ray", address={address!r}))
            result(error=None)
        except ClusterError as exc:
            result(error=str(exc), elapsed=time.monotonic() - t, initialized=ray.is_initialized())
    """, head)
    print(f"\nunreachable address failed in {info.get('elapsed', 0):.3f} s")
    assert info["error"] and address in info["error"] and not info["initialized"]


def test_rejected_token_is_a_cluster_error(head, tmp_path):
    wrong = tmp_path / "token"
    wrong.write_text("not-the-cluster-token")
    info, stderr = run_py(f"""
        os.environ["RAY_AUTH_TOKEN_PATH"] = {str(wrong)!r}
        try:
            ensure_ray(EngineConfig(kind="ray", address={head.gcs!r}))
            result(error=None)
        except ClusterError as exc:
            result(error=str(exc))
    """, head)
    assert info["error"] and head.gcs in info["error"] and "rejected the auth token" in info["error"]
    assert "InvalidAuthToken" not in stderr


def test_a_stale_address_file_is_ignored_by_the_suite_and_the_product():
    """What a ``ray start --head`` stopped by killing its process group leaves: Ray's address file naming
    a GCS that is gone. A plain ``ray.init(num_cpus=...)`` follows it and refuses our resources; the
    suite's fixtures (:func:`tests.conftest.start_test_ray`) and the product (``engine.address: null``)
    start a private Ray instead."""
    base = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's unix sockets live under it
    try:
        (base / "ray").mkdir()
        dead = f"127.0.0.1:{free_port()}"
        (base / "ray" / "ray_current_cluster").write_text(dead)
        code = PRELUDE + textwrap.dedent("""
            from tests.conftest import start_test_ray
            try:
                ray.init(num_cpus=1, include_dashboard=False)
                plain = "attached"
            except ValueError as exc:
                plain = str(exc)
            start_test_ray()
            fixture = [ray.get_runtime_context().gcs_address, ray.cluster_resources().get("CPU")]
            ray.shutdown()
            started = ensure_ray(EngineConfig(kind="ray", num_cpus=1))
            product = [ray.get_runtime_context().gcs_address, ray.cluster_resources().get("CPU")]
            ray.shutdown()
            result(plain=plain, fixture=fixture, product=product, started=started)
        """)
        env = {**_clean_env(), "RAY_TMPDIR": str(base), "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=180)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        info = json.loads(lines[-1][len("RESULT "):])
        assert "num_cpus" in info["plain"], info  # the file is live: a plain init follows it
        assert info["fixture"][0] != dead and info["fixture"][1] == 2, info
        assert info["started"] is True and info["product"][0] != dead and info["product"][1] == 1, info
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_actors_skip_the_runtime_env_on_a_cluster_whose_workers_start_with_the_profile(head):
    """The head here was started from this suite's environment, which ``import lcfed`` pinned to the portable
    profile (as ``lcfed head`` starts its head): its workers start with the profile's variables (read from
    /proc, not ``os.environ``, which importing lcfed changes), so actors need no runtime env (Ray would start
    fresh workers for one). A cluster whose workers start otherwise keeps it."""
    info, _ = run_py(f"""
        from actors.hosts import Hosts
        from actors.nodes import workers_start_with
        from lcfed import numerics
        from lcfed.config import from_dict
        ensure_ray(EngineConfig(kind="ray", address={head.gcs!r}))
        env = numerics.worker_env("portable")
        cfg = from_dict({{"engine": {{"kind": "ray"}}}})
        result(same=workers_start_with(env), other=workers_start_with({{**env, "OPENBLAS_CORETYPE": "Sandybridge"}}),
               options=Hosts.actor_options(cfg, attached=True), private=Hosts.actor_options(cfg, attached=False))
    """, head)
    assert info == {"same": True, "other": False, "options": {}, "private": {}}
