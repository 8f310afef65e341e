"""Shared fixtures: tiny configs, a per-test sqlite MLflow store, a session's Ray head and MLflow server; the
tiers' markers.

A test is marked by what it starts: ``ray`` (a Ray instance in the test's process), ``cluster`` (a
``ray start`` head or a simulated multi-node cluster), ``server`` (an MLflow or S3 server), ``subprocess``
(``lcfed`` or Python in a child process). Modules that start one for all their tests say so in
``pytestmark``; a test that starts one itself carries the mark; a test that uses a fixture starting one gets
the fixture's marks here. ``make test-core`` runs what has none.

Heavy things a test only uses, never damages, are started once per test process (per xdist worker), on first
use, and stopped at its end: :func:`shared_head` (a ``ray start --head``) and :func:`mlflow_server` (a tracking
server; each test logs to an experiment of its own, :func:`mlflow_experiment`). A test that stops, kills or
reconfigures its cluster or server starts its own."""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from lcfed.config import ExperimentConfig, from_dict
from lcfed.config.overrides import apply_overrides, parse_override
from tests.raycluster import LocalCluster, alive, free_port, pids_marked

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# pytest keeps the test modules it rewrote (for its assertion messages) as bytecode only where this is off:
# with PYTHONDONTWRITEBYTECODE set, each test process rewrote every test module again, ~5 s of each collection
sys.dont_write_bytecode = False

TINY = {
    "data": {"dataset": "digits", "partition": "pathological", "classes_per_device": 2, "num_devices": 8},
    "train": {"rounds": 3, "local_steps": 3, "lr": 0.05},
    "method": {"name": "lcfed", "num_clusters": 3, "rank": 4},
    "engine": {"torch_threads": 1},
    "tracking": {"enabled": False},
}


def same_metrics(a: list[dict], b: list[dict]) -> None:
    """Two runs' histories agree row for row on every metric of ``a`` but the wall-clock round time (nan
    equals nan)."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        for key in ra:
            if key != "round_seconds":
                assert ra[key] == rb[key] or (math.isnan(ra[key]) and math.isnan(rb[key])), (key, ra[key], rb[key])


def same_history(a: list[dict], b: list[dict]) -> None:
    """:func:`same_metrics`, and the rows hold the same metrics."""
    assert [ra.keys() for ra in a] == [rb.keys() for rb in b]
    same_metrics(a, b)


def tiny_config(*extra: str) -> ExperimentConfig:
    """A federation that runs in a second or two (8 devices on digits, 3 rounds); extras as key=value."""
    return from_dict(apply_overrides(TINY, [parse_override(e) for e in extra]))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One small Ray for the module (:func:`start_test_ray`) with one logical GPU: actors get fractional GPUs on
    this CPU machine, and torch still runs on the CPU."""
    import ray

    start_test_ray(num_gpus=1)
    yield
    ray.shutdown()


def start_test_ray(**resources: float) -> None:
    """A test's own small Ray (``num_cpus=2`` unless given). ``address="local"``, as the product's private
    start: never an attach to a cluster named by Ray's address file, which a killed ``ray start --head``
    leaves behind (and which would then refuse our resources)."""
    import ray

    ray.init(address="local", **{"num_cpus": 2, **resources}, include_dashboard=False,
             object_store_memory=256 * 1024**2, log_to_driver=False)


#: fixtures that start something, and the marks a test using one gets
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "ray_cluster": ("ray",), "shared_ray": ("ray",), "ray_s3": ("ray",),
    "installed": ("subprocess",), "shared_head": ("cluster",),
    "mlflow_server": ("server",), "server": ("server",), "running": ("server",), "s3": ("server",),
    "recorder": ("server",),
}


#: rough seconds a test costs by what it starts: files are handed to the test processes heaviest first, so the
#: longest ones do not start last and leave the other processes idle at the end
MARK_COST = {"cluster": 30.0, "ray": 12.0, "server": 8.0, "subprocess": 5.0}


#: ``-m`` expressions of the form ``not a and not b ...`` (what ``make test`` and ``make test-core`` pass): the marks they
#: leave out
_ONLY_NOTS = re.compile(r"\s*not\s+\w+(\s+and\s+not\s+\w+)*\s*")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A test file whose module marks (its ``pytestmark`` line) ``-m`` leaves out is not imported at all: every test
    in it has those marks, and its imports (Ray Tune, moto, MLflow's server side) cost each test process seconds."""
    expr = config.getoption("markexpr") or ""
    if not collection_path.name.startswith("test_") or collection_path.suffix != ".py" or not _ONLY_NOTS.fullmatch(expr):
        return None
    left_out = set(re.findall(r"not\s+(\w+)", expr))
    line = next((x for x in collection_path.read_text().splitlines() if x.startswith("pytestmark")), "")
    return True if left_out & set(re.findall(r"pytest\.mark\.(\w+)", line.split("#", 1)[0])) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for mark in FIXTURE_MARKS.get(name, ()):
                item.add_marker(mark)
    cost: dict[Path, float] = defaultdict(float)
    for item in items:
        marks = {m.name for m in item.iter_markers()} & MARK_COST.keys()
        cost[item.path] += max((MARK_COST[m] for m in marks), default=0.05)
    items.sort(key=lambda item: -cost[item.path])  # stable: a file's tests keep their order


@pytest.fixture
def log_records() -> Iterator[list[logging.LogRecord]]:
    """The test's log records, of every level, as pytest's ``caplog`` would give them: the suite runs without
    pytest's logging plugin (pyproject.toml's ``-p no:logging``), which attached a handler to every
    non-propagating logger around each test phase, ~6 ms a test where Ray, MLflow and torch made ~750 loggers."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep, root = Keep(logging.DEBUG), logging.getLogger()
    loggers = [root, *(lg for lg in logging.Logger.manager.loggerDict.values()
                       if isinstance(lg, logging.Logger) and not lg.propagate)]
    level = root.level
    for lg in loggers:
        lg.addHandler(keep)
    root.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        root.setLevel(level)
        for lg in loggers:
            lg.removeHandler(keep)


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store, created once per test process: MLflow creates a new store's tables by running
    its ~60 schema migrations (about 2 s of CPU), which a user's store pays once, not once per run. A new store's
    first open, under a lock, is tested once: tests/test_lifecycle.py's concurrent runs on a fresh store."""
    from lcfed.tracking.store import open_client

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    open_client(f"sqlite:///{path}").search_experiments()
    return path


def store_copy(migrated_store: Path, directory: Path) -> str:
    """The URI of ``directory/mlflow.db``, a copy of :func:`migrated_store`: an empty store of the caller's own."""
    shutil.copyfile(migrated_store, directory / "mlflow.db")
    return f"sqlite:///{directory / 'mlflow.db'}"


@pytest.fixture
def tracking_uri(tmp_path: Path, migrated_store: Path) -> str:
    """A store of the test's own, in ``tmp_path`` (:func:`store_copy`)."""
    return store_copy(migrated_store, tmp_path)


def from_a_terminal(argv: list[str]) -> list[str]:
    """``argv`` run with SIGINT at its default, as a command typed in a terminal has it: a test runner
    started in the background of a non-interactive shell hands its children SIGINT ignored (and Python
    keeps it so), and a Ctrl-C test would then hang on a command that never saw the signal."""
    restore = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", restore, *argv]


@pytest.fixture(scope="session")
def shared_head() -> Iterator[LocalCluster]:
    """One ``ray start --head`` for this test process, started on first use: 2 CPUs, token auth, a job server on
    127.0.0.1 (``dashboard``), Ray's address file at ``base/ray/ray_current_cluster``. For tests that attach or
    submit to a running cluster and leave it as they found it: they must not count what others left on it (jobs,
    actors), only their own. At the end it is stopped through its process group and its marker, never
    ``ray stop``: an unrelated process named like Ray's daemons survives, and none of the cluster's is left."""
    cluster = LocalCluster.start(2, [], object_store_mb=200)
    try:
        cluster.wait_job_server()
        yield cluster
    finally:
        # a decoy named like Ray's daemons: stopping the cluster must not touch it (no kill-by-name)
        decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "gcs_server", "raylet"],
                                 start_new_session=True)
        try:
            stragglers = cluster.stop()
            decoy_alive = alive(decoy.pid)
        finally:
            decoy.kill()
            decoy.wait()
        assert decoy_alive, "stopping the test cluster killed an unrelated process"
        remaining = [p for p in pids_marked(str(cluster.token)) if alive(p)]
        assert not remaining, f"processes of the test cluster survived: {remaining}"
        if stragglers:
            print(f"\nSIGKILLed {len(stragglers)} straggler(s) of the shared test cluster: {stragglers}")


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store directory of :func:`mlflow_server`: ``mlflow.db`` and ``mlartifacts/<experiment id>/<run id>``."""
    return tmp_path_factory.mktemp("mlflow-server")


@pytest.fixture(scope="session")
def mlflow_server(mlflow_store: Path) -> Iterator[str]:
    """One MLflow tracking server on 127.0.0.1 for this test process, started on first use: its URL. For tests
    that only log to a running server, each to its own :func:`mlflow_experiment`; one that stops or restarts
    its server starts its own."""
    from tune_jobs.mlflow_server import start_mlflow_server, stop

    proc, url = start_mlflow_server("127.0.0.1", free_port(), mlflow_store)
    try:
        yield url
    finally:
        stop(proc)
        assert proc.poll() is not None


@pytest.fixture
def mlflow_experiment(request: pytest.FixtureRequest) -> str:
    """An MLflow experiment name of this test's own (its name and a random suffix), so that a test logging to
    the shared :func:`mlflow_server` sees only its own runs."""
    return f"{re.sub(r'[^A-Za-z0-9_-]+', '-', request.node.name)[:80]}-{secrets.token_hex(4)}"
