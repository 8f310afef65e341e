"""Devices that never trained (``data.holdout_fraction``): a seeded share of the devices sits out every
round, joins the final models after the last one and is scored apart (``acc_new_*``); off by default,
leaving configs, partitions and runs unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.methods.base import select_devices
from lcfed.run.sources import held_out_devices
from lcfed.tracking import partition_digest
from tests.conftest import tiny_config

HOLD = "data.holdout_fraction=0.25"  # 2 of the 8 tiny devices
NEW = ("acc_new_mean", "acc_new_weighted")
DIGEST, PARTITION_DIGEST = "866c388805216207", "499b5e7ed65a"  # tiny_config()'s, before holdout_fraction existed


def test_held_out_set_is_seeded_and_sized():
    held = held_out_devices(tiny_config(HOLD))
    assert len(held) == 2 and list(held) == sorted(set(held)) and all(0 <= d < 8 for d in held)
    assert held_out_devices(tiny_config(HOLD)) == held
    assert {held_out_devices(tiny_config(HOLD, f"seed={s}")) for s in range(6)} != {held}
    assert len(held_out_devices(tiny_config("data.holdout_fraction=0.5"))) == 4
    assert held_out_devices(tiny_config()) == ()


def test_participants_never_include_held_out_devices():
    held = (1, 5)
    for rnd in range(20):
        picked = select_devices(8, 0.5, 0, rnd, held)
        assert len(picked) == 3 and not set(picked) & set(held)  # ceil(0.5 x 6 training devices)
    assert select_devices(8, 1.0, 0, 0, held) == (0, 2, 3, 4, 6, 7)
    assert select_devices(8, 0.5, 0, 3) == select_devices(8, 0.5, 0, 3, ())  # no exclusion: the old draw


@pytest.fixture(scope="module", params=["fedavg", "lcfed"])
def held_run(request):
    cfg = tiny_config(f"method.name={request.param}", HOLD)
    return cfg, run_local(cfg)


def test_held_out_devices_never_train_and_are_not_counted(held_run):
    cfg, res = held_run
    held = list(held_out_devices(cfg))
    assert res.trained is not None and not res.trained[held].any() and res.trained.sum() == 6
    assert all(row["coverage"] == 1.0 for row in res.history)  # every training device took part
    if res.assignment is not None:
        assert (res.assignment[held] == -1).all()
    # acc_mean counts only the trained devices
    acc = [res.evaluation[d].correct / res.evaluation[d].total for d in range(8) if d not in held]
    assert res.final["acc_mean"] == pytest.approx(float(np.mean(acc)), abs=1e-12)


def test_newcomer_accuracy_on_the_final_row_only(held_run):
    _, res = held_run
    assert all(k in res.final and k in res.history[-1] for k in NEW)
    assert not any(k in row for row in res.history[:-1] for k in NEW)
    assert all(0 <= res.final[k] <= 1 for k in NEW)


def test_standalone_newcomers_train_from_the_initial_model():
    res = run_local(tiny_config("method.name=standalone", HOLD, "train.rounds=1"))
    assert all(0 <= res.final[k] <= 1 for k in NEW)


def test_holdout_zero_leaves_digests_and_runs_unchanged():
    default, zero = tiny_config("train.rounds=1"), tiny_config("train.rounds=1", "data.holdout_fraction=0")
    # the digests of the tiny config before data.holdout_fraction existed
    assert tiny_config().digest() == DIGEST and partition_digest(tiny_config()) == PARTITION_DIGEST
    assert default.digest() == zero.digest() != tiny_config("train.rounds=1", HOLD).digest()
    assert partition_digest(default) == partition_digest(zero) != partition_digest(tiny_config(HOLD))
    a, b = run_local(default), run_local(zero)
    assert len(a.history) == len(b.history)
    for ra, rb in zip(a.history, b.history, strict=True):
        assert ra.keys() == rb.keys() and not any(k in ra for k in NEW)
        for key in ra:
            if key != "round_seconds":
                assert ra[key] == rb[key] or (math.isnan(ra[key]) and math.isnan(rb[key])), key


@pytest.mark.parametrize("value", [-0.1, 1.0, 0.99, 0.05])
def test_bad_fractions_are_config_errors(value):
    with pytest.raises(ConfigError, match="data.holdout_fraction"):
        tiny_config(f"data.holdout_fraction={value}")


def test_dcpfl_refuses_held_out_devices():
    with pytest.raises(ConfigError, match="data.holdout_fraction"):  # its discrepancy matrix spans every device
        tiny_config("method.name=dcpfl", HOLD)
