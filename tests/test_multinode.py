"""The cluster path on a real multi-node Ray cluster on this machine, shaped like ``cluster.yaml``.

One cluster for the module: a CPU-only head (1 CPU, the dataset in its ``~/data``) and two workers with 1 CPU
and 1 logical GPU each (the least that spreads actors over the head and workers: each node, and each CPU, costs
processes), which do not see the head's data directory (an empty tmpfs over it in their own mount
namespace, as on machines without the head's disk), where importing ``mlflow`` fails (so a trial or actor
that tried to talk to MLflow would error), and whose environment asks torch for baseline kernels
(``OTHER_CPU``, as another CPU would pick other kernels than the head's). ``lcfed`` commands run as drivers
on the head, attached through ``RAY_ADDRESS`` as inside a submitted job, without ``RAY_AUTH_MODE`` in their
environment. An S3-compatible server (moto) runs on 127.0.0.1; the runs that are
tracked log to the test process's shared MLflow server (:func:`tests.conftest.mlflow_server`), each test to an
experiment of its own. The cluster is the module's own, not the shared head: its shape is what is tested.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import pytest
import yaml

from lcfed import numerics
from lcfed.config import load_config
from lcfed.data import import_idx
from lcfed.engines.local import run_local
from tests.conftest import from_a_terminal
from tests.raycluster import ROOT, LocalCluster
from tests.s3server import S3Server
from tests.test_data import write_mnist_dir
from tune_jobs.cli import main

pytestmark = [pytest.mark.timeout(900), pytest.mark.cluster, pytest.mark.server, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out

CONFIG = {
    "name": "mn",
    "data": {"dataset": "mnist", "data_dir": "~/data", "partition": "pathological", "classes_per_device": 2,
             "num_devices": 8},
    "model": {"name": "lenet5"},
    "train": {"rounds": 3, "local_steps": 2, "lr": 0.05},
    "method": {"name": "lcfed", "num_clusters": 2, "rank": 4},
    "engine": {"kind": "ray", "torch_threads": 1},
    "tracking": {"enabled": False},
}


#: the workers' environment asks torch for other kernels than the head's, as another CPU would pick
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"}


@dataclass
class Env:
    cluster: LocalCluster
    s3: S3Server
    mlflow_url: str
    home: Path  # the head's HOME: ~/data has the dataset
    config: Path

    def lcfed(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """An ``lcfed`` driver on the head, attached as a submitted job is (``RAY_ADDRESS``)."""
        env = self.cluster.client_env(self.home, RAY_ADDRESS=self.cluster.gcs, **self.s3.env)
        return subprocess.run([sys.executable, "-m", "tune_jobs", *args], env=env, cwd=self.home,
                              capture_output=True, text=True, timeout=timeout)

    def lcfed_each(self, *commands: list[str]) -> list[tuple[int, str, str]]:
        """Each command's (exit code, stdout, stderr) from ``tune_jobs.cli.main`` called in turn in ONE driver
        process on the head, attached as :meth:`lcfed` is: a process, an attach and each node's probe workers per
        command saved (``python -m tune_jobs`` is ``sys.exit(main())``; ``lcfed run`` as a process attached through
        ``RAY_ADDRESS``: tests/test_attached_head.py, tests/test_head.py)."""
        code = ("import json, sys\nfrom tune_jobs.cli import main\n"
                "for argv in json.loads(sys.argv[1]):\n"
                "    print('@@start', flush=True)\n"
                "    print('@@start', file=sys.stderr, flush=True)\n"
                "    rc = main(argv)\n"
                "    sys.stdout.flush()\n"
                "    print(f'@@exit {rc}', file=sys.stderr, flush=True)\n")
        env = self.cluster.client_env(self.home, RAY_ADDRESS=self.cluster.gcs, **self.s3.env)
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], env=env, cwd=self.home,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        outs, errs = proc.stdout.split("@@start\n")[1:], proc.stderr.split("@@start\n")[1:]
        assert len(outs) == len(errs) == len(commands), proc.stdout[-2000:] + proc.stderr[-4000:]
        done = [err.rstrip("\n").rpartition("@@exit ") for err in errs]
        return [(int(rc), out, err) for out, (err, _, rc) in zip(outs, done, strict=True)]

    def node_ids(self) -> dict[str, bool]:
        """Each alive node's Ray id -> whether it is the head, from the head's dashboard (no driver to start)."""
        request = urllib.request.Request(f"{self.cluster.dashboard}/api/v0/nodes?limit=100",
                                         headers={"Authorization": f"Bearer {self.cluster.token.read_text().strip()}"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            nodes = json.load(resp)["data"]["result"]["result"]
        return {str(n["node_id"]): bool(n["is_head_node"]) for n in nodes if n["state"] == "ALIVE"}

    def popen(self, log: Path, *args: str) -> subprocess.Popen[bytes]:
        env = self.cluster.client_env(self.home, RAY_ADDRESS=self.cluster.gcs, **self.s3.env)
        with open(log, "wb") as out:
            return subprocess.Popen(from_a_terminal([sys.executable, "-m", "tune_jobs", *args]), env=env, cwd=self.home,
                                    stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, mlflow_server: str) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("mn")
    blocker = tmp / "no-mlflow" / "mlflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('mlflow imported on a worker node')\n")
    with S3Server() as s3:
        cluster = LocalCluster.start(1, [(1, 1)] * 2, env=s3.env, worker_hidden=["home-head/data"],
                                     worker_env={"PYTHONPATH": str(blocker.parent), **OTHER_CPU})
        try:
            assert cluster.head is not None
            home = cluster.head.home
            write_mnist_dir(tmp / "idx", n_train=400, n_test=100)
            import_idx(home / "data", [tmp / "idx"])
            config = home / "mn.yaml"
            config.write_text(yaml.safe_dump(CONFIG))
            yield Env(cluster, s3, mlflow_server, home, config)
        finally:
            left = cluster.stop()
            assert not left or print(f"SIGKILLed {len(left)} straggler(s) of the test cluster")


#: asynchronous LCFed on simulated devices, GPU actors by default; 6 devices: three actors (blocks of 2), two on a
#: worker, one on the other
GPU_ASYNC = ["train.participation=0.5", "method.rank=2", "devices.simulate=true", "devices.aggregation=async",
             "devices.async_buffer=2", "devices.speed_sigma=1.0", "devices.availability=diurnal",
             "devices.online_fraction=0.6", "devices.dropout=0.2", "engine.data_reads=driver", "data.num_devices=6"]
#: CPU-only actors, one per CPU of the cluster (the head's 1 and each worker's 1), so one is on the head whatever
#: node the placement group tries first (with 2, both were once placed on the workers)
HEAD_DATA = ["train.rounds=2", "engine.gpus_per_actor=0", "engine.num_actors=3"]


@pytest.fixture(scope="module")
def driver(env: Env, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Runs with :data:`GPU_ASYNC` and :data:`HEAD_DATA` (their summaries ``tmp/gpu.json``, ``tmp/auto.json``),
    then the commands the cluster refuses, each's (exit code, stdout, stderr), from one driver
    (:meth:`Env.lcfed_each`); ``tmp``: the sweep's --storage and tracking store are in it."""
    tmp = tmp_path_factory.mktemp("driver")
    run = ["run", "--config", str(env.config), "--no-track", "-q"]
    commands = {
        "gpu": [*run, "--json", str(tmp / "gpu.json"), *[a for s in GPU_ASYNC for a in ("--set", s)]],
        "auto": [*run, "--json", str(tmp / "auto.json"), *[a for s in HEAD_DATA for a in ("--set", s)]],
        "sweep": ["sweep", "--config", str(env.config), "--space", "mu_lambda.yaml", "--storage", str(tmp / "tune"),
                  "--set", f"tracking.uri=sqlite:///{tmp / 'm.db'}"],
        "nodes": [*run, *[a for s in [*HEAD_DATA, "engine.data_reads=nodes"] for a in ("--set", s)]],
        "unplaceable": [*run, "--set", "engine.num_actors=4", "--set", "engine.gpus_per_actor=1",
                        "--set", "engine.placement_timeout_s=3"],
    }
    return {**dict(zip(commands, env.lcfed_each(*commands.values()), strict=True)), "tmp": tmp}


def _in_process(env: Env, *sets: str):
    cfg = load_config(str(env.config), [f"data.data_dir={env.home / 'data'}", "engine.kind=local", *sets])
    return run_local(cfg)


def test_run_places_device_actors_on_gpu_workers_and_matches_in_process(env: Env, driver):
    """Default engine settings place the device actors on the GPU workers; asynchronous LCFed on devices that come
    and go there (the queue lives in the server actor on the head) has the in-process clock and numbers; the
    workers' samples are sent by the driver, as engine.data_reads=driver says."""
    code, stdout, stderr = driver["gpu"]
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    summary = json.loads((driver["tmp"] / "gpu.json").read_text())
    actors = summary["placement"]["device_actors"]
    # every device actor on a GPU worker, sharing its GPU fractionally, over more than one worker
    assert actors and all(a["node_gpus"] == 1 and 0 < a["gpus"] < 1 for a in actors)
    assert len({a["node_id"] for a in actors}) > 1
    assert sum(a["devices"] for a in actors) == 6
    assert summary["placement"]["server"]["node_gpus"] == 0  # the server stays on the head, by the driver
    assert "placement" in stdout and "device actors" in stdout
    # the workers do not see the head's data: the driver sends their actors' samples, and the numbers are the same;
    # the workers' environment asks for baseline kernels, and their actors run the portable ones all the same
    assert summary["placement"]["data_reads"] == "driver" and "samples sent by the driver" in stdout
    assert summary["provenance"]["kernels"] == numerics.kernel_level() and "numerics_note" not in summary["provenance"]
    local = _in_process(env, *GPU_ASYNC)
    for key in ("sim_clock_seconds", "staleness_mean", "devices_kept", "acc_mean", "acc_weighted", "train_loss",
                "test_loss"):
        assert summary[key] == local.final[key], key


def test_data_on_the_head_only_is_read_there_and_sent_to_the_workers_actors(env: Env, driver):
    """CPU-only actors on the head and on the workers, which do not see the head's data directory: with
    ``engine.data_reads=auto`` the head's actors read their rows of its cache file and the driver sends the
    workers' actors theirs, with the in-process numbers (``driver``, which sends them all: the device model's test
    below). ``nodes`` is refused in one line naming a worker, before any actor starts."""
    code, stdout, stderr = driver["auto"]
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    summary = json.loads((driver["tmp"] / "auto.json").read_text())
    place = summary["placement"]
    head = place["server"]["node_id"]  # the server stays on the head
    by_node = {(a["node_id"] == head, a["samples"]) for a in place["device_actors"]}
    assert place["data_reads"] == "mixed" and by_node == {(True, "node"), (False, "driver")}, place
    on_head = sum(a["node_id"] == head for a in place["device_actors"])
    line = f"read on the nodes by {on_head} actor(s), sent by the driver to {len(place['device_actors']) - on_head}"
    assert line in stdout, stdout
    local = _in_process(env, *HEAD_DATA)
    for key in ("acc_mean", "acc_weighted", "train_loss", "test_loss"):
        assert summary[key] == local.final[key], key
    code, _, err = driver["nodes"]  # these sets and engine.data_reads=nodes
    err = err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "engine.data_reads=nodes: node(s) " in err and "do not see" in err and head[:8] not in err, err
    workers = {n[:8] for n, is_head in env.node_ids().items() if not is_head}
    assert any(w in err for w in workers), (workers, err)


@pytest.mark.slow  # ~25 s; the fast suite keeps state per host and checkpoints of trained devices only: test_scale.py
def test_each_actor_holds_only_its_own_devices_and_the_server_none(env: Env):
    """Many devices, a quarter of them per round: each device actor holds the samples of its own block
    of devices only and the states of those of them that trained, on its worker node; the stored
    states add up to the devices that trained; the server and the driver hold no model per device."""
    m = 60
    proc = subprocess.run(
        [sys.executable, "-m", "tests.holdings_driver", str(env.config), f"data.data_dir={env.home / 'data'}",
         f"data.num_devices={m}", "data.min_samples=4", "train.participation=0.25", "train.rounds=2",
         "engine.actors_per_gpu=1", "engine.data_reads=driver"],  # the samples sent by the driver, across nodes
        env=env.cluster.client_env(env.home, RAY_ADDRESS=env.cluster.gcs), cwd=ROOT, capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    actors, server = out["holdings"]["device_actors"], out["holdings"]["server"]
    names = env.cluster.node_names()
    assert {names[a["node_id"]] for a in actors} == {"w0", "w1"}  # the devices are spread over the workers
    blocks = [set(a["devices"]) for a in actors]
    assert sum(map(len, blocks)) == m and set().union(*blocks) == set(range(m))
    for a, block in zip(actors, blocks, strict=True):
        assert set(a["data_devices"]) == block and 0 < a["data_rows"] < 500  # its devices' samples, not all 500
        assert set(a["state_devices"]) <= block
    trained = set(out["trained"])
    held = [d for a in actors for d in a["state_devices"]]
    assert 15 <= len(trained) < m and sorted(held) == sorted(trained)  # one stored state per trained device
    assert len({a["node_id"] for a in actors if a["state_devices"]}) == 2
    model = out["model_bytes"]
    # the server: Φ, K = 2 centers and their codes, the D = 4 rows of the projector (8 models in all, whatever m)
    # and a device -> cluster assignment (8 bytes a device)
    assert names[server["node_id"]] == "head" and server["state_bytes"] < 9 * model + 8 * m
    assert server["per_device"] == {"assignment": 8 * m}
    # the driver: the initial model, no state of any device (those that trained would be >= 15 models)
    assert out["driver_tensor_bytes"] < 3 * model, out["driver_tensor_bytes"] / model
    print(f"\nholdings: {[(names[a['node_id']], len(a['devices']), len(a['state_devices'])) for a in actors]}; "
          f"server {server['state_bytes'] / model:.1f} models; driver {out['driver_tensor_bytes'] / model:.1f} models")


def test_unplaceable_pool_fails_with_the_ask_and_the_cluster(driver):
    code, _, err = driver["unplaceable"]  # 4 actors of a whole GPU each, waiting 3 s
    assert code == 2, err[-3000:]
    err = err.strip()
    assert "Traceback" not in err and "engine.placement_timeout_s" in err
    assert "4 device actor(s) x {CPU: 0.5, GPU: 1}" in err and "3 alive node(s)" in err, err


def test_sweep_refuses_node_local_storage_on_a_multi_node_cluster(driver):
    code, _, err = driver["sweep"]  # --storage a local path, tracking to a local sqlite file
    tmp = driver["tmp"]
    assert code == 2, err[-3000:]
    assert "--storage" in err and "3 nodes" in err and "s3://" in err
    assert not (tmp / "tune").exists() and not (tmp / "m.db").exists()


def _children(client: mlflow.MlflowClient, exp_name: str) -> list:
    exp = client.get_experiment_by_name(exp_name)
    if exp is None:
        return []
    return [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]


@pytest.mark.slow  # ~2 min; trials on the workers, S3 storage and MLflow through the driver: the plugin sweep below
def test_sweep_on_workers_logs_through_the_driver_and_resumes_from_s3(env: Env, tmp_path: Path, mlflow_experiment: str):
    space = tmp_path / "space.yaml"
    space.write_text("method.mu: {grid: [0.0, 0.01, 0.1, 1.0]}\n")
    storage = env.s3.uri("sweeps")
    args = ["sweep", "--config", str(env.config), "--space", str(space), "--scheduler", "fifo",
            "--gpus-per-trial", "0.5", "--storage", storage, "--name", "mnsweep",
            "--set", "engine.cpus_per_actor=0.5", "--set", "checkpoint.every=1", "--set", "tracking.enabled=true",
            "--set", f"tracking.uri={env.mlflow_url}", "--set", f"tracking.experiment={mlflow_experiment}"]
    client = mlflow.MlflowClient(tracking_uri=env.mlflow_url)
    log = tmp_path / "first.log"
    first = env.popen(log, *args)
    try:  # interrupt once a trial is past its first round (its checkpoint is in S3)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and first.poll() is None:
            if any(m.step >= 1 for r in _children(client, mlflow_experiment)
                   for m in client.get_metric_history(r.info.run_id, "loss/train_loss")):
                break
            time.sleep(1)
        assert first.poll() is None, log.read_text()[-4000:]
        first.send_signal(signal.SIGINT)
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the sweep did not stop on SIGINT:\n{log.read_text()[-4000:]}") from None
    finally:
        if first.poll() is None:
            first.kill()
    out = tmp_path / "sweep.json"
    again = env.lcfed(*args, "--resume", "--json", str(out))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert summary["trials"] == 4 and summary["errors"] == 0  # no trial imported mlflow on a worker
    assert summary["storage"] == f"{storage}/mnsweep"
    assert set(summary["best_config"]) == {"method.mu"}
    keys = env.s3.list("sweeps/mnsweep/")
    assert any(k.endswith("tuner.pkl") for k in keys) and any("/checkpoint_" in k for k in keys)

    children = _children(client, mlflow_experiment)
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    workers = {c.data.tags["placement.trial_node"] for c in children}
    for child in children:
        steps = {m.step for m in client.get_metric_history(child.info.run_id, "loss/train_loss")}
        assert steps == {0, 1, 2}, (child.info.run_name, steps)
        assert "accuracy/acc_mean" in child.data.metrics
        assert child.data.tags["placement.device_nodes"] == child.data.tags["placement.trial_node"]
        arts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"placement.json", "plots", "metrics"} <= arts
        place = json.loads(Path(client.download_artifacts(child.info.run_id, "placement.json", str(tmp_path))).read_text())
        assert all(a["node_gpus"] == 1 for a in place["device_actors"])  # trials ran on GPU workers
    assert len(workers) >= 2  # spread over the workers
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED"
    # the resumed sweep is the same one: one parent run, the interrupted trials' runs continued
    exp = client.get_experiment_by_name(mlflow_experiment)
    assert len(client.search_runs([exp.experiment_id])) == 5
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    print(f"\nsweep placement: {sorted(w[:8] for w in workers)}; root {ROOT}")


@pytest.mark.slow  # ~2 min; the storage refusal and trials on workers are also covered by the sweep tests above
def test_compare_needs_a_storage_every_node_reaches_and_runs_on_the_workers(env: Env, tmp_path: Path,
                                                                            mlflow_experiment: str):
    """`lcfed compare` as a job's driver: without a shared --storage it is refused before any file or run
    exists; with one (S3) both phases run their trials on the GPU workers and the report is written."""
    spaces = tmp_path / "spaces"
    spaces.mkdir()
    (spaces / "lcfed.yaml").write_text("method.mu: {loguniform: [0.01, 1.0]}\n")
    (spaces / "standalone.yaml").write_text("train.lr: {loguniform: [0.02, 0.1]}\n")
    out = tmp_path / "out"
    args = ["compare", "--config", str(env.config), "--methods", "lcfed,standalone", "--budget", "1", "--seeds", "2",
            "--space-dir", str(spaces), "--scheduler", "fifo", "--gpus-per-trial", "0.5", "--out", str(out),
            "--set", "engine.cpus_per_actor=0.5", "--set", "tracking.enabled=true",
            "--set", f"tracking.uri={env.mlflow_url}", "--set", f"tracking.experiment={mlflow_experiment}"]
    client = mlflow.MlflowClient(tracking_uri=env.mlflow_url)
    refused = env.lcfed(*args)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "--storage" in refused.stderr and "3 nodes" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists() and client.get_experiment_by_name(mlflow_experiment) is None

    done = env.lcfed(*args, "--storage", env.s3.uri("compare"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    rows = {r["method"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert set(rows) == {"lcfed", "standalone"} and all(r["seed_0"] and r["seed_1"] for r in rows.values())
    trials = [r for r in _children(client, mlflow_experiment) if "tune_trial_id" in r.data.tags]
    assert len(trials) == 2 + 4 and all(t.info.status == "FINISHED" for t in trials)  # 1 trial + 2 seeds per method
    names = env.cluster.node_names()
    assert {names[t.data.tags["placement.trial_node"]] for t in trials} <= {"w0", "w1"}  # GPU workers only
    assert any(k.startswith("compare/out-lcfed-seeds/") for k in env.s3.list("compare/"))


#: appended to the plugin module: each process that imports it says where from (its node's HOME, its file)
_IMPORT_PROBE = """
import json as _json, os as _os
with open(_os.environ["LCFED_TEST_IMPORTS"], "a") as _f:
    _f.write(_json.dumps({"home": _os.environ.get("HOME"), "file": __file__}) + "\\n")
"""


def test_a_plugin_in_the_jobs_working_directory_runs_in_trials_on_the_workers(env: Env, tmp_path: Path,
                                                                              mlflow_experiment: str,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              capsys: pytest.CaptureFixture[str]):
    """``lcfed submit -- lcfed sweep --set method.name=mymethods:FedProx``: the plugin exists only in the
    submitted directory; the workers' Python path does not have it (Ray adds the driver's directory only
    without a job working directory), so the trials import it from what Ray shipped, on the GPU workers."""
    work = tmp_path / "work"
    work.mkdir()
    source = (ROOT / "examples" / "lcfed-example-plugin" / "lcfed_example" / "fedprox.py").read_text()
    (work / "mymethods.py").write_text(source.replace("    compare_space", "    # compare_space") + _IMPORT_PROBE)
    (work / "mn.yaml").write_text(env.config.read_text())
    (work / "space.yaml").write_text("method.mu: {grid: [0.5]}\n")  # one trial: the import is per trial process
    imports = tmp_path / "imports.jsonl"
    entry = ["lcfed", "sweep", "--config", "mn.yaml", "--space", "space.yaml", "--scheduler", "fifo",
             "--gpus-per-trial", "0.5", "--storage", env.s3.uri("plugin"), "--name", "plugin",
             "--set", "method.name=mymethods:FedProx", "--set", "engine.cpus_per_actor=0.5", "--set", "train.rounds=1",
             "--set", "tracking.enabled=true", "--set", f"tracking.uri={env.mlflow_url}",
             "--set", f"tracking.experiment={mlflow_experiment}"]
    # the job client in this process (as tests/test_jobs.py submits): it talks HTTP to the job server, no Ray here
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(env.cluster.token))
    for name in ("RAY_AUTH_TOKEN", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    code = main(["submit", "--address", env.cluster.dashboard, "--working-dir", str(work),
                 "--env", f"LCFED_TEST_IMPORTS={imports}", "--", *entry])
    out, err = capsys.readouterr()
    assert code == 0, out[-4000:] + err[-3000:]
    assert "1/1 trials ended" in out

    client = mlflow.MlflowClient(tracking_uri=env.mlflow_url)
    trials = [r for r in _children(client, mlflow_experiment) if "tune_trial_id" in r.data.tags]
    assert len(trials) == 1 and all(t.info.status == "FINISHED" for t in trials)
    assert {t.data.params["method.name"] for t in trials} == {"mymethods:FedProx"}
    assert {t.data.params["method.mu"] for t in trials} == {"0.5"}
    placed = {t.data.tags["placement.trial_node"] for t in trials}
    assert placed and not any(env.node_ids()[n] for n in placed)  # on the GPU workers, not the head
    seen = [json.loads(line) for line in imports.read_text().splitlines()]
    on_workers = [s for s in seen if Path(s["home"]).name != env.home.name]
    assert on_workers, seen  # imported in the trials on worker nodes ...
    assert all(Path(s["file"]).parent != work and "runtime_resources" in s["file"] for s in seen), seen  # ... as shipped
    print(f"\nplugin trials on {sorted(p[:8] for p in placed)}; imported by {len(seen)} process(es): "
          f"{sorted({Path(s['home']).name for s in seen})}")
