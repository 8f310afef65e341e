"""Natural partitions (one device per user of the dataset's device-id column) and LEAF's JSON import."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lcfed.data import DataError, PartitionError, import_leaf, load_dataset, make_partition, natural
from lcfed.data.formats import FileSource
from lcfed.errors import ConfigError
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from tests.conftest import tiny_config
from tune_jobs.cli import main

#: 12 samples of 4 users: user 7 holds 4, user 3 holds 3, user 9 holds 3, user 1 holds 2
IDS = np.array([7, 3, 7, 9, 1, 3, 7, 9, 3, 1, 9, 7])


def test_devices_are_the_users_largest_first():
    devices = natural(IDS, num_devices=3, min_samples=2, selection="largest", seed=0)
    # the 3 largest users are 7 (4), then 3 and 9 (3 each); devices in order of the ids: 3, 7, 9
    assert [d.tolist() for d in devices] == [[1, 5, 8], [0, 2, 6, 11], [3, 7, 10]]
    # ties go to the smaller id: with 2 devices, user 3 beats user 9
    assert [d.tolist() for d in natural(IDS, 2, 2, "largest", 0)] == [[1, 5, 8], [0, 2, 6, 11]]


def test_a_seeded_sample_of_users_above_the_minimum():
    picks = {tuple(tuple(d.tolist()) for d in natural(IDS, 2, 3, "random", seed)) for seed in range(20)}
    users = {tuple(sorted({int(IDS[d[0]]) for d in devs})) for devs in picks}
    assert users == {(3, 7), (3, 9), (7, 9)}  # never user 1 (2 samples < 3)
    assert natural(IDS, 2, 3, "random", 5)[0].tolist() == natural(IDS, 2, 3, "random", 5)[0].tolist()


def test_too_few_users_name_the_setting():
    with pytest.raises(PartitionError, match="4 users .*, 3 of them with >= min_samples \\(3\\) samples, fewer than the "
                                              "4 devices asked for: lower data.num_devices to at most 3") as err:
        natural(IDS, 4, 3, "largest", 0)
    assert err.value.param == "num_devices"


def test_make_partition_splits_each_user_as_today():
    labels = np.array([0, 1, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0])
    part = make_partition(labels, scheme="natural", num_devices=3, min_samples=2, device_ids=IDS, test_fraction=0.3)
    for d, user in enumerate([3, 7, 9]):
        held = np.concatenate([part.train[d], part.test[d]])
        assert sorted(held.tolist()) == np.flatnonzero(IDS == user).tolist()
        assert len(part.test[d]) >= 1
    assert part.group_kind == "" and part.groups.tolist() == [1, 0, 1]  # dominant labels, as for dirichlet
    with pytest.raises(PartitionError, match="no per-sample device ids"):
        make_partition(labels, scheme="natural", num_devices=3)


def write_npz(path: Path, users: int = 6, per_user: tuple[int, ...] = (40, 30, 25, 20, 12, 5)) -> np.ndarray:
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(100, 100 + users), per_user[:users])
    np.savez(path, x=rng.integers(0, 256, (len(ids), 28, 28), dtype=np.uint8), y=rng.integers(0, 10, len(ids)),
             device=ids)
    return ids


def test_a_file_with_device_ids_through_the_config(tmp_path):
    ids = write_npz(tmp_path / "users.npz")
    cfg = tiny_config("data.dataset=file", "data.path=users.npz", f"data.data_dir={tmp_path}", "data.partition=natural",
                      "data.num_devices=4", "method.name=fedavg")
    ds = load(cfg)
    part = prepare(cfg, ds).partition
    sizes = [len(part.train[d]) + len(part.test[d]) for d in range(4)]
    assert sizes == [40, 30, 25, 20]  # the 4 largest users, in id order
    for d in range(4):
        rows = np.concatenate([part.train[d], part.test[d]])
        assert set(ids[rows].tolist()) == {100 + d}
    with pytest.raises(ConfigError, match=r"data.num_devices: got 6; does not fit users.npz: the dataset has 6 users"):
        prepare(cfg.replace(**{"data.num_devices": 6}))  # user 105 holds 5 < min_samples 10
    random = prepare(cfg.replace(**{"data.user_selection": "random", "data.min_samples": 5})).partition
    assert random.num_devices == 4


def test_natural_without_device_ids_is_a_config_error(tmp_path):
    np.savez(tmp_path / "plain.npz", x=np.zeros((50, 28, 28), np.uint8), y=np.arange(50) % 10)
    cfg = tiny_config("data.dataset=file", "data.path=plain.npz", f"data.data_dir={tmp_path}", "data.partition=natural",
                      "data.num_devices=2", "method.name=fedavg")
    with pytest.raises(ConfigError, match="data.partition: got 'natural'; does not fit plain.npz: the dataset has no "
                                          "per-sample device ids"):
        prepare(cfg)
    with pytest.raises(ConfigError, match="data.partition: got 'natural'; does not fit digits"):
        prepare(tiny_config("data.partition=natural", "method.name=fedavg"))
    with pytest.raises(ConfigError, match="data.user_selection"):
        tiny_config("data.user_selection=smallest")


# ---------------------------------------------------------------- LEAF


def leaf_file(path: Path, users: dict[str, tuple[list[list[float]], list[int]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "users": list(users), "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }))


def femnist_like(rng: np.random.Generator, n: int) -> list[list[float]]:
    return (rng.integers(0, 256, (n, 784)) / 255.0).tolist()


def test_leaf_femnist_json_becomes_images_with_device_ids(tmp_path):
    rng = np.random.default_rng(3)
    a, b = femnist_like(rng, 3), femnist_like(rng, 2)
    leaf_file(tmp_path / "train" / "all_0.json", {"f0_w2": (a, [4, 0, 61]), "f0_w1": (b, [7, 7])})
    c = femnist_like(rng, 1)
    leaf_file(tmp_path / "test" / "all_0.json", {"f0_w2": (c, [1])})  # the same writer in the test split
    done = import_leaf([tmp_path / "train", tmp_path / "test" / "all_0.json"], tmp_path / "femnist.npz")
    assert (done.samples, done.users, done.shape, done.num_classes, done.images) == (6, 2, (1, 28, 28), 62, True)
    with np.load(tmp_path / "femnist.npz") as f:
        assert f["users"].tolist() == ["f0_w1", "f0_w2"]
        assert f["device"].tolist() == [1, 1, 1, 0, 0, 1]  # file order, then user order; ids by sorted name
    ds = load_dataset("file", tmp_path, source=FileSource("femnist.npz"))
    assert ds.x.shape == (6, 1, 28, 28) and ds.y.tolist() == [4, 0, 61, 7, 7, 1] and ds.num_classes == 62
    np.testing.assert_array_equal(ds.x[0, 0].ravel(), np.round(np.asarray(a[0]) * 255).astype(np.uint8))
    assert ds.device_ids.tolist() == [1, 1, 1, 0, 0, 1]


def test_leaf_vectors_stay_features(tmp_path):
    leaf_file(tmp_path / "syn.json", {"u0": ([[0.5, -2.0, 3.0]], [1]), "u1": ([[1.0, 1.0, 1.0], [0, 0, 2]], [0, 2])})
    done = import_leaf([tmp_path / "syn.json"], tmp_path / "out" / "syn.npz")
    assert (done.samples, done.users, done.shape, done.images) == (3, 2, (3,), False)
    ds = load_dataset("file", tmp_path / "out", source=FileSource("syn.npz"))
    assert ds.x.dtype == np.float32 and ds.x.tolist() == [[0.5, -2.0, 3.0], [1.0, 1.0, 1.0], [0.0, 0.0, 2.0]]
    with pytest.raises(DataError, match="pixel values must lie in \\[0, 1\\] to become images"):
        import_leaf([tmp_path / "syn.json"], tmp_path / "img.npz", shape=(1, 1, 3))
    with pytest.raises(DataError, match="shape \\[1, 2, 2\\] does not hold the 3 values"):
        import_leaf([tmp_path / "syn.json"], tmp_path / "img.npz", shape=(1, 2, 2))


@pytest.mark.parametrize("doc, problem", [
    ({"users": ["u"], "user_data": {"u": {"x": [[1.0]], "y": [0, 1]}}}, "user 'u' has 1 x but 2 y"),
    ({"users": ["u"], "num_samples": [3], "user_data": {"u": {"x": [[1.0]], "y": [0]}}}, "num_samples says 3"),
    ({"users": ["u"], "user_data": {"u": {"x": [[1.0], [1.0, 2.0]], "y": [0, 1]}}}, "equal-length lists of numbers"),
    ({"users": ["u"], "user_data": {}}, "user 'u' has no user_data with x and y"),
    ({"users": ["u"], "user_data": {"u": {"x": [[1.0]], "y": [-1]}}}, "has label -1"),
    ({"users": ["u"], "user_data": {"u": {"x": ["a.png"], "y": [0]}}}, "vectors only"),
    ({"user_data": {}}, "no 'users'"),
])
def test_bad_leaf_files_name_the_file(tmp_path, doc, problem):
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(DataError) as err:
        import_leaf([tmp_path / "bad.json"], tmp_path / "out.npz")
    assert str(tmp_path / "bad.json") in str(err.value) and problem in str(err.value), str(err.value)
    assert not (tmp_path / "out.npz").exists()


def test_leaf_import_and_stats_on_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(4)
    leaf_file(tmp_path / "leaf" / "train.json", {f"w{i}": (femnist_like(rng, 12 + i), [i % 10] * (12 + i)) for i in range(5)})
    assert main(["data", "import", "--leaf", str(tmp_path / "leaf"), "--data-dir", str(tmp_path / "d"),
                 "--name", "femnist"]) == 0
    out = capsys.readouterr().out
    assert f"femnist: 5 users, 70 samples (images of 1x28x28), labels 0-4: {tmp_path / 'd' / 'femnist.npz'}" in out
    assert "--set data.dataset=file --set data.path=" in out
    assert main(["data", "stats", "--set", "data.dataset=file", "--set", "data.path=femnist.npz", "--set",
                 f"data.data_dir={tmp_path / 'd'}", "--set", "data.partition=natural", "--set", "data.num_devices=3",
                 "--set", "method.name=fedavg"]) == 0
    out = capsys.readouterr().out
    assert "file femnist.npz natural (largest users with >= 10 samples)" in out and "3 devices, 45 samples" in out
    assert main(["data", "import", "--leaf", str(tmp_path / "nothing"), "--data-dir", str(tmp_path / "d")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["data", "import", "--leaf", str(tmp_path / "leaf"), "--from", str(tmp_path)]) == 2
    assert main(["data", "import", "--shape", "1,28,28"]) == 2
    assert "--shape: got '1,28,28'; is read with --leaf only" in capsys.readouterr().err
