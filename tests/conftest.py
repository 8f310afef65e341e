"""Shared fixtures: tiny configs and a per-test sqlite MLflow store; the tiers' markers.

A test is marked by what it starts: ``ray`` (a Ray instance in the test's process), ``cluster`` (a
``ray start`` head or a simulated multi-node cluster), ``server`` (an MLflow or S3 server), ``subprocess``
(``lcfed`` or Python in a child process). Modules that start one for all their tests say so in
``pytestmark``; a test that starts one itself carries the mark; a test that uses a fixture starting one gets
the fixture's marks here. ``make test-core`` runs what has none."""

from __future__ import annotations

import math
import os
import sys

import pytest

from lcfed.config import ExperimentConfig, from_dict
from lcfed.overrides import apply_overrides, parse_override

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

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
    "installed": ("subprocess",), "_private_head": ("cluster",),
    "mlflow_server": ("server",), "server": ("server",), "running": ("server",), "s3": ("server",),
    "recorder": ("server",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            for mark in FIXTURE_MARKS.get(name, ()):
                item.add_marker(mark)


@pytest.fixture
def tracking_uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def from_a_terminal(argv: list[str]) -> list[str]:
    """``argv`` run with SIGINT at its default, as a command typed in a terminal has it: a test runner
    started in the background of a non-interactive shell hands its children SIGINT ignored (and Python
    keeps it so), and a Ctrl-C test would then hang on a command that never saw the signal."""
    restore = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", restore, *argv]

