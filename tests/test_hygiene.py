"""Measurement hygiene (issue 17): the test-set floor, the NIID-Bench Dirichlet convention, partition
statistics at the start of a run and in MLflow, the summary's average over the last N evaluations,
and a repository whose method notes live in the repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from lcfed.config import load_config
from lcfed.data import (
    Partition,
    PartitionError,
    dirichlet,
    dirichlet_niid_bench,
    format_stats,
    load_dataset,
    make_partition,
    partition_stats,
    split_train_test,
)
from lcfed.data.schemes import _niid_bench_counts
from lcfed.errors import ConfigError
from tune_jobs.cli import main
from tune_jobs.run_command import last_evals, summary_table

ROOT = Path(__file__).resolve().parents[1]


def labels_of(*class_counts: int) -> np.ndarray:
    """Labels 0, 0, ..., 1, 1, ...: ``class_counts[c]`` samples of class c, in order."""
    return np.repeat(np.arange(len(class_counts)), class_counts).astype(np.int64)


def class_counts(idx: np.ndarray, labels: np.ndarray, num_classes: int) -> list[int]:
    return np.bincount(labels[idx], minlength=num_classes).tolist()


# ---------------------------------------------------------------- test-set floor


def test_floor_gives_small_devices_exactly_the_floor_in_their_label_mix() -> None:
    # device 0: 20 of class 0 + 10 of class 1; device 1: 50 + 50; device 2: 5 of each of classes 0, 1, 2
    labels = np.concatenate([labels_of(20, 10), labels_of(50, 50), labels_of(5, 5, 5)])
    devices = [np.arange(30), np.arange(30, 130), np.arange(130, 145)]
    plain_train, plain_test = split_train_test(devices, labels, 0.2, seed=3)
    assert [len(t) for t in plain_test] == [6, 20, 3]  # round(4) + round(2); 10 + 10; 1 + 1 + 1
    train, test = split_train_test(devices, labels, 0.2, seed=3, min_test=12)
    # device 0: 12 x (20, 10) / 30 = (8, 4), no remainder
    assert class_counts(test[0], labels, 3) == [8, 4, 0]
    assert class_counts(train[0], labels, 3) == [12, 6, 0]
    # device 2 (15 samples, floor 12): 12 x 5 / 15 = 4 each, exact
    assert class_counts(test[2], labels, 3) == [4, 4, 4]
    # device 1 already has 20 >= 12 test samples: the same samples as without the floor
    np.testing.assert_array_equal(np.sort(test[1]), np.sort(plain_test[1]))
    np.testing.assert_array_equal(np.sort(train[1]), np.sort(plain_train[1]))
    for d in range(3):  # samples only move between a device's own train and test parts
        both = np.sort(np.concatenate([train[d], test[d]]))
        np.testing.assert_array_equal(both, devices[d])


def test_floor_remainders_go_to_the_largest_share_then_the_smaller_label() -> None:
    # 15 samples (5 of each class), floor 4: 4 x 5 / 15 = 1.33 each -> 1 each, the spare unit to class 0
    labels = labels_of(5, 5, 5)
    _, test = split_train_test([np.arange(15)], labels, 0.2, seed=0, min_test=4)
    assert class_counts(test[0], labels, 3) == [2, 1, 1]
    # 7 of class 0, 3 of class 1, floor 5: 3.5 / 1.5 -> 3 / 1, equal remainders: the larger class wins
    labels = labels_of(7, 3)
    _, test = split_train_test([np.arange(10)], labels, 0.2, seed=0, min_test=5)
    assert class_counts(test[0], labels, 2) == [4, 1]


def test_floor_refuses_devices_that_would_keep_no_training_sample() -> None:
    labels = labels_of(6, 6, 30)
    devices = [np.arange(30, 42), np.arange(12)]  # 12 of class 2; 6 of class 0 and 6 of class 1
    with pytest.raises(PartitionError, match="device 0 holds 12 samples") as err:
        split_train_test(devices, labels, 0.2, seed=0, min_test=12)
    assert err.value.param == "min_test_samples"
    train, test = split_train_test(devices, labels, 0.2, seed=0, min_test=11)  # one training sample is enough
    assert [len(t) for t in train] == [1, 1] and [len(t) for t in test] == [11, 11]
    assert class_counts(test[1], labels, 3) == [6, 5, 0]  # 5.5 each: the tie goes to the smaller label


def test_floor_on_a_seeded_dirichlet_partition() -> None:
    y = load_dataset("digits", ROOT / "nothing-here").y
    kw = dict(scheme="dirichlet", num_devices=40, alpha=0.3, min_samples=15, test_fraction=0.2, seed=5)
    plain = make_partition(y, **kw)
    floored = make_partition(y, **kw, min_test_samples=8)
    raised = 0
    for d in range(40):
        np.testing.assert_array_equal(np.sort(np.concatenate([plain.train[d], plain.test[d]])),
                                      np.sort(np.concatenate([floored.train[d], floored.test[d]])))
        assert len(floored.test[d]) >= 8 and len(floored.train[d]) >= 1
        if len(plain.test[d]) >= 8:
            np.testing.assert_array_equal(np.sort(floored.test[d]), np.sort(plain.test[d]))
            continue
        raised += 1
        assert len(floored.test[d]) == 8
        size = len(plain.train[d]) + len(plain.test[d])
        share = np.bincount(y[np.concatenate([plain.train[d], plain.test[d]])], minlength=10) * 8 / size
        got = np.bincount(y[floored.test[d]], minlength=10)
        assert np.all(np.abs(got - share) < 1)  # apportioned: each class within one of its exact share
    assert raised >= 5  # the floor did something here


def test_floor_config_errors_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="data.min_test_samples") as err:
        load_config(None, ["data.min_test_samples=10"])  # dirichlet, min_samples 10
    assert "raise data.min_samples to at least 11" in str(err.value)
    with pytest.raises(ConfigError, match="data.min_test_samples.*>= 0"):
        load_config(None, ["data.min_test_samples=-1"])
    load_config(None, ["data.min_test_samples=9"])  # one training sample left: allowed
    # pathological device sizes come from the data: refused before the run starts, exit 2
    rc = main(["run", "--no-track", "-q", "--set", "data.partition=pathological", "--set", "data.num_devices=100",
               "--set", "data.min_test_samples=20"])
    err_text = capsys.readouterr().err
    assert rc == 2 and "data.min_test_samples: got 20" in err_text and "no training sample" in err_text


# ---------------------------------------------------------------- NIID-Bench convention


def niid_bench_reference(labels: np.ndarray, n_parties: int, beta: float, min_require_size: int,
                         rng: np.random.Generator) -> list[list[int]]:
    """NIID-Bench's ``noniid-labeldir`` loop (Li et al., ``partition_data``) as written there, with
    ``np.random`` replaced by ``rng``, ``strict=True`` zips and the per-class shuffle left out (it permutes which samples go
    where, not how many): a literal reference for the counts."""
    min_size = 0
    K = int(labels.max()) + 1
    N = labels.shape[0]
    while min_size < min_require_size:
        idx_batch: list[list[int]] = [[] for _ in range(n_parties)]
        for k in range(K):
            idx_k = np.where(labels == k)[0]
            proportions = rng.dirichlet(np.repeat(beta, n_parties))
            proportions = np.array([p * (len(idx_j) < N / n_parties) for p, idx_j in zip(proportions, idx_batch, strict=True)])
            proportions = proportions / proportions.sum()
            proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions), strict=True)]
            min_size = min([len(idx_j) for idx_j in idx_batch])
    return idx_batch


def test_niid_bench_counts_equal_the_reference_loop_draw_for_draw() -> None:
    labels = np.random.default_rng(7).integers(0, 10, 600).astype(np.int64)
    redraws = 0
    for seed in range(6):
        counts, _, draws = _niid_bench_counts(np.bincount(labels), 12, 0.3, 25, np.random.default_rng(seed))
        redraws += draws > 1
        ref = niid_bench_reference(labels, 12, 0.3, 25, np.random.default_rng(seed))
        ref_counts = np.stack([np.bincount(labels[np.asarray(b, dtype=np.int64)], minlength=10) for b in ref], axis=1)
        np.testing.assert_array_equal(counts, ref_counts)
    assert redraws >= 2  # the outer re-draw loop was exercised


def per_class_counts(devices: list[np.ndarray], labels: np.ndarray) -> np.ndarray:
    return np.stack([np.bincount(labels[d], minlength=10) for d in devices], axis=1)  # (classes, devices)


def test_niid_bench_gives_no_class_to_a_device_already_at_n_over_m() -> None:
    labels = np.random.default_rng(1).integers(0, 10, 6000).astype(np.int64)
    cap = 6000 / 50

    def capped(devices: list[np.ndarray]) -> bool:
        counts = per_class_counts(devices, labels)
        before = np.cumsum(counts, axis=0) - counts  # each device's size before class c was dealt
        return bool(np.all((counts == 0) | (before < cap)))

    niid = dirichlet_niid_bench(labels, 50, 0.1, 10, seed=0)
    flat = np.sort(np.concatenate(niid))
    np.testing.assert_array_equal(flat, np.arange(6000))  # every sample once
    assert min(len(d) for d in niid) >= 10 and capped(niid)
    assert not capped(dirichlet(labels, 50, 0.1, 10, seed=0))  # the rebalance convention has no cap
    again = dirichlet_niid_bench(labels, 50, 0.1, 10, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(niid, again, strict=True))


def test_niid_bench_gives_up_with_a_clear_error() -> None:
    labels = np.random.default_rng(2).integers(0, 10, 1000).astype(np.int64)
    with pytest.raises(PartitionError, match="1000 times") as err:
        dirichlet_niid_bench(labels, 40, 0.01, 20, seed=0)
    assert err.value.param == "dirichlet_convention"
    with pytest.raises(ConfigError, match="data.dirichlet_convention.*one of"):
        load_config(None, ["data.dirichlet_convention=niid"])


def test_niid_bench_through_the_config_and_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["data", "stats", "--set", "data.dirichlet_convention=niid_bench", "--set", "data.alpha=0.01",
               "--set", "data.num_devices=80", "--set", "data.min_samples=20"])
    err = capsys.readouterr().err
    assert rc == 2 and "data.dirichlet_convention: got 'niid_bench'" in err and "rebalance" in err
    sets = ["--set", "data.alpha=0.3", "--set", "data.num_devices=30"]
    assert main(["data", "stats", *sets]) == 0
    rebalance = capsys.readouterr().out
    assert main(["data", "stats", *sets, "--set", "data.dirichlet_convention=niid_bench"]) == 0
    niid = capsys.readouterr().out
    assert "(rebalance)" in rebalance and "(niid_bench)" in niid and rebalance.split(":")[-1] != niid.split(":")[-1]


# ---------------------------------------------------------------- partition statistics


def test_partition_stats_by_hand() -> None:
    labels = np.array([0, 1, 1, 2, 0, 0, 2, 2], dtype=np.int64)
    part = Partition(
        train=(np.array([0, 1, 2]), np.array([3]), np.array([5, 6, 7])),
        test=(np.array([4]), np.array([], dtype=np.int64), np.array([], dtype=np.int64)),
        groups=np.zeros(3, dtype=np.int64),
    )
    stats = partition_stats(part, labels)
    assert stats == {"devices": 3.0, "samples": 8.0, "train_min": 1.0, "train_median": 3.0, "train_max": 3.0,
                     "test_min": 0.0, "test_median": 0.0, "test_max": 1.0,
                     "classes_mean": 5 / 3, "classes_min": 1.0, "classes_max": 2.0}  # {0, 1}, {2}, {0, 2}
    assert format_stats(stats) == ("3 devices, 8 samples; train 1 / 3 / 3 and test 0 / 0 / 1 (min / median / max); "
                                   "classes per device 1.67 (1-2)")


# ---------------------------------------------------------------- summary over the last N evaluations


HISTORY = [
    {"round": 0.0, "train_loss": 2.0},
    {"round": 1.0, "train_loss": 1.5, "acc_mean": 0.50, "acc_weighted": 0.40},
    {"round": 2.0, "train_loss": 1.0},
    {"round": 3.0, "train_loss": 0.8, "acc_mean": 0.70, "acc_weighted": 0.60},
    {"round": 4.0, "train_loss": 0.7},
    {"round": 5.0, "train_loss": 0.6, "acc_mean": 0.60, "acc_weighted": 0.80, "ari": 1.0},
]


def test_last_evals_average_only_evaluated_rounds() -> None:
    two = last_evals(HISTORY, 2)
    assert two["evaluations"] == 2 and two["rounds"] == [3, 5]
    assert two["acc_mean"] == pytest.approx(0.65) and two["acc_weighted"] == pytest.approx(0.70)
    assert two["train_loss"] == pytest.approx(0.7)
    assert "ari" not in two  # not measured at every averaged evaluation
    every = last_evals(HISTORY, 10)  # asks for more than the run made: all three
    assert every["evaluations"] == 3 and every["acc_mean"] == pytest.approx(0.6)
    table = summary_table(HISTORY[-1], two)
    assert "(round 5)" in table and "mean of last 2 evals" in table and "(rounds 3, 5)" in table
    assert re.search(r"acc_mean\s+0\.6000\s+0\.6500", table)
    with pytest.raises(ConfigError, match="tracking.summary_evals"):
        load_config(None, ["tracking.summary_evals=0"])


@pytest.mark.subprocess
def test_run_prints_partition_and_summary_and_logs_them(tmp_path: Path, tracking_uri: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import mlflow

    out = tmp_path / "summary.json"
    args = ["run", "--config", str(ROOT / "configs" / "demo.yaml"), "--json", str(out),  # not -q: the partition line
            "--set", f"tracking.uri={tracking_uri}", "--set", "train.rounds=4", "--set", "train.local_steps=2",
            "--set", "data.num_devices=10", "--set", "tracking.summary_evals=3", "--set", "data.min_test_samples=50",
            "--set", "data.partition=pathological", "--set", "data.classes_per_device=2", "--set", "data.test_fraction=0.25"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert printed.startswith("partition: digits pathological 2 classes per device")
    assert "min_test_samples 50" in printed and "test 50 / " in printed
    assert "mean of last 3 evals" in printed and "(rounds 1, 2, 3)" in printed
    assert summary["partition"]["test_min"] == 50 and summary["partition"]["classes_max"] == 2
    assert summary["last_eval_round"] == 3 and "last evaluation" in summary["reports"]
    history = mlflow.MlflowClient(tracking_uri).get_metric_history(summary["run_id"], "accuracy/acc_mean")
    by_step = {m.step: m.value for m in history}
    assert summary["acc_mean"] == by_step[3]  # the top level stays the last evaluation
    assert summary["last_evals"]["rounds"] == [1, 2, 3]
    assert summary["last_evals"]["acc_mean"] == pytest.approx(np.mean([by_step[1], by_step[2], by_step[3]]))
    params = mlflow.MlflowClient(tracking_uri).get_run(summary["run_id"]).data.params
    assert params["federation.partition.test_min"] == "50"
    assert params["federation.partition.classes_mean"] == "2"
    assert "data.dirichlet_convention" not in params and params["data.min_test_samples"] == "50"  # pathological


# ---------------------------------------------------------------- the repository explains itself


def test_method_notes_live_in_the_repository() -> None:
    sources = [*ROOT.glob("lcfed/**/*.py"), *ROOT.glob("configs/*.yaml")]
    citing = [str(p.relative_to(ROOT)) for p in sources if "DESIGN" in p.read_text()]
    assert citing == []  # DESIGN.md is not part of the repository
    docs = ROOT / "docs" / "methods.md"
    assert "docs/methods.md" in (ROOT / "README.md").read_text() and docs.exists()
    for method in ("lcfed.py", "fedac.py", "dcpfl.py", "fedper.py"):
        assert "docs/methods.md" in (ROOT / "lcfed" / "methods" / method).read_text(), method


def test_every_config_says_its_partition_convention() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        cfg = load_config(path)
        text = path.read_text()
        if cfg.data.partition == "dirichlet":
            assert re.search(r"^\s+dirichlet_convention: (rebalance|niid_bench)$", text, re.M), path.name
        assert "convention" in text, path.name
