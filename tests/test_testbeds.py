"""Testbeds with known clusters (rotated, label_permuted, feature_shift), checked by hand on tiny arrays;
cluster-recovery scores (ARI, NMI) by hand; and a seeded federation that recovers the rotation groups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lcfed.data import Dataset, apply_testbed, group_layout, make_partition
from lcfed.data.testbeds import label_permutations, rotate, shift
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.learning.recovery import adjusted_rand_index, normalized_mutual_info, recovery_scores
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from tests.conftest import tiny_config
from tune_jobs.cli import main

# ---------------------------------------------------------------- the transformations, by hand


def test_quarter_turns_by_hand():
    x = np.array([[[[1, 2], [3, 4]]]], dtype=np.uint8)  # (1, 1, 2, 2)
    assert rotate(x, 0)[0, 0].tolist() == [[1, 2], [3, 4]]
    assert rotate(x, 1)[0, 0].tolist() == [[2, 4], [1, 3]]  # 90 degrees counter-clockwise
    assert rotate(x, 2)[0, 0].tolist() == [[4, 3], [2, 1]]
    assert rotate(x, 3)[0, 0].tolist() == [[3, 1], [4, 2]]


def test_feature_shifts_by_hand():
    x = np.array([0, 1, 128, 255], dtype=np.uint8).reshape(1, 1, 2, 2)
    rng = np.random.default_rng(0)
    assert shift(x, "identity", rng).ravel().tolist() == [0, 1, 128, 255]
    assert shift(x, "invert", rng).ravel().tolist() == [255, 254, 127, 0]
    assert shift(x, "contrast", rng).ravel().tolist() == [64, 64, 128, 191]  # (x - 128) // 2 + 128
    flat = np.full((1, 1, 50, 50), 128, dtype=np.uint8)
    a, b = shift(flat, "noise", np.random.default_rng(5)), shift(flat, "noise", np.random.default_rng(5))
    assert np.array_equal(a, b) and a.dtype == np.uint8 and not np.array_equal(a, flat)
    assert abs(float(a.mean()) - 128) < 2 and 28 < float(a.astype(float).std()) < 36  # N(0, 32^2), seeded
    edge = shift(np.zeros((1, 1, 50, 50), np.uint8), "noise", np.random.default_rng(5))
    assert edge.min() == 0 and edge.max() <= 255  # clipped, never wrapped


def test_label_permutations_are_distinct_seeded_and_start_with_the_identity():
    perms = label_permutations(4, 5, seed=3)
    assert perms.shape == (5, 4) and perms[0].tolist() == [0, 1, 2, 3]
    assert len({tuple(p) for p in perms.tolist()}) == 5
    assert all(sorted(p) == [0, 1, 2, 3] for p in perms.tolist())
    assert np.array_equal(perms, label_permutations(4, 5, seed=3))
    assert not np.array_equal(perms, label_permutations(4, 5, seed=4))
    assert len({tuple(p) for p in label_permutations(3, 6, seed=0).tolist()}) == 6  # all 3! of them
    with pytest.raises(ValueError, match="only 6 permutations"):
        label_permutations(3, 7, seed=0)


# ---------------------------------------------------------------- groups of devices and samples


def test_the_layout_is_balanced_seeded_and_proportional():
    device_group, sample_group = group_layout(101, 10, 4, seed=0)
    assert sorted(np.bincount(device_group).tolist()) == [2, 2, 3, 3]
    pools = np.bincount(sample_group, minlength=4)
    # 101 samples in proportion to 3, 3, 2, 2 devices: 30.3, 30.3, 20.2, 20.2; the one left over goes to
    # the largest remainder (a 3-device group, the lower index first)
    big = np.flatnonzero(np.bincount(device_group) == 3)
    assert pools[big].tolist() == [31, 30] and pools.sum() == 101
    assert sorted(pools.tolist()) == [20, 20, 30, 31]
    again = group_layout(101, 10, 4, seed=0)
    assert np.array_equal(again[0], device_group) and np.array_equal(again[1], sample_group)
    other = group_layout(101, 10, 4, seed=1)
    assert not np.array_equal(other[1], sample_group)
    with pytest.raises(ValueError, match="groups must be in"):
        group_layout(10, 3, 4, seed=0)


def tiny_images(n: int = 40, side: int = 4) -> Dataset:
    rng = np.random.default_rng(9)
    return Dataset("tiny", rng.integers(0, 256, (n, 1, side, side), dtype=np.uint8), np.arange(n, dtype=np.int64) % 5, 5)


def test_rotated_testbed_turns_each_sample_by_its_group():
    ds = tiny_images()
    out = apply_testbed(ds, "rotated", 4, num_devices=8, seed=2)
    _, sample_group = group_layout(40, 8, 4, seed=2)
    for i in range(40):
        assert np.array_equal(out.x[i, 0], np.rot90(ds.x[i, 0], k=int(sample_group[i])))
    assert np.array_equal(out.y, ds.y) and np.array_equal(ds.x, tiny_images().x)  # the input is untouched
    assert apply_testbed(ds, "none", 4, 8, 2) is ds


def test_label_permuted_testbed_relabels_each_group():
    ds = tiny_images()
    out = apply_testbed(ds, "label_permuted", 3, num_devices=6, seed=1)
    _, sample_group = group_layout(40, 6, 3, seed=1)
    perms = label_permutations(5, 3, seed=1)
    assert out.y.tolist() == [int(perms[g][y]) for g, y in zip(sample_group, ds.y, strict=True)]
    assert out.x is ds.x  # pixels unchanged
    features = Dataset("table", np.zeros((40, 3), np.float32), ds.y, 5)
    assert apply_testbed(features, "label_permuted", 2, 4, 0).x.shape == (40, 3)  # any dataset


def test_feature_shift_testbed():
    ds = tiny_images()
    out = apply_testbed(ds, "feature_shift", 4, num_devices=4, seed=0)
    _, sample_group = group_layout(40, 4, 4, seed=0)
    for i in np.flatnonzero(sample_group == 1):
        assert np.array_equal(out.x[i], 255 - ds.x[i])
    for i in np.flatnonzero(sample_group == 0):
        assert np.array_equal(out.x[i], ds.x[i])


def test_partition_within_groups_carries_the_true_groups():
    labels = np.arange(200) % 10
    part = make_partition(labels, scheme="dirichlet", num_devices=8, alpha=0.3, min_samples=5, seed=4,
                          testbed="rotated", testbed_groups=4)
    device_group, sample_group = group_layout(200, 8, 4, seed=4)
    assert part.group_kind == "rotated" and np.array_equal(part.groups, device_group)
    held = [np.concatenate([part.train[d], part.test[d]]) for d in range(8)]
    for d in range(8):
        assert set(sample_group[held[d]].tolist()) == {device_group[d]}  # only its group's samples
        assert len(held[d]) >= 5
    assert sorted(np.concatenate(held).tolist()) == list(range(200))  # every sample once
    iid = make_partition(labels, scheme="iid", num_devices=8, seed=4, testbed="rotated", testbed_groups=4)
    assert sorted(len(t) + len(s) for t, s in zip(iid.train, iid.test, strict=True)) == [25] * 8


def test_testbed_config_errors():
    with pytest.raises(ConfigError, match="data.testbed: got 'rotated'; deals the samples to devices itself"):
        tiny_config("data.testbed=rotated", "data.partition=natural")
    with pytest.raises(ConfigError, match=r"data.testbed_groups: got 5; must be in \[1, 4\]"):
        tiny_config("data.testbed=rotated", "data.testbed_groups=5")
    with pytest.raises(ConfigError, match=r"data.testbed_groups: got 9; must be in \[1, 8\]"):
        tiny_config("data.testbed=label_permuted", "data.testbed_groups=9")
    with pytest.raises(ConfigError, match="data.testbed: got 'spun'"):
        tiny_config("data.testbed=spun")


def test_testbeds_that_do_not_fit_the_data(tmp_path):
    np.savez(tmp_path / "wide.npz", x=np.zeros((80, 4, 6), np.uint8), y=np.arange(80) % 4)
    cfg = tiny_config("data.dataset=file", "data.path=wide.npz", f"data.data_dir={tmp_path}", "data.testbed=rotated",
                      "model.name=mlp", "method.name=fedavg")
    with pytest.raises(ConfigError, match="data.testbed: got 'rotated'; does not fit wide.npz: quarter turns need "
                                          "square images"):
        load(cfg)
    np.savez(tmp_path / "vec.npz", x=np.zeros((80, 3), np.float32), y=np.arange(80) % 4)
    with pytest.raises(ConfigError, match="holds feature vectors"):
        load(cfg.replace(**{"data.path": "vec.npz", "data.testbed": "feature_shift"}))
    two = cfg.replace(**{"data.path": "vec.npz", "data.testbed": "label_permuted", "data.testbed_groups": 2})
    assert load(two).x.shape == (80, 3)


def test_data_stats_prints_each_devices_group(capsys):
    assert main(["data", "stats", "--set", "data.testbed=rotated", "--set", "data.partition=iid",
                 "--set", "data.num_devices=8", "--set", "method.name=fedavg"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "digits iid in 4 rotated groups, test_fraction 0.2, seed 0:"
    assert out[1].endswith("4 known groups of 2-2 devices")
    groups = group_layout(1797, 8, 4, seed=0)[0]
    assert out[2] == "  rotated groups (device: group): " + " ".join(f"{d}:{g}" for d, g in enumerate(groups.tolist()))


def test_existing_partitions_print_no_groups(capsys):
    assert main(["data", "stats", "--set", "data.num_devices=8", "--set", "method.name=fedavg"]) == 0
    out = capsys.readouterr().out
    assert "groups" not in out and len(out.splitlines()) == 2


# ---------------------------------------------------------------- recovery scores, by hand


def test_perfect_recovery_whatever_the_numbering():
    assert adjusted_rand_index(np.array([1, 1, 0, 0]), np.array([0, 0, 1, 1])) == 1.0
    assert normalized_mutual_info(np.array([1, 1, 0, 0]), np.array([0, 0, 1, 1])) == pytest.approx(1.0)


def test_crossed_clusters():
    # contingency all 1s: sum C(n_ij, 2) = 0; rows and columns sum C(2, 2) twice = 2 each; C(4, 2) = 6
    # expected = 2 * 2 / 6 = 2/3, max = (2 + 2) / 2 = 2: ARI = (0 - 2/3) / (2 - 2/3) = -1/2; MI = 0
    a, t = np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])
    assert adjusted_rand_index(a, t) == pytest.approx(-0.5)
    assert normalized_mutual_info(a, t) == pytest.approx(0.0, abs=1e-12)


def test_a_split_cluster():
    # truth {0,1,2}{3,4,5}; found {0,1}{2,3}{4,5}: sum C(n_ij, 2) = 1 + 1 = 2, rows 3 + 3 = 6, columns 1 + 1 + 1 = 3,
    # C(6, 2) = 15: expected 6 * 3 / 15 = 1.2, max 4.5, ARI = 0.8 / 3.3 = 8/33.
    # MI = 2 * (1/3) ln 2, H(truth) = ln 2, H(found) = ln 3: NMI = (2/3) ln 2 / ((ln 2 + ln 3) / 2)
    a, t = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 0, 0, 1, 1, 1])
    assert adjusted_rand_index(a, t) == pytest.approx(8 / 33)
    assert normalized_mutual_info(a, t) == pytest.approx((4 / 3) * math.log(2) / math.log(6))


def test_recovery_scores_skip_unassigned_devices():
    scores = recovery_scores(np.array([2, 2, -1, 5, 5]), np.array([0, 0, 1, 1, 1]))
    assert scores == {"ari": 1.0, "nmi": pytest.approx(1.0)}
    assert recovery_scores(np.array([-1, -1]), np.array([0, 1])) == {}
    with pytest.raises(ValueError, match="one entry per device"):
        recovery_scores(np.array([0, 1]), np.array([0, 1, 2]))


# ---------------------------------------------------------------- a federation that recovers them


def test_lcfed_recovers_the_four_rotation_groups_of_digits():
    """12 devices in 4 rotation groups (3 each), IID inside each group; LCFed with K = 4, 5 rounds."""
    cfg = tiny_config("data.testbed=rotated", "data.partition=iid", "data.num_devices=12", "model.name=mlp",
                      "method.num_clusters=4", "train.rounds=5", "train.local_steps=10", "train.lr=0.1")
    truth = prepare(cfg).partition.groups
    assert sorted(np.bincount(truth).tolist()) == [3, 3, 3, 3]
    result = run_local(cfg)
    scores = recovery_scores(result.assignment, truth)
    assert scores["ari"] >= 0.9, (scores, result.assignment.tolist(), truth.tolist())
    assert result.final["ari"] == scores["ari"]  # the run's own ari metric: the same truth
    assert result.final["nmi"] == scores["nmi"]  # and, on a testbed, its nmi (logged each round)
    assert all("nmi" in h for h in result.history if "ari" in h)
    plain = run_local(tiny_config("train.rounds=1"))
    assert "num_clusters" in plain.final and "nmi" not in plain.final  # label-skew groups are a proxy: no nmi
    two = run_local(cfg.replace(**{"method.num_clusters": 2, "train.rounds": 1}))  # fewer clusters than groups
    assert two.final["num_clusters"] <= 2 and two.final["ari"] == recovery_scores(two.assignment, truth)["ari"] < 1
