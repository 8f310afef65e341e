"""Failure modes that must be loud, and what leaves a device."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
import pytest
import torch

from lcfed.engines.hosted import HostedDevices
from lcfed.engines.local import LocalPool, LocalServer, run_local
from lcfed.run.loop import DivergenceError, run_rounds
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from lcfed.tracking import MLflowObserver
from tests.conftest import tiny_config
from tune_jobs.cli import main

pytestmark = [pytest.mark.server, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


def test_divergence_fails_the_run_with_a_reason(tracking_uri, capsys):
    code = main(["run", "--quiet", "--set", "train.lr=1e6", "--set", "train.rounds=4", "--set", "data.num_devices=8",
                 "--set", "method.num_clusters=3", "--set", "method.rank=4", "--set", f"tracking.uri={tracking_uri}"])
    assert code == 1
    assert "training loss is nan" in capsys.readouterr().err.lower()
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert "DivergenceError" in run.data.tags["failure_reason"]


def test_unreachable_tracking_server_fails_before_training(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--quiet", "--set", "tracking.uri=http://127.0.0.1:9", "--set", "train.rounds=1"])
    assert "cannot reach the MLflow tracking store" in str(exc.value)


class RoundHook:
    """An observer that acts on rounds only: the tests' outages and crashes."""

    def on_start(self, cfg, fed): ...
    def on_end(self, result): ...


class RecordingServer(LocalServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.received = []

    def aggregate(self, plan, msgs):
        self.received.extend(msgs)
        return super().aggregate(plan, msgs)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, name))


@pytest.mark.parametrize("method", ["lcfed", "fedavg", "standalone"])
def test_server_receives_models_never_samples(method):
    cfg = tiny_config(f"method.name={method}", "train.rounds=2")
    ds = load(cfg)
    setup = prepare(cfg, ds)
    hosted = HostedDevices(setup, range(cfg.data.num_devices), ds)
    server = RecordingServer(setup.strategy())
    run_rounds(cfg, setup.federation, server, LocalPool(hosted))
    dim, rank = setup.federation.spec.size, cfg.method.params.rank if method == "lcfed" else None
    samples = {tuple(d.x_train.flatten(1).shape) for d in hosted.data.values()}
    for msg in server.received:
        for t in _tensors(msg):
            assert t.ndim == 1 and t.numel() in (dim, rank), (type(msg).__name__, tuple(t.shape))
            assert tuple(t.shape) not in samples
    if method == "standalone":
        assert all(not list(_tensors(m)) for m in server.received)  # nothing but counts and losses


def test_divergence_error_is_raised_in_process():
    from lcfed.engines.local import run_local

    with pytest.raises(DivergenceError, match="round"):
        run_local(tiny_config("train.lr=1e6"))


def test_tracking_uri_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert MLflowObserver().uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert MLflowObserver("sqlite:///rel/x.db").uri == f"sqlite:///{tmp_path / 'rel' / 'x.db'}"


class Server:
    """A real MLflow tracking server on 127.0.0.1 that the outage tests stop and start again: their own, not the
    shared :func:`tests.conftest.mlflow_server`. The first is ``lcfed mlflow-server``'s, and the first outage
    kills that command with SIGKILL: no handler runs, and its watchdog must take the server down (within 20 s
    the port is free and nothing the command started is left; the handler's path: test_jobs' Ctrl-C). Later
    starts are :func:`start_mlflow_server`'s."""

    def __init__(self, store: Path) -> None:
        from tests.raycluster import free_port

        self.port, self.store, self.proc = free_port(), store, None
        self.command: subprocess.Popen[bytes] | None = None
        self.started: list = []  # what the command started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_command(self) -> None:
        from tune_jobs.mlflow_server import healthy

        log = self.store / "command.log"
        with log.open("w") as out:
            self.command = subprocess.Popen([str(Path(sys.executable).parent / "lcfed"), "mlflow-server", "--port",
                                             str(self.port), "--store-dir", str(self.store)], stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.store)
        deadline = time.monotonic() + 120
        while not healthy(self.url, timeout=1.0):
            assert self.command.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        # everything it started, found before the kill (afterwards they are no longer its children)
        self.started = psutil.Process(self.command.pid).children(recursive=True)
        cmds = [" ".join(p.cmdline()) for p in self.started]
        assert any("watchdog" in c for c in cmds) and any("uvicorn" in c for c in cmds), cmds

    def start(self) -> None:
        from tune_jobs.mlflow_server import start_mlflow_server

        if self.proc is None and self.command is None:
            self.proc = start_mlflow_server("127.0.0.1", self.port, self.store)[0]

    def stop(self) -> None:
        from tune_jobs.mlflow_server import port_free, stop

        if self.command is not None:
            command, self.command = self.command, None
            command.kill()
            assert command.wait(timeout=30) == -signal.SIGKILL
            _, alive = psutil.wait_procs(self.started, timeout=20)
            assert not alive, f"left after SIGKILL: {[(p.pid, p.cmdline()) for p in alive]}"
            assert port_free("127.0.0.1", self.port)
        proc, self.proc = self.proc, None
        if proc is not None:
            stop(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module's outage tests (a start costs seconds); each test leaves it running."""
    srv = Server(tmp_path_factory.mktemp("mlflow"))
    try:
        srv.start_command()
        yield srv
    finally:
        try:
            srv.stop()  # the command, if no outage killed it yet: with the same checks
        finally:
            for p in srv.started:  # only what the command started
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass


@pytest.fixture
def running(server):
    server.start()  # again, if a failed test left it stopped
    return server


def test_tracking_server_lost_mid_run_and_restarted_within_the_end_wait_loses_nothing(running, tmp_path, monkeypatch):
    """One run, two outages (one run for both: a run and its server restarts cost seconds). The server stops
    after round 0 and is back for round 2: the rounds between are buffered and flushed while the run goes on.
    It goes down again in the last round and its restart (seconds) ends while the run waits for it
    (tracking.end_wait_s; 120 here, not the default 30, so that a slow start on a busy machine cannot fail the
    test): every round logged, the run FINISHED with its artifacts, no unlogged-metrics file."""
    # MLflow's client settings as a user has them: the product bounds its own retries
    import threading

    monkeypatch.chdir(tmp_path)
    restart = threading.Thread(target=running.start)
    flushed: list[int] = []

    class Outages(RoundHook):
        def on_round(self, rnd, metrics, stats):  # before the tracker hears of the round
            if rnd == 0:
                running.stop()
            elif rnd == 2:
                running.start()
            elif rnd == 3:  # the last round: buffered, then sent after the wait
                client = mlflow.MlflowClient(tracking_uri=running.url)
                flushed.extend(m.step for m in client.get_metric_history(tracker.run_id, "loss/train_loss"))
                running.stop()
                restart.start()

    tracker = MLflowObserver(running.url)
    cfg = tiny_config("train.rounds=4", "tracking.enabled=true", f"tracking.uri={running.url}",
                      "tracking.end_wait_s=120")
    try:
        with pytest.warns(UserWarning) as seen:
            result = run_local(cfg, [Outages(), tracker])
    finally:
        if restart.ident is not None:  # started
            restart.join()
    said = [str(w.message) for w in seen]
    assert any("buffering metrics" in m for m in said), said
    assert flushed == [0, 1, 2]  # the mid-run outage's rounds reached the store before the end
    assert any("unreachable at the end of the run: trying again for up to 120 s" in m for m in said), said
    assert not [m for m in said if "saved in" in m]
    assert "unlogged_metrics" not in result.tracking and not list(tmp_path.glob("unlogged-metrics-*"))
    client = mlflow.MlflowClient(tracking_uri=running.url)
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(tracker.run_id, "loss/train_loss")] == [0, 1, 2, 3]
    assert {a.path for a in client.list_artifacts(tracker.run_id)} >= {"clusters", "metrics", "plots"}


def test_tracking_server_gone_at_the_end_keeps_the_metrics_for_a_replay(running, tmp_path, monkeypatch):
    """Gone longer than tracking.end_wait_s (2 s here): the unsent points go to the replay file."""
    monkeypatch.chdir(tmp_path)

    class Outage(RoundHook):
        def on_round(self, rnd, metrics, stats):
            if rnd == 0:
                running.stop()

    tracker = MLflowObserver(running.url)
    cfg = tiny_config("train.rounds=3", "tracking.enabled=true", f"tracking.uri={running.url}", "tracking.end_wait_s=2")
    with pytest.warns(UserWarning, match="unreachable at the end") as seen:
        result = run_local(cfg, [tracker, Outage()])
    assert any("trying again for up to 2 s" in str(w.message) for w in seen)
    dump = Path(result.tracking["unlogged_metrics"])
    assert dump.parent == tmp_path
    data = json.loads(dump.read_text())
    assert data["run_id"] == tracker.run_id and {row[3] for row in data["metrics"]} == {1, 2}
    running.start()
    assert main(["tracking", "replay", str(dump)]) == 0
    client = mlflow.MlflowClient(tracking_uri=running.url)
    assert [m.step for m in client.get_metric_history(tracker.run_id, "loss/train_loss")] == [0, 1, 2]
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


@pytest.mark.slow  # ~40 s; the outage buffer, the end wait and the replay file: the tests above
def test_resume_logs_the_rounds_an_outage_kept_from_the_store(running, tmp_path):
    """Server down, then the process dies: rounds only buffered in memory are lost with it, but the
    checkpoint has them, and resuming logs every round the store lacks."""
    from lcfed.run.loop import load_resume

    url = running.url
    cfg = tiny_config("train.rounds=5", "tracking.enabled=true", f"tracking.uri={url}",
                      f"checkpoint.dir={tmp_path / 'ck'}", "checkpoint.every=1")

    class OutageThenCrash(RoundHook):
        def on_round(self, rnd, metrics, stats):
            if rnd == 0:
                running.stop()
            elif rnd == 2:
                raise RuntimeError("machine lost")

    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="machine lost"):
        run_local(cfg, [MLflowObserver(url), OutageThenCrash()])
    running.start()
    snap = load_resume(cfg)
    assert snap is not None and snap.next_round == 3
    run_id = snap.tracking["run_id"]
    client = mlflow.MlflowClient(tracking_uri=url)
    assert [m.step for m in client.get_metric_history(run_id, "loss/train_loss")] == [0]  # 1, 2 died in memory
    run_local(cfg, [MLflowObserver(url, resume_run_id=run_id, backfill=snap.history)], snap)
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss/train_loss")) == [0, 1, 2, 3, 4]
    assert client.get_run(run_id).info.status == "FINISHED"
