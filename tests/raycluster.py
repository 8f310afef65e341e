"""A multi-node Ray cluster on this machine, for tests: a head and workers, each a `ray start`.

Each node is `ray start --block` in its own process group with its own ports, `HOME` and
environment, so a test can give worker nodes an empty data directory (``~/data`` resolves per
node), logical GPUs, or a Python path that makes importing some module fail there. Workers may also
start in a mount namespace of their own with an empty tmpfs over some of the head's directories
(``worker_hidden``): the same absolute path is then empty there, as on a machine without that disk. All nodes share
one auth token file whose path (``RAY_AUTH_TOKEN_PATH``) is in every process's environment: it marks
this cluster's processes, so stopping it signals only them (never ``ray stop``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
_PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
               "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")


def _count(x: float) -> str:
    """A resource count as ``ray start`` takes it: a whole number without a fraction (it refuses ``0.0``)."""
    return str(int(x)) if float(x).is_integer() else str(x)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pids_marked(marker: str) -> list[int]:
    """Processes whose environment or command line mentions ``marker``."""
    needle = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for part in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                if needle in (entry / part).read_bytes():
                    found.append(int(entry.name))
                    break
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    home: Path
    log: Path
    cpus: float
    gpus: float
    name: str
    manager_port: int


@dataclass
class LocalCluster:
    """Start with :meth:`start`; ``gcs`` is the address to attach to, ``dashboard`` the head's job server (empty
    without one); stop with :meth:`stop`."""

    base: Path
    token: Path
    head: Node | None = None
    workers: list[Node] = field(default_factory=list)
    gcs: str = ""
    dashboard: str = ""
    object_store_mb: int = 100
    hidden: tuple[Path, ...] = ()  # directories the workers see empty

    @classmethod
    def start(cls, head_cpus: float, workers: list[tuple[float, float]], worker_env: Mapping[str, str] | None = None,
              env: Mapping[str, str] | None = None, timeout: float = 180.0, dashboard: bool = True,
              object_store_mb: int = 100, worker_hidden: Sequence[str] = (),
              autoscaling: Callable[[str], Mapping[str, Any]] | None = None) -> LocalCluster:
        """A head (``head_cpus``, no GPU) and one worker per (CPUs, GPUs); ``env`` goes to every node,
        ``worker_env`` to the workers only; each node's object store has ``object_store_mb``. ``worker_hidden``:
        folders under ``base`` (e.g. ``home-head/data``, the head's ``~/data``), made here, that the workers see
        empty (an empty tmpfs over each in the workers' own mount namespace: needs root). The head's temp dir is ``base/ray``, so with
        ``RAY_TMPDIR=base`` its address file is where Ray looks after a plain ``ray start --head``.

        ``autoscaling``: the head's autoscaling config for Ray's fake multi-node provider, made from the GCS
        address (:func:`actors.fake_autoscaler.fake_autoscaling_config`); the head then has its head type's
        resources (not ``head_cpus``), runs the autoscaler (its monitor starts and stops the workers, each a
        raylet with this machine's files and the head's temp dir), and finds the config as
        ``~/ray_bootstrap_config.yaml``, where ``ray up`` leaves it."""
        base = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's unix sockets live under it
        token = base / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        cluster = cls(base, token, object_store_mb=object_store_mb,
                      hidden=tuple(base / h for h in worker_hidden))
        for folder in cluster.hidden:
            folder.mkdir(parents=True, exist_ok=True)
        try:
            cluster._start_head(head_cpus, dict(env or {}), timeout, dashboard, autoscaling)
            # one at a time: nodes started together race for log file names and ports
            for i, (cpus, gpus) in enumerate(workers):
                for attempt in range(3):
                    # its own temp dir, as on its own machine: nodes sharing one would share (and
                    # garbage-collect) each other's unpacked job working dirs
                    node = cluster._start_node(f"w{i}-{attempt}", ["--address", cluster.gcs, "--temp-dir",
                                                                   str(cluster.base / f"t{i}")],
                                               cpus, gpus, {**(env or {}), **(worker_env or {})})
                    try:
                        cluster.wait_nodes(2 + i, timeout, [node])
                        break
                    except RuntimeError:
                        if attempt == 2:
                            raise
                cluster.workers.append(node)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def node_env(self, home: Path, extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_TMPDIR", "PYTHONPATH")}
        # the code under test (this checkout, which may not be the installed one) on every node, after extra's path
        path = os.pathsep.join(p for p in (extra.get("PYTHONPATH", ""), str(ROOT)) if p)
        return {**env, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token), "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **extra, "PYTHONPATH": path}

    def client_env(self, home: Path | None = None, **extra: str) -> dict[str, str]:
        """The environment of a driver on the head (e.g. an ``lcfed`` command), attached via ``RAY_ADDRESS``
        only when ``extra`` says so; Ray's token mode is *not* set: lcfed must find it itself."""
        env = self.node_env(home or (self.head.home if self.head else self.base), {})
        env.pop("RAY_AUTH_MODE")
        return {**env, "PYTHONPATH": str(ROOT), **extra}

    def _start_node(self, name: str, args: list[str], cpus: float, gpus: float, extra: dict[str, str]) -> Node:
        home = self.base / f"home-{name.split('-')[0]}"
        home.mkdir(exist_ok=True)
        chosen = {flag: free_port() for flag in _PORT_FLAGS}
        ports = [x for flag, port in chosen.items() for x in (flag, str(port))]
        cmd = [str(BIN / "ray"), "start", "--block", *args, "--num-cpus", _count(cpus), "--num-gpus", _count(gpus),
               "--object-store-memory", str(self.object_store_mb * 2**20), "--disable-usage-stats", *ports]
        if self.hidden and not name.startswith("head"):  # `unshare` makes mounts private to the new namespace
            mounts = " ".join(f"mount -t tmpfs none {shlex.quote(str(h))} &&" for h in self.hidden)
            cmd = ["unshare", "--mount", "sh", "-c", f'{mounts} exec "$@"', "sh", *cmd]
        log = self.base / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=self.node_env(home, extra), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=home)
        return Node(proc, home, log, cpus, gpus, name.split("-")[0], chosen["--node-manager-port"])

    def _start_head(self, cpus: float, extra: dict[str, str], timeout: float, dashboard: bool,
                    autoscaling: Callable[[str], Mapping[str, Any]] | None = None) -> None:
        port, dash = free_port(), free_port()
        temp = self.base / "ray"
        args, gpus = [], 0.0
        if autoscaling is not None:
            from ray._private.services import get_node_ip_address  # the address `ray start` binds the GCS to

            from actors.fake_autoscaler import FAKE_ENV, FAKE_HEAD_TYPE

            config = autoscaling(f"{get_node_ip_address()}:{port}")
            declared = config["available_node_types"][FAKE_HEAD_TYPE]["resources"]
            cpus, gpus = declared["CPU"], declared.get("GPU", 0)
            path = self.base / "autoscaling.yaml"
            path.write_text(yaml.safe_dump(dict(config)))
            (self.base / "home-head").mkdir(exist_ok=True)
            shutil.copy(path, self.base / "home-head" / "ray_bootstrap_config.yaml")
            args, extra = ["--autoscaling-config", str(path)], {**FAKE_ENV, **extra}
        self.head = self._start_node("head", [
            "--head", "--port", str(port), "--temp-dir", str(temp), "--include-dashboard", str(dashboard).lower(),
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
            "--ray-client-server-port", str(free_port()), *args], cpus, gpus, extra)
        self.dashboard = f"http://127.0.0.1:{dash}" if dashboard else ""
        address_file = temp / "ray_current_cluster"
        deadline = time.monotonic() + timeout
        while not address_file.is_file() or not address_file.read_text().strip():
            self._check_alive(self.head)
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray head not up after {timeout:.0f} s:\n{self.head.log.read_text()[-3000:]}")
            time.sleep(0.5)
        self.gcs = address_file.read_text().strip()

    @staticmethod
    def _check_alive(node: Node) -> None:
        if node.proc.poll() is not None:
            raise RuntimeError(f"ray start exited {node.proc.returncode}:\n{node.log.read_text()[-3000:]}")

    def wait_nodes(self, count: int, timeout: float, starting: list[Node]) -> None:
        """Until the GCS sees ``count`` alive nodes; RuntimeError if a starting node's ``ray start`` exits."""
        deadline = time.monotonic() + timeout
        while True:
            for node in starting:
                self._check_alive(node)
            alive, why = self._alive_nodes(timeout)
            if alive == count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} nodes not up after {timeout:.0f} s: {why}")
            time.sleep(0.5 if self.dashboard else 1)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token.read_text().strip()}"}

    def wait_job_server(self, timeout: float = 180.0) -> None:
        """Until the head's job server answers (it starts after the address file is written); RuntimeError if
        the head's ``ray start`` exits or ``timeout`` passes."""
        assert self.head is not None and self.dashboard, "a head with a dashboard"
        request = urllib.request.Request(f"{self.dashboard}/api/jobs/", headers=self._auth())
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(self.head)
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200:
                        return
                    why = f"HTTP {resp.status}"
            except OSError as exc:  # still starting
                why = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the job server at {self.dashboard} not up after {timeout:.0f} s: {why}\n"
                                   f"{self.head.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def _alive_nodes(self, timeout: float) -> tuple[int | None, str]:
        """The GCS's count of alive nodes (None if not known yet) and what answered. Through the head's
        dashboard (Ray's state API) when it has one: a driver process per ask costs seconds of CPU that the
        nodes being started need on a small machine."""
        if self.dashboard:
            request = urllib.request.Request(f"{self.dashboard}/api/v0/nodes?limit=1000", headers=self._auth())
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    nodes = json.load(resp)["data"]["result"]["result"]
            except (OSError, ValueError, KeyError) as exc:  # the dashboard is still starting
                return None, repr(exc)
            return sum(1 for n in nodes if n.get("state") == "ALIVE"), json.dumps(nodes)[-500:]
        code = (f"import ray; from actors.connect import attach; attach({self.gcs!r}); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))")
        out = subprocess.run([sys.executable, "-c", code], env=self.client_env(), capture_output=True, text=True,
                             timeout=timeout, cwd=ROOT)
        last = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
        alive = int(last[0]) if last and last[0].isdigit() else None
        return alive, f"{out.stdout[-500:]} {out.stderr[-2000:]}"

    def node_names(self) -> dict[str, str]:
        """Ray node id -> ``head`` / ``w0`` / ``w1`` ... (matched by node-manager port)."""
        code = f"import json, ray; from actors.connect import attach; attach({self.gcs!r}); print(json.dumps(ray.nodes()))"
        out = subprocess.run([sys.executable, "-c", code], env=self.client_env(), capture_output=True, text=True,
                             timeout=120, cwd=ROOT, check=True)
        by_port = {n.manager_port: n.name for n in [self.head, *self.workers] if n is not None}
        return {n["NodeID"]: by_port.get(n["NodeManagerPort"], "?") for n in json.loads(out.stdout.splitlines()[-1])}

    def stop(self) -> list[int]:
        """SIGTERM every node's process group, then SIGKILL what still carries this cluster's marker."""
        nodes = [n for n in [*self.workers, self.head] if n is not None]
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGTERM)
        for node in nodes:
            try:
                node.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while (left := [p for p in pids_marked(str(self.token)) if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not os.environ.get("LCFED_KEEP_CLUSTER"):
            shutil.rmtree(self.base, ignore_errors=True)
        return left
