"""The per-device validation split (``data.val_fraction``): carved from each device's training share,
seeded per device, scored on evaluation rounds as ``val_*``; off by default, leaving runs unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lcfed.data import Dataset, Scaling, format_stats, partition_stats, split_validation
from lcfed.engines.hosted import HostedDevices
from lcfed.engines.local import LocalPool, LocalServer, run_local
from lcfed.errors import ConfigError
from lcfed.run.loop import run_rounds
from lcfed.run.result import RunResult
from lcfed.run.setup import prepare
from lcfed.run.sources import load, partition
from tests.conftest import tiny_config

VAL = "data.val_fraction=0.25"
VAL_KEYS = ("val_acc_mean", "val_acc_weighted", "val_loss")


def _same(a: list[dict], b: list[dict], skip: tuple[str, ...] = ()) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for key in ra:
            if key == "round_seconds" or key.startswith(skip):
                continue
            assert ra[key] == rb[key] or (math.isnan(ra[key]) and math.isnan(rb[key])), (key, ra[key], rb[key])


@pytest.fixture(scope="module")
def val_run() -> RunResult:
    return run_local(tiny_config(VAL))


def test_split_sizes_and_disjointness():
    cfg = tiny_config(VAL)
    ds = load(cfg)
    base, part = partition(tiny_config(), ds), partition(cfg, ds)
    assert base.val == () and len(part.val) == cfg.data.num_devices
    np.testing.assert_array_equal(part.groups, base.groups)
    for d in range(cfg.data.num_devices):
        train, val, test = part.train[d], part.val[d], part.test[d]
        np.testing.assert_array_equal(test, base.test[d])  # the test split is untouched
        np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.sort(base.train[d]))
        assert len(val) == math.floor(len(base.train[d]) * 0.25 + 0.5) >= 1 and len(train) >= 1
        assert not set(train) & set(val) and not set(val) & set(test) and not set(train) & set(test)
    assert part.sizes().tolist() == [len(t) for t in part.train]  # aggregation weights: remaining train rows
    stats = partition_stats(part, ds.y)
    assert stats["samples"] == partition_stats(base, ds.y)["samples"]
    assert stats["val_min"] >= 1 and "val_min" not in partition_stats(base, ds.y)
    assert " val " in format_stats(stats)


def test_split_is_seeded_per_device():
    ds = load(tiny_config())
    base = partition(tiny_config(), ds)
    a, b = split_validation(base, 0.25, seed=0), split_validation(base, 0.25, seed=0)
    other = split_validation(base, 0.25, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a.val, b.val, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.train, b.train, strict=True))
    assert any(not np.array_equal(x, y) for x, y in zip(a.val, other.val, strict=True))
    # a device's split depends on its own samples only, not on the other devices
    alone = split_validation(type(base)(base.train[:1], base.test[:1], base.groups[:1]), 0.25, seed=0)
    np.testing.assert_array_equal(alone.val[0], a.val[0])


def test_scaling_is_fitted_on_the_remaining_train_rows():
    cfg = tiny_config(VAL)
    ds = load(cfg)
    setup = prepare(cfg, ds)
    part = setup.partition
    assert setup.scaling == Scaling.fit(ds.x, np.concatenate(part.train))
    assert setup.scaling != Scaling.fit(ds.x, np.concatenate([*part.train, *part.val]))
    assert setup.federation.train_sizes.tolist() == part.sizes().tolist()


def test_val_fraction_zero_leaves_runs_bit_identical():
    default, zero = tiny_config("train.rounds=2"), tiny_config("train.rounds=2", "data.val_fraction=0")
    assert default.digest() == zero.digest() != tiny_config("train.rounds=2", VAL).digest()
    a, b = run_local(default), run_local(zero)
    _same(a.history, b.history)
    assert not any(k.startswith("val_") for row in a.history for k in row)


def test_val_metrics_are_reported_apart_from_test(val_run):
    evals = [row for row in val_run.history if "acc_mean" in row]
    assert evals and all(all(k in row for k in VAL_KEYS) for row in evals)
    assert all(0 <= row["val_acc_mean"] <= 1 and row["val_loss"] > 0 for row in evals)
    assert any(row["val_acc_mean"] != row["acc_mean"] for row in evals)
    assert any(row["val_loss"] != row["test_loss"] for row in evals)
    # every counted device has a validation result
    assert all(r.val is not None and r.val.total >= 1 for r in val_run.evaluation.values())


def test_poisoned_test_labels_change_only_test_metrics(val_run):
    """Test labels reach no val_* metric and no training: only acc_* and test_loss move."""
    cfg = tiny_config(VAL)
    ds = load(cfg)
    setup = prepare(cfg, ds)  # the partition from the true labels, as the poison comes after it
    rows = np.concatenate(setup.partition.test)
    y = ds.y.copy()
    y[rows] = (y[rows] + 1) % ds.num_classes
    poisoned = Dataset(ds.name, ds.x, y, ds.num_classes)
    hosted = HostedDevices(setup, range(setup.federation.num_devices), poisoned)
    try:
        server = LocalServer(setup.strategy())
        result = run_rounds(cfg, setup.federation, server, LocalPool(hosted))
    finally:
        hosted.close()
    _same(val_run.history, result.history, skip=("acc_", "test_loss"))
    evals = [(a, b) for a, b in zip(val_run.history, result.history, strict=True) if "acc_mean" in a]
    assert all(a["acc_mean"] != b["acc_mean"] and a["test_loss"] != b["test_loss"] for a, b in evals)


@pytest.mark.parametrize("value", ["0.01", "0.99"])
def test_a_device_without_train_or_val_sample_is_a_config_error(value):
    cfg = tiny_config(f"data.val_fraction={value}", "data.partition=dirichlet", "data.num_devices=60")
    with pytest.raises(ConfigError, match=r"data\.val_fraction.*device \d+") as err:
        prepare(cfg)
    assert err.value.field == "data.val_fraction"


@pytest.mark.parametrize("value", ["-0.1", "1.0", "1.5"])
def test_val_fraction_outside_its_range_is_refused(value):
    with pytest.raises(ConfigError, match=r"data\.val_fraction.*\[0, 1\)"):
        tiny_config(f"data.val_fraction={value}")
