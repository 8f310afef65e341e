"""Process lifecycle: ``lcfed mlflow-server`` takes its server down however it ends, many runs
started at once on one fresh sqlite store are all recorded, a run whose process dies without closing it
(``kill -9``) does not stay RUNNING, and a run whose Ray cluster dies under it says so and how to go on."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tune_jobs.mlflow_server import healthy, port_free

pytestmark = [pytest.mark.ray, pytest.mark.server, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# run on request only, to keep the CI suite short: SIGTERM and SIGHUP take the signal handler's path, which
# test_jobs' Ctrl-C (SIGINT) test of the server also takes; SIGKILL (the watchdog's path): test_safety's first
# outage kills its server's `lcfed mlflow-server` command with it and makes these checks
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_mlflow_server_goes_down_with_its_command(tmp_path, sig):
    """SIGTERM and SIGHUP are handled (exit 0); SIGKILL is not, and the watchdog stops the server's group.
    Either way, within 20 s the port is free and no process the command started is left."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "out.log").open("w") as log:
        proc = subprocess.Popen([str(BIN / "lcfed"), "mlflow-server", "--port", str(port), "--store-dir",
                                 str(tmp_path)], stdout=log, stderr=subprocess.STDOUT,
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


ROUNDS = 2  # of each concurrent run


def _start_concurrent(tmp_path: Path, n: int) -> tuple[list[subprocess.Popen[bytes]], str]:
    """``n`` real ``lcfed run`` processes (:data:`ROUNDS` each) started at once on the sqlite file ``mlflow.db``."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    for i in range(n):
        with (tmp_path / f"r{i}.log").open("w") as log:
            procs.append(subprocess.Popen(
                [str(BIN / "lcfed"), "run", "--set", "data.dataset=digits", "--set", "data.num_devices=4",
                 "--set", f"train.rounds={ROUNDS}", "--set", "train.local_steps=2", "--set", "model.name=lenet5",
                 "--set", "method.name=fedavg", "--set", f"tracking.uri={uri}", "--set", f"tracking.run_name=r{i}",
                 "-q"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path, env=env))
    return procs, uri


def _check_concurrent(tmp_path: Path, procs: list[subprocess.Popen[bytes]], uri: str) -> None:
    """The runs of :func:`_start_concurrent` all exit 0, and the store holds them all FINISHED with every
    round's metrics."""
    import mlflow

    n = len(procs)
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
        assert {"loss/train_loss", "loss/test_loss", "accuracy/acc_mean"} <= set(run.data.metrics), run.data.metrics
        for key in run.data.metrics:
            if key.startswith("system/"):
                continue
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            assert steps == list(range(ROUNDS)), (run.info.run_name, key, steps)


def test_runs_racing_to_log_the_same_dataset_all_log_it(tmp_path):
    """Eight runs of one experiment log the same dataset at once (threads released by a barrier): the store
    looks the dataset up, then inserts it, so bare ``log_inputs`` fails for most of them; ``log_dataset``
    logs it on every run."""
    import threading

    import mlflow
    from mlflow.entities import Dataset, DatasetInput, InputTag

    from lcfed.tracking import log_dataset

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("race")
    runs = [client.create_run(exp).info.run_id for _ in range(8)]
    dataset = DatasetInput(Dataset(name="digits", digest="0123abcd", source_type="local", source="{}"),
                           tags=[InputTag("mlflow.data.context", "training")])
    barrier, errors = threading.Barrier(len(runs)), []

    def log(run_id: str) -> None:
        own = mlflow.MlflowClient(tracking_uri=uri)
        barrier.wait()
        try:
            log_dataset(own, run_id, dataset)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=log, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for run_id in runs:
        inputs = client.get_run(run_id).inputs.dataset_inputs
        assert [(d.dataset.name, d.dataset.digest) for d in inputs] == [("digits", "0123abcd")]


@pytest.mark.slow
def test_ten_concurrent_runs_on_a_fresh_sqlite_store(tmp_path):
    _check_concurrent(tmp_path, *_start_concurrent(tmp_path, 10))


def _start_run(tmp_path: Path, *sets: str) -> tuple[subprocess.Popen[str], str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [str(BIN / "lcfed"), "run", "-q", "--set", "data.num_devices=8", "--set", "train.rounds=5000",
            "--set", "train.local_steps=2", "--set", "method.num_clusters=3", "--set", "method.rank=4",
            "--set", f"tracking.uri={uri}", "--set", "tracking.experiment=guard"]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), uri


def _runs(uri: str) -> list:
    from lcfed.tracking.store import open_client

    client = open_client(uri)  # under the store's lock: the runs may be creating the database now
    exp = client.get_experiment_by_name("guard")
    return client.search_runs([exp.experiment_id]) if exp else []


def _steps(uri: str, run_id: str) -> int:
    from lcfed.tracking.store import open_client

    return len(open_client(uri).get_metric_history(run_id, "loss/train_loss"))


def _wait_for_rounds(proc: subprocess.Popen[str], uri: str, rounds: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        runs = _runs(uri)
        if runs and _steps(uri, runs[0].info.run_id) >= rounds:
            return
        time.sleep(0.3)
    raise AssertionError(f"no round {rounds - 1} logged (exit {proc.poll()}): {proc.stderr.read() if proc.poll() else ''}")


def _wait_closed(uri: str, timeout: float = 30) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _runs(uri)[0]
        if run.info.status != "RUNNING":
            return run
        time.sleep(0.5)
    raise AssertionError(f"the run is still RUNNING {timeout:.0f} s after its process died")


def test_concurrent_runs_on_a_fresh_sqlite_store_and_kill_9_of_one(tmp_path):
    """Three ``lcfed run`` processes started at once on one fresh sqlite file: two run to the end and are all
    recorded (:func:`_check_concurrent`); the third (its own experiment) is killed with ``kill -9`` after
    round 2, and is FAILED with the reason, not left RUNNING, keeping its metrics (one set of processes for
    both: each costs seconds; three race to create the store as ten do, with ``make test-slow``)."""
    killed, uri = _start_run(tmp_path, "checkpoint.dir=ck", "checkpoint.every=1000")
    procs, _ = _start_concurrent(tmp_path, 2)
    try:
        _wait_for_rounds(killed, uri, 2)
        killed.kill()
        killed.wait(timeout=10)
        run = _wait_closed(uri)
        assert run.info.status == "FAILED"
        reason = run.data.tags["failure_reason"]
        assert "ended without closing this run" in reason and "--resume" in reason
        assert _steps(uri, run.info.run_id) >= 2  # what was logged stays
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    _check_concurrent(tmp_path, procs, uri)


#: a FedAvg whose cluster is lost in round 3 (from 1) while the file ``cluster-dies`` exists (it removes it):
#: the round loop, the message, the exit code and the failure reason of a lost cluster, in-process
LOST_PLUGIN = """from pathlib import Path

from lcfed.run.faults import ClusterLost
from lcfed.methods.fedavg import FedAvg


class LostInRound3(FedAvg):
    def aggregate(self, state, plan, msgs):
        if plan.rnd == 2 and Path("cluster-dies").exists():
            Path("cluster-dies").unlink()
            raise ClusterLost("the raylet (pid 4242, killed by signal 9) of the private Ray this run started died")
        return super().aggregate(state, plan, msgs)
"""


def _logged_once(uri: str, run_id: str, rounds: int) -> None:
    """Every round of the run logged exactly once: the metrics of every round at steps 0 .. rounds - 1, and no
    metric twice at one step (some, e.g. LCFed's projections' bytes, start after round 1)."""
    import mlflow

    from lcfed.tracking import mlflow_key

    client = mlflow.MlflowClient(tracking_uri=uri)
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("system/")]
    every_round = {mlflow_key(k) for k in ("train_loss", "acc_mean", "bytes_up", "round_seconds", "coverage")}
    for key in keys:
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert len(set(steps)) == len(steps) and set(steps) <= set(range(rounds)), (key, steps)
        if key in every_round:
            assert steps == list(range(rounds)), (key, steps)
    assert every_round <= set(keys)


def test_the_lost_cluster_line_says_where_the_run_can_go_on_from():
    import pickle

    from lcfed.run.faults import ClusterLost

    what = "the raylet (pid 7, killed by signal 9) of the private Ray this run started died"
    lost = "the Ray cluster under this run was lost"
    cmd = "lcfed run --set checkpoint.dir=ck --resume"
    assert ClusterLost(what).describe(cmd) == (f"{lost} ({what}); run the command again (with --resume if "
                                               "checkpoint.dir holds a checkpoint)")
    assert ClusterLost(what).during(4, 0, None).describe(cmd) == (
        f"{lost} in round 5 ({what}); no checkpoint.dir is set, so the run starts again from round 1 (set one to "
        "make it resumable)")
    assert ClusterLost(what).during(0, 0, Path("ck/latest.pt")).describe(cmd) == (
        f"{lost} in round 1 ({what}); no checkpoint was written yet (ck): `{cmd}` starts it again")
    assert ClusterLost(what).during(1, 1, Path("ck/latest.pt")).describe() == (
        f"{lost} in round 2 ({what}); the last checkpoint holds round 1 (ck/latest.pt): continue with the same "
        "command with --resume")
    exc = ClusterLost(what).during(6, 6, Path("ck/latest.pt"))
    assert str(exc) == exc.describe() and "holds rounds 1-6 (ck/latest.pt)" in str(exc)
    back = pickle.loads(pickle.dumps(exc))  # whole across processes
    assert (back.round, back.checkpointed, back.checkpoint, str(back)) == (6, 6, Path("ck/latest.pt"), str(exc))


def test_a_lost_cluster_is_one_line_exit_3_and_the_failure_reason_then_resume_finishes(tmp_path, monkeypatch, capsys):
    from tune_jobs.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (tmp_path / "lostplug.py").write_text(LOST_PLUGIN)
    (tmp_path / "cluster-dies").write_text("")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["run", "-q", "--set", "method.name=lostplug:LostInRound3", "--set", "data.num_devices=4",
            "--set", "train.rounds=5", "--set", "train.local_steps=2", "--set", f"tracking.uri={uri}",
            "--set", "tracking.experiment=guard", "--set", "checkpoint.dir=ck"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    command = "lcfed " + " ".join(argv) + " --resume"
    line = ("the Ray cluster under this run was lost in round 3 (the raylet (pid 4242, killed by signal 9) of the "
            f"private Ray this run started died); the last checkpoint holds rounds 1-2 (ck/latest.pt): continue with "
            f"`{command}`")
    assert err.splitlines()[-1] == f"lcfed: run failed: {line}", err
    (run,) = _runs(uri)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == line
    assert _steps(uri, run.info.run_id) == 2

    assert main(argv + ["--resume"]) == 0  # the command the line gives
    (run,) = _runs(uri)
    assert run.info.status == "FINISHED"
    _logged_once(uri, run.info.run_id, 5)


# ~2 min (two private Rays); the line, exit code, failure reason and resume of a lost cluster: the test above
@pytest.mark.slow
def test_a_killed_raylet_is_one_line_exit_3_and_failed_with_the_reason_then_resume_finishes(tmp_path):
    """The raylet of the private Ray that `lcfed run --engine ray` started is killed mid-run: within seconds
    the run says what was lost, the last checkpoint and the command that continues it, exits 3 and is FAILED
    with that reason, the private Ray's processes are gone, and the command it gives finishes the run with
    every round logged once."""
    from lcfed.run import checkpoint

    rounds = 15
    proc, uri = _start_run(tmp_path, "engine.kind=ray", "engine.num_cpus=2", f"train.rounds={rounds}",
                           "checkpoint.dir=ck")
    try:
        _wait_for_rounds(proc, uri, 3)
        started = psutil.Process(proc.pid).children(recursive=True)
        raylets = [c for c in started if c.name() == "raylet"]
        assert len(raylets) == 1, [(c.pid, c.name()) for c in started]
        raylets[0].kill()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    assert "Traceback" not in err
    done = checkpoint.load(tmp_path / "ck" / "latest.pt").next_round
    assert 3 <= done < rounds
    (line,) = [x for x in err.splitlines() if x.startswith("lcfed:")]
    reason = line.removeprefix("lcfed: run failed: ")
    assert reason.startswith(f"the Ray cluster under this run was lost in round {done + 1} (the raylet (pid "
                             f"{raylets[0].pid}, killed by signal 9) of the private Ray this run started died); the "
                             f"last checkpoint holds rounds 1-{done} (ck/latest.pt): continue with `lcfed run "), line
    assert reason.endswith(" --resume`")
    (run,) = _runs(uri)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == reason
    assert _steps(uri, run.info.run_id) == done
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, f"left: {[(p.pid, p.name()) for p in alive]}"

    command = shlex.split(reason[reason.index("`") + 1 : -1])
    assert command[0] == "lcfed"
    resumed = subprocess.run([sys.executable, "-m", "tune_jobs", *command[1:]], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    (run,) = _runs(uri)
    assert run.info.status == "FINISHED"
    _logged_once(uri, run.info.run_id, rounds)
