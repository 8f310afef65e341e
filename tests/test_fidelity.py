"""Fidelity pieces: input standardization, cluster quality under every partition, accuracy over
devices that have trained."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lcfed.data import Scaling
from lcfed.engines.local import run_local
from lcfed.learning.local_update import EvalResult
from lcfed.learning.metrics import accuracy_metrics, label_homogeneity
from lcfed.learning.recovery import adjusted_rand_index
from lcfed.run.loop import load_resume
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from tests.conftest import tiny_config

# -- input standardization -----------------------------------------------------------------------


def test_scaling_fit_by_hand() -> None:
    # channel 0: half 0, half 255 -> mean 0.5, std 0.5; channel 1: constant 51 -> mean 0.2, std 1
    x = np.zeros((4, 2, 1, 2), dtype=np.uint8)
    x[:2, 0] = 255
    x[:, 1] = 51
    s = Scaling.fit(x, np.arange(4))
    assert s.mean == pytest.approx((0.5, 0.2))
    assert s.std == pytest.approx((0.5, 1.0))
    t = s.apply(x)
    assert torch.allclose(t[:2, 0], torch.ones(2, 1, 2)) and torch.allclose(t[2:, 0], -torch.ones(2, 1, 2))
    assert torch.allclose(t[:, 1], torch.zeros(4, 1, 2))


def test_scaling_fit_matches_numpy_on_the_rows_only() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (500, 3, 4, 4), dtype=np.uint8)
    x[400:] = 255  # rows the fit must not see
    rows = rng.permutation(400)[:300]
    s = Scaling.fit(x, rows, chunk=37)  # several chunks, the last one short
    ref = x[rows].astype(np.float64) / 255.0
    assert s.mean == pytest.approx(tuple(ref.mean(axis=(0, 2, 3))), abs=1e-12)
    assert s.std == pytest.approx(tuple(ref.std(axis=(0, 2, 3))), abs=1e-12)


def test_unit_scaling_is_plain_unit_interval() -> None:
    x = np.array([[[[0, 255]]]], dtype=np.uint8)
    assert Scaling.unit(1).apply(x).tolist() == [[[[0.0, 1.0]]]]
    with pytest.raises(ValueError, match="channels"):
        Scaling.unit(3).apply(x)


def test_devices_get_standardized_inputs_fitted_on_training_samples() -> None:
    cfg = tiny_config()
    setup = prepare(cfg)
    assert setup.scaling.std[0] != 1.0
    data = setup.device_data(load(cfg), range(8), torch.device("cpu"))
    train = torch.cat([d.x_train for d in data.values()])
    assert float(train.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(train.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)
    unit = prepare(tiny_config("data.normalize=unit")).scaling
    assert unit == Scaling.unit(1)


def test_standardized_and_unit_runs_differ_and_each_is_deterministic() -> None:
    std = run_local(tiny_config("train.rounds=2")).final["acc_mean"]
    unit = run_local(tiny_config("train.rounds=2", "data.normalize=unit")).final["acc_mean"]
    assert run_local(tiny_config("train.rounds=2")).final["acc_mean"] == std
    assert std != unit


# -- cluster quality ------------------------------------------------------------------------------


def test_label_homogeneity_by_hand() -> None:
    p = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    assert label_homogeneity(p, np.array([0, 0, 1, 1])) == 1.0
    assert label_homogeneity(p, np.array([0, 1, 0, 1])) == 0.0  # cluster means equal the global one
    # T = 0.5 + 0 + 0.5 = 1; W: cluster {0, 1} has mean (0.75, 0.25), 0.125 per member -> 0.25
    q = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    assert label_homogeneity(q, np.array([0, 0, 1])) == pytest.approx(0.75)
    assert label_homogeneity(np.full((3, 2), 0.5), np.array([0, 1, 2])) == 1.0  # nothing to explain


def test_pathological_runs_report_homogeneity_not_a_meaningless_ari() -> None:
    # 8 devices with 2 classes each: more distinct class sets than the 3 clusters can express
    cfg = tiny_config()
    res = run_local(cfg)
    groups = prepare(cfg).federation.groups
    assert len(np.unique(groups)) > cfg.method.params.num_clusters
    assert "ari" not in res.final
    assert 0.0 <= res.final["label_homogeneity"] <= 1.0
    # primary/secondary: 10 true groups (primary class); K = 10 can express them, so ARI is kept
    res = run_local(tiny_config("data.partition=primary_secondary", "data.num_devices=20",
                                "method.num_clusters=10", "train.rounds=1"))
    assert "ari" in res.final and "label_homogeneity" in res.final


def test_ari_oracle_is_scikit_learn() -> None:
    assert adjusted_rand_index(np.array([1, 1, 0, 0]), np.array([0, 0, 1, 1])) == 1.0


# -- accuracy over devices that have trained ----------------------------------------------------


def test_accuracy_counts_only_trained_devices_by_hand() -> None:
    results = {0: EvalResult(9, 10, 1.0), 1: EvalResult(0, 10, 5.0), 2: EvalResult(5, 10, 2.0)}
    every = accuracy_metrics(results)
    assert every["acc_mean"] == pytest.approx(14 / 30)
    trained = accuracy_metrics(results, np.array([True, False, True]))
    assert trained["acc_mean"] == pytest.approx(0.7)
    assert trained["acc_weighted"] == pytest.approx(14 / 20)
    assert trained["test_loss"] == pytest.approx(3.0 / 20)
    assert accuracy_metrics(results, np.zeros(3, dtype=bool)) == {}


def test_coverage_grows_with_partial_participation_and_survives_resume(tmp_path) -> None:
    over = ["data.num_devices=8", "train.participation=0.25", "train.rounds=4", "train.eval_every=1",
            "method.name=fedavg"]
    full = run_local(tiny_config(*over))
    cov = [row["coverage"] for row in full.history]
    assert cov[0] == 0.25 and cov == sorted(cov) and cov[-1] <= 1.0
    assert all("acc_mean" in row for row in full.history)
    # 2 rounds with a checkpoint, then resumed to 4: the same coverage and accuracy
    run_local(tiny_config(*over, "train.rounds=2", f"checkpoint.dir={tmp_path}"))
    cont = tiny_config(*over, f"checkpoint.dir={tmp_path}")
    snap = load_resume(cont)
    assert snap is not None and len(snap.trained) == round(cov[1] * 8)
    resumed = run_local(cont, resume=snap)
    for a, b in zip(full.history, resumed.history, strict=True):
        assert (a["coverage"], a["acc_mean"]) == (b["coverage"], b["acc_mean"])


# -- lcfed table ---------------------------------------------------------------------------------


def test_table_ranks_run_summaries_by_the_averaged_accuracy(tmp_path, capsys) -> None:
    from tune_jobs.cli import main

    files = []
    for method, averaged, last in (("fedavg", 0.90, 0.95), ("lcfed", 0.93, 0.92)):
        f = tmp_path / f"{method}.json"
        f.write_text(json.dumps({"method": method, "seed": 0, "rounds": 30, "acc_mean": last, "seconds_per_round": 1.5,
                                 "last_evals": {"evaluations": 3, "rounds": [28, 29, 30], "acc_mean": averaged,
                                                "acc_weighted": averaged}}))
        files.append(str(f))
    assert main(["table", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "acc_mean (last 3)" in lines[0]
    assert lines[1].split()[:5] == ["lcfed", "0", "30", "0.9300", "0.9300"]  # ranked by the average, not the last
    assert lines[2].split()[0] == "fedavg"
    (tmp_path / "bad.json").write_text("{}")
    assert main(["table", str(tmp_path / "bad.json")]) == 2
    assert "lcfed run --json" in capsys.readouterr().err
