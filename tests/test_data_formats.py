"""The user's own files as datasets (``data.dataset: file``): .npz, ImageFolder, CSV and parquet, each
read back from small files written here; bad files are one error naming the file and the problem;
feature vectors, their standardization and the built-in MLP."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import lcfed.data.formats as formats
from lcfed.data import DataError, Dataset, FileSource, Scaling, load_dataset
from lcfed.data.dataset import CACHE_DIR
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.learning.models import build_network
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from tests.conftest import tiny_config
from tune_jobs.cli import main


def read(path: Path, **options: object) -> Dataset:
    """``path`` read as ``data.dataset: file`` reads it (the data dir is its folder)."""
    return load_dataset("file", path.parent, source=FileSource(path.name, **options))  # type: ignore[arg-type]


def bad(path: Path, problem: str, **options: object) -> None:
    """Reading ``path`` is one DataError that names the file and says ``problem``."""
    with pytest.raises(DataError) as err:
        read(path, **options)
    assert str(path) in str(err.value) and problem in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- npz


def test_npz_images_features_and_device_ids(tmp_path):
    rng = np.random.default_rng(0)
    x3 = rng.integers(0, 256, (6, 5, 5), dtype=np.uint8)
    np.savez(tmp_path / "gray.npz", x=x3, y=np.array([0, 1, 2, 0, 1, 2]))
    ds = read(tmp_path / "gray.npz")
    assert ds.name == "gray.npz" and ds.is_image and ds.x.shape == (6, 1, 5, 5) and ds.x.dtype == np.uint8
    np.testing.assert_array_equal(ds.x[:, 0], x3)
    assert ds.y.tolist() == [0, 1, 2, 0, 1, 2] and ds.y.dtype == np.int64 and ds.num_classes == 3
    assert ds.device_ids is None and ds.input_shape == (1, 5, 5)

    x4 = rng.integers(0, 256, (4, 3, 8, 6), dtype=np.uint8)
    users = np.array(["bob", "al", "bob", "cy"])
    np.savez(tmp_path / "rgb.npz", x=x4, y=np.array([1, 1, 0, 4]), device=users, num_classes=np.int64(7))
    ds = read(tmp_path / "rgb.npz")
    assert ds.x.shape == (4, 3, 8, 6) and ds.num_classes == 7  # the file's num_classes, not max + 1
    assert ds.device_ids.tolist() == [1, 0, 1, 2]  # sorted names: al, bob, cy

    feats = rng.normal(size=(5, 3))
    np.savez(tmp_path / "vec.npz", x=feats, y=np.arange(5) % 2, users=np.array([10, 10, 30, 20, 30]))
    ds = read(tmp_path / "vec.npz", device_column="users")
    assert not ds.is_image and ds.x.dtype == np.float32 and ds.x.shape == (5, 3) and ds.input_shape == (3,)
    np.testing.assert_allclose(ds.x, feats.astype(np.float32))
    assert ds.device_ids.tolist() == [0, 0, 2, 1, 2]  # ids 10, 20, 30 numbered in order


@pytest.mark.parametrize("arrays, problem", [
    ({"x": np.zeros((3, 4, 4), np.uint8)}, "no 'y' array (keys: ['x'])"),
    ({"y": np.zeros(3, np.int64)}, "no 'x' array"),
    ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.zeros(4, np.int64)}, "y has shape (4,), but there are 3 samples"),
    ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.array([0, -1, 2])}, "label -1 at sample 1 is out of range"),
    ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.array([0, 1, 9]), "num_classes": np.int64(5)},
     "label 9 at sample 2 is out of range; labels must be 0..C-1 (num_classes 5 in the file)"),
    ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.array([0, 0.5, 1])}, "holds 0.5 at sample 1"),
    ({"x": np.zeros((3, 4, 4), np.float32), "y": np.zeros(3, np.int64)}, "images in x must be uint8"),
    ({"x": np.zeros((3, 8, 8, 3), np.uint8), "y": np.zeros(3, np.int64)}, "looks channels-last"),
    ({"x": np.zeros((3,), np.uint8), "y": np.zeros(3, np.int64)}, "x has shape (3,)"),
    ({"x": np.zeros((0, 4), np.float32), "y": np.zeros(0, np.int64)}, "x holds no samples"),
    ({"x": np.array([[0.0, np.nan]]), "y": np.zeros(1, np.int64)}, "holds nan at sample 0, feature 1"),
    ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.zeros(3, np.int64), "device": np.zeros(2, np.int64)},
     "device ids ('device') have shape (2,), but there are 3 samples"),
])
def test_bad_npz_files_are_one_error_naming_the_file(tmp_path, arrays, problem):
    np.savez(tmp_path / "bad.npz", **arrays)
    bad(tmp_path / "bad.npz", problem)


def test_ragged_and_unreadable_npz(tmp_path):
    ragged = np.empty(2, dtype=object)
    ragged[:] = [np.zeros(3), np.zeros(4)]
    np.savez(tmp_path / "ragged.npz", x=ragged, y=np.zeros(2, np.int64))  # what numpy makes of unequal rows
    bad(tmp_path / "ragged.npz", "rows of unequal length?")
    (tmp_path / "junk.npz").write_bytes(b"not a zip archive")
    bad(tmp_path / "junk.npz", "not a readable .npz archive")
    bad(tmp_path / "absent.npz", "no such file or directory")
    (tmp_path / "data.bin").write_bytes(b"")
    bad(tmp_path / "data.bin", "cannot tell its format from the extension '.bin'")


def test_decoded_once_then_memory_mapped_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2, 3, 3), np.uint8), y=np.array([0, 1, 0, 1]),
             device=np.array([5, 5, 6, 6]))
    calls = []
    monkeypatch.setitem(formats._DECODERS, "npz", lambda *a: calls.append(a) or formats._npz(*a))
    first = read(tmp_path / "d.npz")
    caches = list((tmp_path / CACHE_DIR).iterdir())
    assert len(caches) == 1 and caches[0].name.startswith("file-d.npz-")
    # decoded, then read back from the cache it wrote: a Ray host can read its own rows of that file
    assert len(calls) == 1 and isinstance(first.x, np.memmap) and first.x_file == str(caches[0] / "x.npy")
    again = read(tmp_path / "d.npz")
    assert len(calls) == 1 and isinstance(again.x, np.memmap) and again.device_ids.tolist() == [0, 0, 1, 1]
    assert again.num_classes == 2 and again.name == "d.npz" and again.x_file == first.x_file
    read(tmp_path / "d.npz", device_column="other")  # other options: decoded again, no device ids
    assert len(calls) == 2
    np.savez(tmp_path / "d.npz", x=np.ones((5, 1, 3, 3), np.uint8), y=np.arange(5))  # a new file: rebuilt
    fresh = read(tmp_path / "d.npz")
    assert len(calls) == 3 and fresh.x.shape == (5, 1, 3, 3) and fresh.device_ids is None


# ---------------------------------------------------------------- ImageFolder


def write_image(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_image_folder_classes_channels_and_sizes(tmp_path):
    root = tmp_path / "pets"
    rng = np.random.default_rng(1)
    gray = {f"{c}/{i}.png": rng.integers(0, 256, (6, 4), dtype=np.uint8) for c in ("dog", "cat") for i in range(2)}
    for name, arr in gray.items():
        write_image(root / name, arr)
    (root / "cat" / "notes.txt").write_text("not an image: skipped")
    ds = read(root)
    assert ds.name == "pets" and ds.x.shape == (4, 1, 6, 4) and ds.num_classes == 2
    assert ds.y.tolist() == [0, 0, 1, 1]  # classes in sorted order: cat, dog; files sorted within each
    np.testing.assert_array_equal(ds.x[2, 0], gray["dog/0.png"])

    write_image(root / "emu" / "a.png", rng.integers(0, 256, (6, 4, 3), dtype=np.uint8))  # one colour image
    ds = read(root, format="imagefolder")
    assert ds.x.shape == (5, 3, 6, 4) and ds.num_classes == 3  # all read as RGB
    np.testing.assert_array_equal(ds.x[0, 0], ds.x[0, 2])  # a grey image has equal channels
    write_image(root / "emu" / "b.png", rng.integers(0, 256, (9, 9, 3), dtype=np.uint8))
    bad(root, "9x9 pixels, but")
    resized = read(root, image_size=(8, 8))
    assert resized.x.shape == (6, 3, 8, 8)


def test_image_size_resizes_npz_images_and_refuses_tables(tmp_path):
    x = np.zeros((2, 1, 4, 4), np.uint8)
    x[:, :, :, 2:] = 200  # left half black, right half bright
    np.savez(tmp_path / "i.npz", x=x, y=np.array([0, 1]))
    ds = read(tmp_path / "i.npz", image_size=(8, 2))
    assert ds.x.shape == (2, 1, 8, 2) and ds.x[0, 0, :, 0].max() < 100 < ds.x[0, 0, :, 1].min()
    np.savez(tmp_path / "v.npz", x=np.zeros((2, 3)), y=np.array([0, 1]))
    bad(tmp_path / "v.npz", "data.image_size resizes images, and x holds feature vectors", image_size=(2, 2))
    (tmp_path / "t.csv").write_text("label,a\n0,1\n")
    bad(tmp_path / "t.csv", "data.image_size resizes images, and a table holds feature vectors", image_size=(2, 2))


def test_bad_image_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(b"")
    bad(tmp_path / "flat", "no class folders")
    write_image(tmp_path / "two" / "a" / "1.png", np.zeros((4, 4), np.uint8))
    (tmp_path / "two" / "b").mkdir()
    with pytest.raises(DataError, match="two/b: class folder holds no images"):
        read(tmp_path / "two")
    (tmp_path / "two" / "b" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match="two/b/broken.png: not a readable image"):
        read(tmp_path / "two")
    np.savez(tmp_path / "f.npz", x=np.zeros((1, 2)), y=np.zeros(1, np.int64))
    bad(tmp_path / "f.npz", "an ImageFolder is a directory", format="imagefolder")


# ---------------------------------------------------------------- tables


def test_csv_features_labels_and_device_column(tmp_path):
    (tmp_path / "t.csv").write_text("a,label,b,device\n1.5,cat,2,u7\n0,dog,-1,u3\n3,cat,0.25,u7\n")
    ds = read(tmp_path / "t.csv")
    assert ds.x.dtype == np.float32 and ds.x.tolist() == [[1.5, 2.0], [0.0, -1.0], [3.0, 0.25]]
    assert ds.y.tolist() == [0, 1, 0] and ds.num_classes == 2  # names in sorted order
    assert ds.device_ids.tolist() == [1, 0, 1]
    (tmp_path / "n.csv").write_text("y,f\n2,0.5\n0,1.5\n")
    ds = read(tmp_path / "n.csv", label_column="y")
    assert ds.y.tolist() == [2, 0] and ds.num_classes == 3 and ds.device_ids is None  # no 'device' column


@pytest.mark.parametrize("text, problem", [
    ("a,b\n1,2\n", "no label column 'label' (columns: a, b); name it with data.label_column"),
    ("label,device\n1,2\n", "no feature columns"),
    ("label,a,b\n1,2,x\n0,1,y\n", "feature column 'b' is not numeric"),
    ("label,a\n1,2\n0,\n", "column 'a' is empty or not finite at row 3"),
    ("label,a\n1,2\n-2,3\n", "label -2 at sample 1 is out of range"),
    ("label,a\n", "the table holds no rows"),
    ("", "not a readable CSV table"),
    ("label,a,device\n1,2,u1\n0,1,\n", "device ids (column 'device') are missing for some samples"),
])
def test_bad_csv_files_are_one_error_naming_the_file(tmp_path, text, problem):
    (tmp_path / "bad.csv").write_text(text)
    bad(tmp_path / "bad.csv", problem)


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="pyarrow not installed")
def test_parquet_reads_like_csv(tmp_path):
    import pandas as pd

    pd.DataFrame({"f1": [0.5, 1.0, 2.0], "label": [1, 0, 1], "user": ["a", "b", "a"]}).to_parquet(tmp_path / "t.parquet")
    ds = read(tmp_path / "t.parquet", device_column="user")
    assert ds.x.tolist() == [[0.5], [1.0], [2.0]] and ds.y.tolist() == [1, 0, 1] and ds.device_ids.tolist() == [0, 1, 0]
    (tmp_path / "junk.parquet").write_bytes(b"nope")
    bad(tmp_path / "junk.parquet", "not a readable parquet table")


def test_parquet_without_pyarrow_says_to_install_it(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    real = importlib.util.find_spec
    monkeypatch.setattr(formats.importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    bad(tmp_path / "t.parquet", "reading parquet needs pyarrow, which is not installed: `pip install pyarrow`")


# ---------------------------------------------------------------- through the config and the CLI


def test_config_fields_of_file_datasets():
    with pytest.raises(ConfigError, match="data.path: got ''; data.dataset=file reads"):
        tiny_config("data.dataset=file")
    with pytest.raises(ConfigError, match="data.path: .*is read only by data.dataset=file"):
        tiny_config("data.path=x.npz")
    with pytest.raises(ConfigError, match="data.format"):
        tiny_config("data.dataset=file", "data.path=x.npz", "data.format=hdf5")
    with pytest.raises(ConfigError, match="data.image_size"):
        tiny_config("data.dataset=file", "data.path=x", "data.image_size=[28]")
    with pytest.raises(ConfigError, match="data.device_column: got 'label'; must differ"):
        tiny_config("data.dataset=file", "data.path=x.csv", "data.device_column=label")


def test_a_bad_file_stops_the_run_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((30, 28, 28), np.uint8))
    before = {p.name for p in tmp_path.iterdir()}
    rc = main(["run", "--set", "data.dataset=file", "--set", f"data.path={tmp_path / 'nolabels.npz'}",
               "--set", f"data.data_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0, err
    assert err.startswith(f"lcfed: data error: {tmp_path / 'nolabels.npz'}: no 'y' array")
    assert {p.name for p in tmp_path.iterdir()} == before  # no tracking store, no cache


def test_digits_from_an_npz_file_train_exactly_as_the_built_in(tmp_path):
    """The file path changes nothing but where the samples come from: same numbers, bit for bit."""
    digits = load_dataset("digits", tmp_path)
    np.savez_compressed(tmp_path / "digits.npz", x=digits.x, y=digits.y)
    built_in = run_local(tiny_config("train.rounds=2"))
    from_file = run_local(tiny_config("train.rounds=2", "data.dataset=file", "data.path=digits.npz",
                                      f"data.data_dir={tmp_path}"))
    assert len(built_in.history) == len(from_file.history) == 2
    for a, b in zip(built_in.history, from_file.history, strict=True):
        assert {k: v for k, v in a.items() if k != "round_seconds"} == {k: v for k, v in b.items() if k != "round_seconds"}


# ---------------------------------------------------------------- feature vectors


def test_feature_standardization_by_hand():
    x = np.array([[1.0, 5.0, 7.0], [3.0, 5.0, 9.0], [100.0, 0.0, 0.0]], dtype=np.float32)
    s = Scaling.fit(x, np.array([1, 0]))  # rows 0 and 1 only
    assert s.mean == (2.0, 5.0, 8.0) and s.std == (1.0, 1.0, 1.0)  # feature 1 is constant: std 1
    np.testing.assert_allclose(s.apply(x[:2]).numpy(), [[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]])
    wide = Scaling.fit(np.array([[0.0], [4.0]], dtype=np.float32), np.array([0, 1]))
    assert wide.mean == (2.0,) and wide.std == (2.0,)
    unit = Scaling.unit(3)
    assert torch.equal(unit.apply(x), torch.from_numpy(x))  # features as in the file, not / 255


def test_the_built_in_mlp_takes_any_shape():
    net, init = build_network("mlp", (7,), 3, seed=0)
    assert net.module.decision_layer == "head" and net(init, torch.zeros(2, 7)).shape == (2, 3)
    assert init.numel() == 7 * 128 + 128 + 128 * 128 + 128 + 128 * 3 + 3
    net, init = build_network("mlp", (1, 28, 28), 10, seed=0)
    assert net(init, torch.zeros(1, 1, 28, 28)).shape == (1, 10)
    with pytest.raises(ValueError, match="lenet5 takes images .* model.name=mlp"):
        build_network("lenet5", (7,), 3, seed=0)


def write_blobs(path: Path, n: int = 400, users: int = 8) -> None:
    """A learnable table: 3 classes, Gaussian blobs in 5 features, a user column."""
    rng = np.random.default_rng(7)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 5)) + 3.0 * np.eye(3, 5)[y]
    rows = ["f1,f2,f3,f4,f5,label,device"]
    rows += [",".join(f"{v:.4f}" for v in x[i]) + f",{y[i]},user{i % users}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")


def test_a_table_trains_with_the_mlp_and_a_natural_split(tmp_path):
    write_blobs(tmp_path / "blobs.csv")
    cfg = tiny_config("data.dataset=file", "data.path=blobs.csv", f"data.data_dir={tmp_path}", "model.name=mlp",
                      "data.partition=natural", "data.num_devices=6", "method.name=fedavg", "train.rounds=3")
    ds = load(cfg)
    setup = prepare(cfg, ds)
    assert setup.input_shape == (5,) and len(setup.scaling.mean) == 5
    for d in range(6):
        assert set(ds.device_ids[np.concatenate([setup.partition.train[d], setup.partition.test[d]])]) == {d}
    res = run_local(cfg)
    assert res.final["acc_mean"] > 0.6  # 3 classes: chance is 1/3
    with pytest.raises(ConfigError, match="model.name: got 'lenet5'; does not fit blobs.csv"):
        prepare(cfg.replace(**{"model.name": "lenet5"}))


def test_data_stats_of_a_file_dataset(tmp_path, capsys):
    write_blobs(tmp_path / "blobs.csv")
    assert main(["data", "stats", "--set", "data.dataset=file", "--set", f"data.path={tmp_path / 'blobs.csv'}",
                 "--set", f"data.data_dir={tmp_path}", "--set", "data.partition=natural",
                 "--set", "data.num_devices=8", "--set", "method.name=fedavg", "--set", "model.name=mlp"]) == 0
    out = capsys.readouterr().out
    assert f"file {tmp_path / 'blobs.csv'} natural (largest users with >= 10 samples)" in out
    assert "8 devices, 400 samples" in out


def test_a_file_dataset_is_logged_as_its_file(tmp_path):
    """The MLflow dataset input of a file dataset is named and sourced by the file (relative paths under
    data.data_dir), not by the word 'file' and the data directory."""
    import json

    from lcfed.tracking.inputs import dataset_input

    digits = load_dataset("digits", tmp_path)
    np.savez_compressed(tmp_path / "digits.npz", x=digits.x, y=digits.y)
    cfg = tiny_config("data.dataset=file", "data.path=digits.npz", f"data.data_dir={tmp_path}")
    entity = dataset_input(cfg, prepare(cfg).federation).dataset
    assert entity.name == "file:digits.npz"
    assert json.loads(entity.source) == {"uri": str((tmp_path / "digits.npz").resolve())}
    built_in = dataset_input(tiny_config(f"data.data_dir={tmp_path}"), prepare(tiny_config()).federation).dataset
    assert built_in.name == "digits" and json.loads(built_in.source) == {"uri": str(tmp_path.resolve())}
