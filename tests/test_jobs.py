"""Job submission and the MLflow server, end to end on this machine.

A private Ray head (own ports, own temp dir, token auth on) runs ``lcfed run`` submitted through
``lcfed submit``; the run lands in an MLflow server started by :func:`start_mlflow_server`.

The head is never stopped with ``ray stop`` (that kills every Ray on the machine, other tests'
and other users' included). It runs as ``ray start --head --block`` in its own process group:
SIGTERM to that group makes Ray tear down the processes it started. Every process of this cluster
also carries a marker in its environment (``RAY_AUTH_TOKEN_PATH`` pointing into the private temp
dir), so stragglers (job drivers, workers) are found by that marker alone and the test asserts
none is left, while a decoy process named like Ray's daemons must survive.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import from_a_terminal
from tests.raycluster import alive, free_port, pids_marked
from tune_jobs import jobs
from tune_jobs.cli import main
from tune_jobs.mlflow_server import MlflowServerError, start_mlflow_server, stop

pytestmark = [pytest.mark.cluster, pytest.mark.server, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@dataclass
class RayHead:
    """One private Ray head started by a test; stopped with :meth:`stop`, never ``ray stop``."""

    proc: subprocess.Popen[bytes]
    temp_dir: str
    dashboard_url: str
    token_path: Path
    log: Path

    @classmethod
    def start(cls, timeout: float = 240.0) -> RayHead:
        # short path: Ray's unix sockets live under it (108-byte limit)
        temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        token_path = Path(temp_dir) / "auth_token"
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
        dash = free_port()
        ports = {
            "--port": free_port(),
            "--dashboard-port": dash,
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
            "--ray-client-server-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
        }
        cmd = [str(BIN / "ray"), "start", "--head", "--block", "--dashboard-host", "127.0.0.1",
               "--num-cpus", "2", "--object-store-memory", str(200 * 1024 * 1024), "--temp-dir", temp_dir,
               "--disable-usage-stats", "--include-dashboard", "true"]
        for flag, port in ports.items():
            cmd += [flag, str(port)]
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # `lcfed` for the job's entrypoint
            "RAY_AUTH_MODE": "token",  # Ray 2.60's default, made explicit: the test relies on it
            "RAY_AUTH_TOKEN_PATH": str(token_path),  # also the marker of every process of this cluster
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # SIGTERM: tear down now (no 30 s Serve drain)
        }
        env.pop("RAY_AUTH_TOKEN", None)
        env.pop("RAY_ADDRESS", None)
        log = Path(temp_dir) / "ray-start.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        head = cls(proc, temp_dir, f"http://127.0.0.1:{dash}", token_path, log)
        try:
            head._wait_ready(timeout)
        except BaseException:
            head.stop()
            raise
        return head

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(f"{self.dashboard_url}/api/jobs/",
                                         headers={"Authorization": f"Bearer {self.token_path.read_text()}"})
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(f"Ray head not ready after {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 90.0) -> list[int]:
        """SIGTERM the head's process group, wait, then SIGKILL any process still marked as ours.

        Returns the stragglers that needed SIGKILL (for the test to report); other Ray instances on
        the machine are never signalled: only this group and processes carrying this cluster's marker.
        """
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with_suppress_kill(self.proc.pid, group=True)
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (left := [p for p in pids_marked(str(self.token_path)) if alive(p)]) and time.monotonic() < deadline:
            time.sleep(1)
        for pid in left:
            with_suppress_kill(pid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def with_suppress_kill(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def _private_head() -> Iterator[RayHead]:
    # a decoy named like Ray's daemons: stopping our cluster must not touch it (no kill-by-name)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "gcs_server", "raylet"],
                             start_new_session=True)
    head = RayHead.start()
    try:
        yield head
    finally:
        stragglers = head.stop()
        decoy_alive = alive(decoy.pid)
        decoy.kill()
        decoy.wait()
        assert decoy_alive, "stopping the test cluster killed an unrelated process"
        remaining = [p for p in pids_marked(str(head.token_path)) if alive(p)]
        assert not remaining, f"processes of the test cluster survived: {remaining}"
        if stragglers:
            print(f"\nSIGKILLed {len(stragglers)} straggler(s) of the test cluster: {stragglers}")


@pytest.fixture
def ray_head(_private_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> RayHead:
    """The module's private head, with this process (the job client) holding its token."""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(_private_head.token_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    return _private_head


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    proc, url = start_mlflow_server("127.0.0.1", free_port(), tmp_path / "mlflow")
    try:
        yield url
    finally:
        stop(proc)
        assert proc.poll() is not None


def test_unreachable_address_exits_2_naming_it_and_the_fix(capsys):
    address = f"http://127.0.0.1:{free_port()}"
    assert main(["job", "list", "--address", address]) == 2
    err = capsys.readouterr().err
    assert address in err and "lcfed head start" in err and "ray up cluster.yaml" in err
    assert main(["submit", "--address", address, "--", "lcfed", "run"]) == 2
    assert address in capsys.readouterr().err


def test_address_resolution_and_runtime_env(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert jobs.resolve_address(None) == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:8265")
    assert jobs.resolve_address(None) == "http://10.0.0.5:8265"
    assert jobs.resolve_address("http://h:1/") == "http://h:1"  # --address wins over the env
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert jobs.resolve_address(None) == "http://127.0.0.1:8265"

    env = jobs.build_runtime_env(tmp_path, jobs.parse_env(["A=1", "B=x=y"]))
    assert env["working_dir"] == str(tmp_path.resolve()) and env["env_vars"] == {"A": "1", "B": "x=y"}
    for pattern in (".venv", ".git", "mlruns", "mlartifacts", "*.db", "outputs", ".devbundle"):
        assert pattern in env["excludes"]
    with pytest.raises(jobs.JobsError):
        jobs.parse_env(["NOEQUALS"])
    assert jobs._entrypoint(["--", "lcfed", "run", "--set", "a=b c"]) == "lcfed run --set 'a=b c'"


def test_token_sources(monkeypatch, tmp_path):
    path = tmp_path / "tok"
    path.write_text("abc\n")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert jobs.auth_headers() == {"Authorization": "Bearer abc"}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "xyz")
    assert jobs.read_token() == "xyz"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert jobs.auth_headers() == {}


# ---- lcfed mlflow-server -------------------------------------------------------------------------


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) with a socket in LISTEN state on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.append(addr)
    return found


def test_mlflow_server_command_binds_loopback_by_default_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen(from_a_terminal([str(BIN / "lcfed"), "mlflow-server", "--port", str(port),
                                                 "--store-dir", str(tmp_path), "--workers", "1"]),
                                stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env, cwd=tmp_path)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        text = "".join(lines)
        assert f"MLflow server ready: http://127.0.0.1:{port}" in text, text + (tmp_path / "stderr").read_text()
        assert f"--set tracking.uri=http://127.0.0.1:{port}" in text
        assert f"sqlite:///{tmp_path.resolve()}/mlflow.db" in text  # absolute store
        addrs = _listening(port)
        assert addrs and all(a == "0100007F" for a in addrs), addrs  # 127.0.0.1 only, not 0.0.0.0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the command stops its server and exits
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while _listening(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _listening(port), "the MLflow server outlived its command"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # if an assertion failed before Ctrl-C, the server (own process group) is still up: stop it,
        # found by its store directory (unique to this test)
        for pid in pids_marked(str(tmp_path)):
            try:
                if (pgid := os.getpgid(pid)) != os.getpgrp():  # never our own group
                    os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_mlflow_server_warns_on_all_interfaces_and_refuses_a_taken_port(tmp_path, capsys):
    from tune_jobs.mlflow_server import _warn_binding, server_url

    _warn_binding("0.0.0.0", 5000)
    err = capsys.readouterr().err
    assert "WARNING" in err and "0.0.0.0" in err and "127.0.0.1" in err
    _warn_binding("127.0.0.1", 5000)
    assert capsys.readouterr().err == ""
    assert server_url("0.0.0.0", 5) == "http://127.0.0.1:5" and server_url("::1", 5) == "http://[::1]:5"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(MlflowServerError, match="in use"):
            start_mlflow_server("127.0.0.1", taken.getsockname()[1], tmp_path)


# ---- against a private Ray head (started once for these tests, last in the module) ----------------


def test_submit_runs_lcfed_on_ray_and_logs_to_mlflow_server(ray_head, mlflow_server, tmp_path, capsys):
    import mlflow

    # token auth is on: a request without the token is refused
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ray_head.dashboard_url}/api/jobs/", timeout=10)
    assert refused.value.code == 401

    sets = ["train.rounds=2", "data.num_devices=6", "method.num_clusters=2", "method.rank=3",
            "train.local_steps=2", f"tracking.uri={mlflow_server}", "tracking.experiment=jobs-e2e",
            "engine.torch_threads=1"]
    # a tiny sweep: 2 trials, each a federation on Ray actors inside the job's cluster
    entry = ["lcfed", "sweep", "--space", "mu_lambda.yaml", "--num-samples", "2", "--scheduler", "fifo",
             "--max-concurrent", "1", "--name", "jobs-e2e", "--storage", str(tmp_path / "tune")]
    entry += [a for s in sets for a in ("--set", s)]
    code = main(["submit", "--address", ray_head.dashboard_url, "--working-dir", str(ROOT),
                 "--env", "LCFED_JOB_TEST=1", "--", *entry])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "submitted job" in out and "acc_mean" in out  # the job's own output was streamed
    job_id = out.split("submitted job ", 1)[1].split()[0]

    assert main(["job", "status", job_id, "--address", ray_head.dashboard_url]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out
    assert main(["job", "logs", job_id, "--address", ray_head.dashboard_url]) == 0
    assert "MLflow parent run" in capsys.readouterr().out
    assert main(["job", "list", "--address", ray_head.dashboard_url]) == 0
    assert job_id in capsys.readouterr().out
    assert main(["job", "stop", job_id, "--address", ray_head.dashboard_url]) == 0
    assert "not running" in capsys.readouterr().out

    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("jobs-e2e")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("sweep_parent") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].info.status == "FINISHED" and "best.method.mu" in parents[0].data.tags
    assert all(c.info.status == "FINISHED" for c in children)
    run = children[0]
    assert run.data.params["train.rounds"] == "2" and run.data.params["method.name"] == "lcfed"
    for key in ("accuracy/acc_mean", "accuracy/acc_weighted", "loss/train_loss", "server/num_clusters"):
        assert key in run.data.metrics, key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "accuracy/acc_mean")] == [0, 1]
    # artifacts went through the server's proxy into its artifact directory
    names = {a.path for a in client.list_artifacts(run.info.run_id, "clusters")}
    assert "clusters/assignment.csv" in names
    assert list((tmp_path / "mlflow" / "mlartifacts").rglob("assignment.csv"))


def test_wrong_token_is_a_clear_error(ray_head, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 64)
    assert main(["job", "list", "--address", ray_head.dashboard_url]) == 2
    err = capsys.readouterr().err
    assert ray_head.dashboard_url in err and "token" in err


def test_failed_job_exits_1(ray_head, capsys):
    code = main(["submit", "--address", ray_head.dashboard_url, "--working-dir", str(ROOT), "--no-logs",
                 "--", "lcfed", "run", "--set", "method.num_clusters=500"])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out
