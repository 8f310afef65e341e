"""Tests of the data layer: dataset loading, partitions, train/test splits and IDX import."""

from __future__ import annotations

import gzip
import os
import struct
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import lcfed.data.importer as importer
from lcfed.data import (
    PARTITIONERS,
    DataError,
    Partition,
    PartitionParams,
    dirichlet,
    dominant_label,
    import_idx,
    load_dataset,
    make_partition,
    pathological,
    split_train_test,
    to_float,
)
from lcfed.data.dataset import CACHE_DIR
from lcfed.data.sources import _from_cifar

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def synthetic_labels(n: int, num_classes: int = 10, seed: int = 123) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, n).astype(np.int64)


def assert_exact_cover(devices: list[np.ndarray], n: int) -> None:
    """Every index 0..n-1 appears in exactly one device, once."""
    flat = np.concatenate(devices)
    assert flat.dtype == np.int64
    assert len(flat) == n
    np.testing.assert_array_equal(np.sort(flat), np.arange(n))


def entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


# ---------------------------------------------------------------- sources


def test_digits_loads_offline(tmp_path: Path) -> None:
    ds = load_dataset("digits", tmp_path / "nothing-here")
    assert ds.name == "digits"
    assert ds.x.shape == (1797, 1, 28, 28) and ds.x.dtype == np.uint8
    assert ds.y.shape == (1797,) and ds.y.dtype == np.int64
    assert ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(np.unique(ds.y), np.arange(10))
    assert ds.x.max() > 200 and ds.x.min() == 0  # scaled to the full 0..255 range
    # Loads are independent copies: writing into one does not leak into the next.
    ds.x[0] = 7
    assert not np.all(load_dataset("digits", tmp_path).x[0] == 7)


def test_synthetic_needs_no_files_and_is_fixed(tmp_path: Path) -> None:
    ds = load_dataset("synthetic", tmp_path / "nothing-here")
    assert ds.x.shape == (60_000, 1, 28, 28) and ds.x.dtype == np.uint8 and ds.num_classes == 10
    assert set(np.unique(ds.y)) == set(range(10))
    again = load_dataset("synthetic", tmp_path)
    np.testing.assert_array_equal(ds.x[:100], again.x[:100])
    # the class carries signal: per-class mean images differ far more than their noise
    means = np.stack([ds.x[ds.y == c].mean(0) for c in range(10)])
    assert np.abs(means[0] - means[1]).mean() > 20


def test_to_float_scales_to_unit_interval() -> None:
    x = np.array([[[[0, 51, 255]]]], dtype=np.uint8)
    t = to_float(x)
    assert t.dtype == torch.float32 and t.shape == (1, 1, 1, 3)
    torch.testing.assert_close(t.flatten(), torch.tensor([0.0, 0.2, 1.0]))
    with pytest.raises(TypeError):
        to_float(x.astype(np.float32))


def test_missing_mnist_files_raise_data_error_with_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_dataset("mnist", tmp_path)
    msg = str(info.value)
    assert "mnist" in msg and str(tmp_path) in msg and "lcfed data import" in msg


def test_missing_cifar_files_raise_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cifar10"):
        load_dataset("cifar10", tmp_path)


def test_unknown_dataset_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="known"):
        load_dataset("imagenet", tmp_path)


def test_from_cifar_transposes_hwc_to_chw() -> None:
    data = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    x, y = _from_cifar(SimpleNamespace(data=data, targets=[3, 1]))
    assert x.shape == (2, 3, 4, 5) and x.dtype == np.uint8 and x.flags.c_contiguous
    np.testing.assert_array_equal(x[1, 2], data[1, :, :, 2])
    assert y.dtype == np.int64 and y.tolist() == [3, 1]


# ---------------------------------------------------------------- partitions


def test_dirichlet_uses_every_sample_once() -> None:
    labels = synthetic_labels(5000)
    devices = dirichlet(labels, num_devices=50, alpha=0.3, min_samples=20, seed=0)
    assert len(devices) == 50
    assert_exact_cover(devices, len(labels))
    assert min(len(d) for d in devices) >= 20


def test_pathological_uses_every_sample_once() -> None:
    labels = synthetic_labels(3000)
    devices, groups = pathological(labels, num_devices=7, classes_per_device=2, seed=0)  # 14 >= 10
    assert len(devices) == 7 and groups.shape == (7,) and groups.dtype == np.int64
    assert_exact_cover(devices, len(labels))


def test_pathological_without_holder_drops_only_that_class() -> None:
    labels = synthetic_labels(1000)
    devices, _ = pathological(labels, num_devices=2, classes_per_device=3, seed=1)  # 6 < 10 classes
    flat = np.concatenate(devices)
    assert len(np.unique(flat)) == len(flat)  # still no duplicates
    held = np.unique(labels[flat])
    assert len(held) == 6
    assert len(flat) == np.isin(labels, held).sum()  # held classes are used in full


@pytest.mark.parametrize("scheme", sorted(PARTITIONERS))
def test_make_partition_is_a_pure_function_of_the_seed(scheme: str) -> None:
    labels = synthetic_labels(4000)

    def make(seed: int) -> Partition:
        return make_partition(labels, scheme=scheme, num_devices=20, alpha=0.5, min_samples=10, seed=seed)

    a, b, c = make(5), make(5), make(6)
    assert a.num_devices == 20
    for x, y in zip(a.train + a.test, b.train + b.test, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.groups, b.groups)
    assert any(not np.array_equal(x, y) for x, y in zip(a.train, c.train, strict=True))
    # train + test of every device is exactly what the partitioner dealt it for that seed.
    params = PartitionParams(num_devices=20, alpha=0.5, classes_per_device=2, min_samples=10, seed=5)
    dealt, groups = PARTITIONERS[scheme](labels, params)
    np.testing.assert_array_equal(groups, a.groups)
    for d, tr, te in zip(dealt, a.train, a.test, strict=True):
        np.testing.assert_array_equal(np.sort(d), np.sort(np.concatenate([tr, te])))
    np.testing.assert_array_equal(a.sizes(), [len(t) for t in a.train])


def test_smaller_alpha_gives_more_label_skew() -> None:
    labels = synthetic_labels(10_000)

    def mean_entropy(alpha: float) -> float:
        devices = dirichlet(labels, num_devices=20, alpha=alpha, min_samples=10, seed=0)
        return float(np.mean([entropy(np.bincount(labels[d], minlength=10)) for d in devices]))

    skewed, mixed = mean_entropy(0.1), mean_entropy(10.0)
    assert skewed < mixed - 0.5
    assert mixed > 0.9 * np.log(10)


def test_dirichlet_minimum_holds_fast_at_tiny_alpha_many_devices() -> None:
    labels = synthetic_labels(70_000)
    start = time.perf_counter()
    devices = dirichlet(labels, num_devices=10_000, alpha=0.01, min_samples=5, seed=0)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"dirichlet took {elapsed:.1f} s (rejection-loop style hang?)"
    assert min(len(d) for d in devices) >= 5
    assert_exact_cover(devices, len(labels))
    # Label skew survives the top-up: most devices are (nearly) single-class.
    purity = [np.bincount(labels[d]).max() / len(d) for d in devices]
    assert np.median(purity) > 0.9
    # Topped-up devices keep their own dominant class, so every class dominates ~1/10 of them.
    assert np.bincount(dominant_label(devices, labels), minlength=10).min() > 800


def test_dirichlet_rejects_infeasible_minimum() -> None:
    with pytest.raises(ValueError, match="min_samples"):
        dirichlet(synthetic_labels(100), num_devices=11, alpha=1.0, min_samples=10, seed=0)


def test_dirichlet_groups_are_dominant_classes() -> None:
    labels = synthetic_labels(2000)
    part = make_partition(labels, scheme="dirichlet", num_devices=10, alpha=0.2, min_samples=5, seed=3)
    for tr, te, g in zip(part.train, part.test, part.groups, strict=True):
        counts = np.bincount(labels[np.concatenate([tr, te])], minlength=10)
        assert counts[g] == counts.max()
    np.testing.assert_array_equal(dominant_label([np.array([0, 1, 2])], np.array([4, 7, 7])), [7])


def test_pathological_class_sets_and_groups() -> None:
    labels = synthetic_labels(6000)
    devices, groups = pathological(labels, num_devices=30, classes_per_device=3, seed=2)
    sets = [tuple(np.unique(labels[d])) for d in devices]
    assert all(len(s) == 3 for s in sets)
    for i in range(30):
        for j in range(30):
            assert (groups[i] == groups[j]) == (sets[i] == sets[j])
    # ids 0..G-1 in order of first appearance
    _, first = np.unique(groups, return_index=True)
    np.testing.assert_array_equal(groups[np.sort(first)], np.arange(len(first)))
    usage = np.bincount(np.concatenate([list(s) for s in sets]), minlength=10)
    assert usage.max() - usage.min() <= 1  # balanced class usage
    for c in range(10):  # each class split evenly among its holders
        shares = [np.count_nonzero(labels[d] == c) for d in devices if c in set(labels[d].tolist())]
        assert max(shares) - min(shares) <= 1


def test_pathological_validates_classes_per_device() -> None:
    with pytest.raises(ValueError, match="classes_per_device"):
        pathological(synthetic_labels(100), num_devices=3, classes_per_device=11, seed=0)


def test_split_train_test_is_stratified_disjoint_and_complete() -> None:
    labels = synthetic_labels(20_000)
    devices = dirichlet(labels, num_devices=200, alpha=0.5, min_samples=1, seed=1)
    devices += [np.array([0]), np.array([1, 2]), np.empty(0, dtype=np.int64)]  # edge cases
    train, test = split_train_test(devices, labels, test_fraction=0.2, seed=9)
    assert len(train) == len(test) == len(devices)
    enough = 0
    for d, tr, te in zip(devices, train, test, strict=True):
        assert tr.dtype == te.dtype == np.int64
        assert len(np.intersect1d(tr, te)) == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.sort(d))
        if len(d) >= 1:
            assert len(tr) >= 1
        if len(d) >= 2:
            assert len(te) >= 1
        counts = np.bincount(labels[d], minlength=10)
        if len(d) and counts[counts > 0].min() >= 3:
            enough += 1
            np.testing.assert_array_equal(np.unique(labels[tr]), np.unique(labels[te]))
            assert abs(len(te) - 0.2 * len(d)) <= np.count_nonzero(counts) / 2
    assert enough >= 20  # the stratification check actually ran
    again = split_train_test(devices, labels, test_fraction=0.2, seed=9)
    assert all(np.array_equal(a, b) for a, b in zip(train + test, again[0] + again[1], strict=True))


def test_split_train_test_is_fast_for_many_devices() -> None:
    labels = synthetic_labels(70_000)
    devices = dirichlet(labels, num_devices=10_000, alpha=0.5, min_samples=5, seed=0)
    start = time.perf_counter()
    split_train_test(devices, labels, test_fraction=0.2, seed=0)
    assert time.perf_counter() - start < 2.0


def test_make_partition_dispatches_through_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    def every_sample_to_device_zero(labels: np.ndarray, params: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
        devices = [np.arange(len(labels))] + [np.empty(0, np.int64)] * (params.num_devices - 1)
        return devices, np.zeros(params.num_devices, dtype=np.int64)

    monkeypatch.setitem(PARTITIONERS, "all_to_zero", every_sample_to_device_zero)
    part = make_partition(synthetic_labels(100), scheme="all_to_zero", num_devices=3)
    assert part.sizes().tolist()[1:] == [0, 0] and part.sizes()[0] + len(part.test[0]) == 100
    with pytest.raises(ValueError, match="unknown partition scheme"):
        make_partition(synthetic_labels(100), scheme="nope", num_devices=3)


# ---------------------------------------------------------------- IDX import


def write_idx(path: Path, array: np.ndarray, *, magic: int | None = None) -> None:
    """Write ``array`` (uint8, (N,) labels or (N, H, W) images) as IDX, gzipped if ``path`` ends .gz."""
    if magic is None:
        magic = 2049 if array.ndim == 1 else 2051
    payload = struct.pack(">I", magic) + b"".join(struct.pack(">I", s) for s in array.shape) + array.tobytes()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def write_mnist_dir(directory: Path, seed: int = 0, n_train: int = 20, n_test: int = 10) -> dict[str, np.ndarray]:
    """Tiny synthetic MNIST in mixed spellings (gz/plain, dot/dash); returns what was written."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    write_idx(directory / "train-images.idx3-ubyte.gz", arrays["train_x"])
    write_idx(directory / "train-labels.idx1-ubyte", arrays["train_y"])
    write_idx(directory / "t10k-images-idx3-ubyte", arrays["test_x"])
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", arrays["test_y"])
    return arrays


@pytest.fixture
def no_default_idx_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the machine's own IDX directories (Debian package, env var) out of the search."""
    monkeypatch.setattr(importer, "DEFAULT_IDX_DIRS", ())
    monkeypatch.delenv(importer.IDX_DIRS_ENV, raising=False)


def test_import_idx_then_load_mnist(tmp_path: Path, no_default_idx_dirs: None) -> None:
    src, data_dir = tmp_path / "mirror", tmp_path / "data"
    arrays = write_mnist_dir(src)
    done = import_idx(data_dir, [src])
    assert done == [("mnist", data_dir / "MNIST" / "raw")]
    assert sorted(p.name for p in (data_dir / "MNIST" / "raw").iterdir()) == sorted(importer.IDX_FILES)
    ds = load_dataset("mnist", data_dir)
    assert ds.x.shape == (30, 1, 28, 28) and ds.x.dtype == np.uint8 and ds.num_classes == 10
    np.testing.assert_array_equal(ds.x[:20, 0], arrays["train_x"])  # train pool first
    np.testing.assert_array_equal(ds.x[20:, 0], arrays["test_x"])
    np.testing.assert_array_equal(ds.y, np.concatenate([arrays["train_y"], arrays["test_y"]]))

    # Idempotent, and a re-import overwrites with the new files.
    arrays2 = write_mnist_dir(src, seed=1, n_train=5, n_test=3)
    assert import_idx(data_dir, [src]) == done
    ds2 = load_dataset("mnist", data_dir)
    np.testing.assert_array_equal(ds2.y, np.concatenate([arrays2["train_y"], arrays2["test_y"]]))
    assert not [p for p in (data_dir / "MNIST" / "raw").iterdir() if p.name.endswith(".tmp")]


def test_decoded_dataset_is_cached_and_memory_mapped(tmp_path: Path, no_default_idx_dirs: None) -> None:
    src, data_dir = tmp_path / "mirror", tmp_path / "data"
    arrays = write_mnist_dir(src)
    import_idx(data_dir, [src])
    first = load_dataset("mnist", data_dir)
    cache = data_dir / CACHE_DIR / "mnist"
    assert sorted(p.name for p in cache.iterdir()) == ["stamp.json", "x.npy", "y.npy"]
    # decoded by torchvision, then read back from the cache it wrote (a Ray host can read its rows there)
    assert isinstance(first.x, np.memmap) and first.x_file == str(cache / "x.npy")
    decoded = np.array(first.x)

    again = load_dataset("mnist", data_dir)
    assert isinstance(again.x, np.memmap) and not again.x.flags.writeable
    np.testing.assert_array_equal(again.x, decoded)
    np.testing.assert_array_equal(again.y, first.y)
    np.testing.assert_array_equal(again.x[:20, 0], arrays["train_x"])

    # a changed source file (same size, new content and mtime) is decoded again, not served stale
    raw = data_dir / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    new_labels = (arrays["test_y"] + 1) % 10
    write_idx(raw, new_labels.astype(np.uint8))
    os.utime(raw, ns=(time.time_ns(), time.time_ns() + 10**9))
    fresh = load_dataset("mnist", data_dir)
    np.testing.assert_array_equal(fresh.y[20:], new_labels)
    np.testing.assert_array_equal(load_dataset("mnist", data_dir).y[20:], new_labels)

    # a damaged cache is ignored and rewritten
    (cache / "x.npy").write_bytes(b"not an array")
    np.testing.assert_array_equal(load_dataset("mnist", data_dir).x, decoded)
    assert isinstance(load_dataset("mnist", data_dir).x, np.memmap)


def test_import_idx_kinds_by_path_tuple_and_env(
    tmp_path: Path, no_default_idx_dirs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_mnist_dir(tmp_path / "Fashion-files")
    write_mnist_dir(tmp_path / "plain")
    data_dir = tmp_path / "data"
    assert import_idx(data_dir, [tmp_path / "Fashion-files"]) == [("fashion_mnist", data_dir / "FashionMNIST" / "raw")]
    assert import_idx(data_dir, [("fashion_mnist", tmp_path / "plain")])[0][0] == "fashion_mnist"
    monkeypatch.setenv(importer.IDX_DIRS_ENV, f"{tmp_path / 'nowhere'}:{tmp_path / 'plain'}")
    assert import_idx(data_dir) == [("mnist", data_dir / "MNIST" / "raw")]
    assert load_dataset("fashion_mnist", data_dir).x.shape == (30, 1, 28, 28)


def test_import_idx_rejects_bad_magic_naming_the_file(tmp_path: Path, no_default_idx_dirs: None) -> None:
    src = tmp_path / "mirror"
    write_mnist_dir(src)
    write_idx(src / "t10k-images-idx3-ubyte", np.zeros((10, 28, 28), np.uint8), magic=2052)
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte") as info:
        import_idx(tmp_path / "data", [src])
    assert "magic" in str(info.value)
    raw = tmp_path / "data" / "MNIST" / "raw"
    assert not raw.exists() or not list(raw.iterdir())  # nothing placed, no temp files left


def test_import_idx_rejects_count_mismatch(tmp_path: Path, no_default_idx_dirs: None) -> None:
    src = tmp_path / "mirror"
    write_mnist_dir(src)
    write_idx(src / "train-labels.idx1-ubyte", np.zeros(19, np.uint8))
    with pytest.raises(DataError, match="20 images"):
        import_idx(tmp_path / "data", [src])


def test_import_idx_rejects_truncated_file(tmp_path: Path, no_default_idx_dirs: None) -> None:
    src = tmp_path / "mirror"
    write_mnist_dir(src)
    path = src / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte"):
        import_idx(tmp_path / "data", [src])


def test_import_idx_nothing_found_gives_hints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer, "DEFAULT_IDX_DIRS", (tmp_path / "no-debian-here",))
    monkeypatch.setenv(importer.IDX_DIRS_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as info:
        import_idx(tmp_path / "data")
    msg = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "get-mnist.sh" in msg and "lcfed data import --from" in msg
    assert str(tmp_path / "no-debian-here") in msg and str(tmp_path / "empty") in msg


def test_import_idx_explicit_source_without_files_is_an_error(tmp_path: Path, no_default_idx_dirs: None) -> None:
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        import_idx(tmp_path / "data", [tmp_path / "typo"])


@pytest.mark.skipif(
    not DEBIAN_FASHION.is_dir(), reason=f"{DEBIAN_FASHION} absent (apt-get install dataset-fashion-mnist)"
)
def test_import_debian_fashion_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(importer.IDX_DIRS_ENV, raising=False)
    done = import_idx(tmp_path)
    assert ("fashion_mnist", tmp_path / "FashionMNIST" / "raw") in done
    ds = load_dataset("fashion_mnist", tmp_path)
    assert ds.x.shape == (70_000, 1, 28, 28) and ds.y.shape == (70_000,)
    np.testing.assert_array_equal(np.bincount(ds.y), np.full(10, 7000))


def test_primary_secondary_split_has_the_papers_shape():
    from lcfed.data.schemes import primary_secondary

    labels = np.repeat(np.arange(10), 7000)
    devices, groups = primary_secondary(labels, 100, (0.4, 0.6), (0.2, 0.4), seed=3)
    assert [len(d) for d in devices] == [700] * 100  # equal shares, every sample used once
    assert len(np.unique(np.concatenate(devices))) == 70_000
    assert np.bincount(groups, minlength=10).tolist() == [10] * 10  # each class is primary for m / C devices
    for dev, prim in zip(devices, groups, strict=True):
        frac = np.bincount(labels[dev], minlength=10) / len(dev)
        second = np.sort(frac)[-2]
        assert 0.32 <= frac[prim] <= 0.66 and frac.argmax() == prim  # a class short of supply is scaled down a little
        assert 0.15 <= second <= 0.45
        others = np.delete(frac, [prim, np.argsort(frac)[-2]])
        assert others.max() <= 0.1  # the rest spread thin (evenly only where supply allows)
    again, _ = primary_secondary(labels, 100, (0.4, 0.6), (0.2, 0.4), seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(devices, again, strict=True))


def test_quantity_skew_draws_sizes_in_range_and_keeps_small_devices():
    from lcfed.data.schemes import quantity_skew

    devices = [np.arange(i * 1000, (i + 1) * 1000) for i in range(50)] + [np.arange(60_000, 60_030)]
    cut = quantity_skew(devices, 50, 350, seed=0)
    sizes = np.array([len(d) for d in cut])
    assert sizes[:50].min() >= 50 and sizes[:50].max() <= 350 and len(np.unique(sizes)) > 20
    assert sizes[50] == 30  # fewer than low: keeps all
    for before, after in zip(devices, cut, strict=True):
        assert np.isin(after, before).all() and len(np.unique(after)) == len(after)


def test_quantity_skew_through_the_config():
    from lcfed.run.setup import prepare
    from tests.conftest import tiny_config

    part = prepare(tiny_config("data.num_devices=10", "data.samples_per_device=[20, 40]",
                               "data.partition=dirichlet", "data.alpha=0.5")).partition
    totals = [len(a) + len(b) for a, b in zip(part.train, part.test, strict=True)]
    assert min(totals) >= 20 and max(totals) <= 40
