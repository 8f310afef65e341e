"""Ray connection rules (actors/connect.py) against one real, private, token-auth Ray head.

The head is what a user gets from ``ray start --head``: token auth on and Ray's address file
(``<ray temp dir>/ray_current_cluster``) pointing at it. It uses its own temp dir ``BASE/ray``; the
checks run with ``RAY_TMPDIR=BASE`` so that this is Ray's default temp dir for them, exactly like
``/tmp/ray`` after a real ``ray start --head``. Each check runs in a fresh ``python -c`` (ray.init
state must not leak into pytest) without ``RAY_AUTH_MODE`` and with ``RAY_AUTH_TOKEN_PATH`` at the
head's token. The head is stopped through its process group, never ``ray stop``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marked(marker: str) -> list[int]:
    """Live processes whose environment mentions ``marker`` (this head's token path)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                if (entry / "stat").read_text().split(") ")[-1][0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            pass
    return [pid for pid in found if pid != os.getpid()]


@dataclass
class Head:
    proc: subprocess.Popen[bytes]
    base: Path
    token: Path
    gcs: str

    @classmethod
    def start(cls, timeout: float = 120.0) -> Head:
        base = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's unix sockets live below
        token = base / "auth_token"
        token.write_text(secrets.token_hex(32))
        cmd = [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2", "--object-store-memory",
               str(200 * 1024 * 1024), "--temp-dir", str(base / "ray"), "--include-dashboard", "false",
               "--disable-usage-stats"]
        for flag in ("--port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                     "--metrics-export-port", "--ray-client-server-port", "--node-manager-port", "--object-manager-port"):
            cmd += [flag, str(free_port())]
        env = {**_clean_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        log = base / "ray-start.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        address_file = base / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + timeout
        while not address_file.is_file() or not address_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                cls(proc, base, token, "").stop()
                raise RuntimeError(f"ray start failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        return cls(proc, base, token, address_file.read_text().strip())

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while (left := _marked(str(self.token))) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:  # only processes carrying this head's marker
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_TMPDIR")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    h = Head.start()
    try:
        yield h
    finally:
        h.stop()


PRELUDE = """
import json, os, sys, time
from lcfed.config import EngineConfig
from actors.connect import ClusterError, ensure_ray
import ray
assert "RAY_AUTH_MODE" not in os.environ
def result(**kw):
    print("RESULT " + json.dumps(kw))
"""


def run_py(code: str, head: Head, timeout: float = 120.0) -> tuple[dict[str, Any], str]:
    """Run PRELUDE + code in a fresh interpreter with the head's token; (its RESULT, its stderr)."""
    env = {**_clean_env(), "RAY_AUTH_TOKEN_PATH": str(head.token), "RAY_TMPDIR": str(head.base), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):]), proc.stderr


@pytest.fixture(scope="module")
def private_ray(head: Head) -> dict[str, Any]:
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
