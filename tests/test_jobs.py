"""Job submission and the MLflow server, end to end on this machine.

``lcfed submit`` runs ``lcfed run`` as jobs (``lcfed sweep``: tests/test_multinode.py) on the test process's shared Ray head
(:func:`tests.conftest.shared_head`: own ports, own temp dir, token auth on); the runs land in the server of the
module's ``lcfed mlflow-server`` command (:func:`served`: the command's output, binding and Ctrl-C are checked on
it, so one server start serves all), each test in an experiment of its own, and the tests look only at their own
jobs and runs.

The head is never stopped with ``ray stop`` (that kills every Ray on the machine, other tests'
and other users' included). It runs as ``ray start --head --block`` in its own process group:
SIGTERM to that group makes Ray tear down the processes it started. Every process of this cluster
also carries a marker in its environment (``RAY_AUTH_TOKEN_PATH`` pointing into the private temp
dir), so stragglers (job drivers, workers) are found by that marker alone and the fixture asserts
none is left, while a decoy process named like Ray's daemons must survive.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import from_a_terminal
from tests.raycluster import LocalCluster, free_port, pids_marked
from tune_jobs import jobs
from tune_jobs.cli import main
from tune_jobs.mlflow_server import MlflowServerError, start_mlflow_server

pytestmark = [pytest.mark.cluster, pytest.mark.server, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture
def ray_head(shared_head: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """The shared head, with this process (the job client) holding its token."""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(shared_head.token))
    for name in ("RAY_AUTH_TOKEN", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    return shared_head


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


@dataclass
class Served:
    """An ``lcfed mlflow-server`` command: its process, port, store directory and what it printed."""

    proc: subprocess.Popen[str]
    port: int
    store: Path
    text: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One ``lcfed mlflow-server`` for the module (a server start costs seconds), run as from a terminal: the
    first test below checks what it printed and where it listens, the jobs and the UI test log to it, the last
    one stops it with Ctrl-C."""
    store = tmp_path_factory.mktemp("lcfed-mlflow-server")
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (store / "stderr").open("w") as err:
        proc = subprocess.Popen(from_a_terminal([str(BIN / "lcfed"), "mlflow-server", "--port", str(port),
                                                 "--store-dir", str(store)]),
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=store)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        yield Served(proc, port, store, "".join(lines) + (store / "stderr").read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # if a test failed before Ctrl-C, the server (own process group) is still up: stop it, found by its
        # store directory (unique to this module)
        for pid in pids_marked(str(store)):
            try:
                if (pgid := os.getpgid(pid)) != os.getpgrp():  # never our own group
                    os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_mlflow_server_command_binds_loopback_by_default(served):
    port, text = served.port, served.text
    assert f"MLflow server ready: http://127.0.0.1:{port}" in text, text
    assert f"--set tracking.uri=http://127.0.0.1:{port}" in text
    assert f"sqlite:///{served.store.resolve()}/mlflow.db" in text  # absolute store
    addrs = _listening(port)
    assert addrs and all(a == "0100007F" for a in addrs), addrs  # 127.0.0.1 only, not 0.0.0.0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        assert resp.status == 200


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


# ---- against the shared Ray head and MLflow server ------------------------------------------------


def test_submit_runs_lcfed_on_ray_and_logs_to_mlflow_server(ray_head, served, mlflow_experiment, capsys,
                                                            monkeypatch):
    import mlflow

    mlflow_server = served.url
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # the run's logged models' URIs resolve against it

    # token auth is on: a request without the token is refused
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ray_head.dashboard}/api/jobs/", timeout=10)
    assert refused.value.code == 401

    sets = ["train.rounds=2", "data.num_devices=6", "method.num_clusters=2", "method.rank=3",
            "train.local_steps=2", f"tracking.uri={mlflow_server}", f"tracking.experiment={mlflow_experiment}",
            "engine.torch_threads=1"]
    # a tiny run in the job (a sweep in a job, its trials logged through the driver: tests/test_multinode.py's
    # plugin sweep)
    entry = ["lcfed", "run", *[a for s in sets for a in ("--set", s)]]
    code = main(["submit", "--address", ray_head.dashboard, "--working-dir", str(ROOT),
                 "--env", "LCFED_JOB_TEST=1", "--", *entry])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "submitted job" in out and "acc_mean" in out  # the job's own output was streamed
    job_id = out.split("submitted job ", 1)[1].split()[0]

    assert main(["job", "status", job_id, "--address", ray_head.dashboard]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out
    assert main(["job", "logs", job_id, "--address", ray_head.dashboard]) == 0
    assert f"in experiment {mlflow_experiment!r}" in capsys.readouterr().out
    assert main(["job", "list", "--address", ray_head.dashboard]) == 0
    assert job_id in capsys.readouterr().out
    assert main(["job", "stop", job_id, "--address", ray_head.dashboard]) == 0
    assert "not running" in capsys.readouterr().out

    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name(mlflow_experiment)
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["train.rounds"] == "2" and run.data.params["method.name"] == "lcfed"
    for key in ("accuracy/acc_mean", "accuracy/acc_weighted", "loss/train_loss", "server/num_clusters"):
        assert key in run.data.metrics, key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "accuracy/acc_mean")] == [0, 1]
    # artifacts went through the server's proxy into its artifact directory
    names = {a.path for a in client.list_artifacts(run.info.run_id, "clusters")}
    assert "clusters/assignment.csv" in names
    assert list((served.store / "mlartifacts" / exp.experiment_id / run.info.run_id).rglob("assignment.csv"))


def test_wrong_token_is_a_clear_error(ray_head, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 64)
    assert main(["job", "list", "--address", ray_head.dashboard]) == 2
    err = capsys.readouterr().err
    assert ray_head.dashboard in err and "token" in err


def test_failed_job_exits_1(ray_head, capsys):
    code = main(["submit", "--address", ray_head.dashboard, "--working-dir", str(ROOT), "--no-logs",
                 "--", "lcfed", "run", "--set", "method.num_clusters=500"])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out


def test_printed_ui_links_use_a_ui_that_already_serves_the_store(served, mlflow_experiment):
    """A UI left open on a port (here the module's server) that knows the run is where the addresses point, with
    no command to start another; a port where something else listens is passed over for a free one."""
    import mlflow

    mlflow_server = served.url

    from lcfed.tracking import ui

    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    exp = client.create_experiment(mlflow_experiment)
    run = client.create_run(exp).info.run_id
    port = int(mlflow_server.rsplit(":", 1)[1])
    free = free_port()
    with socket.socket() as other:  # a program that is not an MLflow UI
        other.bind(("127.0.0.1", 0))
        other.listen()
        busy = other.getsockname()[1]
        assert ui._serves("127.0.0.1", free, exp, run) is None
        assert ui._serves("127.0.0.1", busy, exp, run) is False
        assert ui._serves("127.0.0.1", port, exp, run) is True
        assert ui._serves("127.0.0.1", port, exp, "0" * 32) is False  # another store's run: not this store
        assert ui.ui_port("sqlite:///a.db", exp, run, ports=[busy, free, port]) == port
        assert ui.ui_port("sqlite:///b.db", exp, "0" * 32, ports=[busy, free, port]) == free
    assert "sqlite:///a.db" in ui._SERVED and "sqlite:///b.db" not in ui._SERVED
    ui._PORTS.pop("sqlite:///a.db")
    ui._PORTS.pop("sqlite:///b.db")
    ui._SERVED.discard("sqlite:///a.db")


def test_mlflow_server_command_stops_on_ctrl_c(served):
    """Last in the module: the tests above used the server."""
    proc, port = served.proc, served.port
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the command stops its server and exits
    assert proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _listening(port), "the MLflow server outlived its command"
