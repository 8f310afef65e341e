"""Process lifecycle: ``lcfed mlflow-server`` takes its server down however it ends, and many runs
started at once on one fresh sqlite store are all recorded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tune_jobs.mlflow_server import healthy, port_free

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_mlflow_server_goes_down_with_its_command(tmp_path, sig):
    """SIGTERM and SIGHUP are handled (exit 0); SIGKILL is not, and the watchdog stops the server's group.
    Either way, within 20 s the port is free and no process the command started is left."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "out.log").open("w") as log:
        proc = subprocess.Popen([str(BIN / "lcfed"), "mlflow-server", "--port", str(port), "--store-dir",
                                 str(tmp_path), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=tmp_path)
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not healthy(url, timeout=1.0):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()
            time.sleep(0.3)
        # everything it started, found before the kill (afterwards they are no longer its children)
        started = psutil.Process(proc.pid).children(recursive=True)
        cmds = [" ".join(p.cmdline()) for p in started]
        assert any("watchdog" in c for c in cmds) and any("uvicorn" in c for c in cmds), cmds
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 0), (tmp_path / "out.log").read_text()
        _, alive = psutil.wait_procs(started, timeout=20)
        assert not alive, f"left after {sig.name}: {[(p.pid, p.cmdline()) for p in alive]}"
        assert port_free("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in started:  # only what this test started
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def _concurrent_runs(tmp_path: Path, n: int) -> None:
    """``n`` real ``lcfed run`` processes started at once on one fresh sqlite file: all exit 0, and the
    store holds ``n`` FINISHED runs with every round's metrics."""
    import mlflow

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    rounds = 2
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    for i in range(n):
        with (tmp_path / f"r{i}.log").open("w") as log:
            procs.append(subprocess.Popen(
                [str(BIN / "lcfed"), "run", "--set", "data.dataset=digits", "--set", "data.num_devices=4",
                 "--set", f"train.rounds={rounds}", "--set", "train.local_steps=2", "--set", "model.name=lenet5",
                 "--set", "method.name=fedavg", "--set", f"tracking.uri={uri}", "--set", f"tracking.run_name=r{i}",
                 "-q"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path, env=env))
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = {i: (tmp_path / f"r{i}.log").read_text()[-2000:] for i, c in enumerate(codes) if c != 0}
    assert not failed, f"{len(failed)} of {n} runs failed: {failed}"

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("lcfed")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert sorted(r.info.run_name for r in runs) == sorted(f"r{i}" for i in range(n))
    assert {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert {"train_loss", "test_loss", "acc_mean"} <= set(run.data.metrics), run.data.metrics
        for key in run.data.metrics:
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            assert steps == list(range(rounds)), (run.info.run_name, key, steps)


def test_concurrent_runs_on_a_fresh_sqlite_store(tmp_path):
    _concurrent_runs(tmp_path, 4)


@pytest.mark.slow
def test_ten_concurrent_runs_on_a_fresh_sqlite_store(tmp_path):
    _concurrent_runs(tmp_path, 10)
