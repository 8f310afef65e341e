"""Shared fixtures: tiny configs and a per-test sqlite MLflow store."""

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


@pytest.fixture
def tracking_uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def from_a_terminal(argv: list[str]) -> list[str]:
    """``argv`` run with SIGINT at its default, as a command typed in a terminal has it: a test runner
    started in the background of a non-interactive shell hands its children SIGINT ignored (and Python
    keeps it so), and a Ctrl-C test would then hang on a command that never saw the signal."""
    restore = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", restore, *argv]

