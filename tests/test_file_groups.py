"""A file dataset's true groups (``data.group_column``): read from a table column or an .npz array, each
device's group the most common among its samples, and the clustering scored against them (ari and nmi)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lcfed.data import DataError, Dataset, FileSource, load_dataset
from lcfed.data.dataset import CACHE_DIR
from lcfed.data.partition import make_partition
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.run.setup import prepare
from lcfed.run.sources import load
from tests.conftest import tiny_config

GROUP_NAMES = ("north", "south", "west")  # sorted: codes 0, 1, 2


def read(path: Path, **options: object) -> Dataset:
    return load_dataset("file", path.parent, source=FileSource(path.name, **options))  # type: ignore[arg-type]


def bad(path: Path, problem: str, **options: object) -> None:
    """Reading ``path`` is one DataError naming the file, data.group_column and ``problem``."""
    with pytest.raises(DataError) as err:
        read(path, **options)
    text = str(err.value)
    assert str(path) in text and "data.group_column" in text and problem in text, text
    assert "\n" not in text


def blobs(n: int = 480, users: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels, users and their groups (user u in group u % 3): each group permutes the labels,
    so the groups are true clusters."""
    rng = np.random.default_rng(3)
    user = np.arange(n) % users
    group = user % 3
    cls = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 4)) + 3.0 * np.eye(3, 4)[cls]
    y = (cls + group) % 3  # group g sees class c labelled c + g
    return x, y, user, group


def write_csv(path: Path, group_values: list[str] | None = None) -> np.ndarray:
    x, y, user, group = blobs()
    names = [GROUP_NAMES[g] for g in group] if group_values is None else group_values
    rows = ["f1,f2,f3,f4,label,device,cluster"]
    rows += [",".join(f"{v:.4f}" for v in x[i]) + f",{y[i]},user{user[i]},{names[i]}" for i in range(len(y))]
    path.write_text("\n".join(rows) + "\n")
    return group


def file_config(path: Path, *extra: str):
    return tiny_config("data.dataset=file", f"data.path={path.name}", f"data.data_dir={path.parent}",
                       "model.name=mlp", "data.partition=natural", "data.num_devices=6", "data.group_column=cluster",
                       "method.name=ifca", "method.num_clusters=3", "train.rounds=2", "train.participation=1.0",
                       *extra)


def test_a_table_group_column_is_read_and_not_a_feature(tmp_path):
    group = write_csv(tmp_path / "g.csv")
    ds = read(tmp_path / "g.csv", group_column="cluster")
    assert ds.x.shape == (480, 4)  # f1..f4: the label, device and group columns are no features
    assert ds.groups is not None and ds.groups.dtype == np.int64 and np.array_equal(ds.groups, group)
    write_csv(tmp_path / "n.csv", [str(7 * g) for g in group])  # integer ids 0, 7, 14
    with_groups = read(tmp_path / "n.csv", group_column="cluster")
    assert with_groups.groups is not None and np.array_equal(with_groups.groups, group)
    without = read(tmp_path / "n.csv")  # the cache keys on the option: not the stale decode with groups
    assert without.groups is None and without.x.shape == (480, 5)  # without the option, a numeric feature
    again = read(tmp_path / "n.csv", group_column="cluster")
    assert again.groups is not None and np.array_equal(again.groups, group) and again.x.shape == (480, 4)
    assert len(list((tmp_path / CACHE_DIR).iterdir())) == 2  # one entry per file


def test_a_clustered_run_on_a_csv_is_scored_against_the_files_groups(tmp_path):
    write_csv(tmp_path / "g.csv")
    cfg = file_config(tmp_path / "g.csv")
    ds = load(cfg)
    setup = prepare(cfg, ds)
    fed, part = setup.federation, setup.partition
    assert ds.device_ids is not None
    # device d is one user; its group is that user's group in the file (user u: u % 3)
    users = [np.unique(ds.device_ids[np.concatenate([a, b])]).tolist() for a, b in zip(part.train, part.test,
                                                                                      strict=True)]
    assert all(len(u) == 1 for u in users)
    assert fed.group_kind == "g.csv" and fed.groups.tolist() == [u[0] % 3 for u in users]
    res = run_local(cfg)
    clustered = [row for row in res.history if "num_clusters" in row]
    assert clustered and all("ari" in row and "nmi" in row for row in clustered)
    assert "ari" in res.final and "nmi" in res.final


def test_an_npz_group_array(tmp_path):
    x, y, user, group = blobs()
    np.savez(tmp_path / "g.npz", x=x.astype(np.float32), y=y, device=user, cluster=group * 10)
    ds = read(tmp_path / "g.npz", group_column="cluster")
    assert ds.groups is not None and np.array_equal(ds.groups, group)  # ids 0, 10, 20 -> codes 0, 1, 2
    cfg = file_config(tmp_path / "g.npz")
    fed = prepare(cfg).federation
    assert fed.group_kind == "g.npz" and sorted(fed.groups.tolist()) == [0, 0, 1, 1, 2, 2]
    res = run_local(cfg)
    assert "ari" in res.final and "nmi" in res.final


def test_without_a_group_column_only_the_proxy_scores(tmp_path):
    write_csv(tmp_path / "g.csv", [str(g) for g in blobs()[3]])  # numeric: without the option, a feature
    cfg = file_config(tmp_path / "g.csv", "data.group_column=")
    fed = prepare(cfg).federation
    assert fed.group_kind == ""
    assert "nmi" not in run_local(cfg).final


def test_other_partitions_take_each_devices_most_common_training_group():
    labels = np.arange(300) % 5
    sample_groups = (np.arange(300) // 100).astype(np.int64)  # samples 0-99 group 0, ...
    part = make_partition(labels, scheme="dirichlet", num_devices=6, alpha=0.5, seed=1, sample_groups=sample_groups,
                          group_kind="g.csv")
    assert part.group_kind == "g.csv"
    for d, train in enumerate(part.train):
        counts = np.bincount(sample_groups[train], minlength=3)
        assert part.groups[d] == int(np.argmax(counts))
    plain = make_partition(labels, scheme="dirichlet", num_devices=6, alpha=0.5, seed=1)
    assert plain.group_kind == "" and all(np.array_equal(a, b) for a, b in zip(plain.train, part.train, strict=True))


def test_a_natural_user_whose_samples_disagree_takes_its_most_common_group():
    labels = np.zeros(40, dtype=np.int64)
    device_ids = np.repeat(np.arange(2), 20)
    sample_groups = np.zeros(40, dtype=np.int64)
    sample_groups[:3] = 1  # user 0: 17 of group 0, 3 of group 1
    sample_groups[20:35] = 1  # user 1: 15 of group 1
    part = make_partition(labels, scheme="natural", num_devices=2, min_samples=5, seed=0, device_ids=device_ids,
                          sample_groups=sample_groups, group_kind="g.csv")
    users = [int(device_ids[np.concatenate([a, b])][0]) for a, b in zip(part.train, part.test, strict=True)]
    assert part.groups.tolist() == [{0: 0, 1: 1}[u] for u in users]


@pytest.mark.parametrize("values,problem", [
    ([1.5] + [1.0] * 479, "holds 1.5, not an integer, at sample 0"),
    ([""] + ["1"] * 479, "is missing (empty or NaN) at sample 0"),
    (["a"] + [""] * 479, "is missing (empty or NaN) at sample 1"),
])
def test_bad_group_values_are_one_error_naming_the_field(tmp_path, values, problem):
    write_csv(tmp_path / "g.csv", [str(v) for v in values])
    bad(tmp_path / "g.csv", problem, group_column="cluster")


def test_a_missing_group_column_or_array(tmp_path):
    write_csv(tmp_path / "g.csv")
    bad(tmp_path / "g.csv", "no group column 'team'", group_column="team")
    x, y, user, group = blobs()
    np.savez(tmp_path / "g.npz", x=x.astype(np.float32), y=y)
    bad(tmp_path / "g.npz", "no 'cluster' array", group_column="cluster")
    np.savez(tmp_path / "h.npz", x=x.astype(np.float32), y=y, cluster=group + 0.25)
    bad(tmp_path / "h.npz", "not an integer", group_column="cluster")
    np.savez(tmp_path / "i.npz", x=x.astype(np.float32), y=y, cluster=np.where(group == 1, np.nan, group))
    bad(tmp_path / "i.npz", "is missing (empty or NaN) at sample 1", group_column="cluster")
    np.savez(tmp_path / "j.npz", x=x.astype(np.float32), y=y, cluster=group[:10])
    bad(tmp_path / "j.npz", "has shape (10,), but there are 480 samples", group_column="cluster")


def test_a_bad_group_column_stops_the_run_before_any_work(tmp_path):
    write_csv(tmp_path / "g.csv")
    with pytest.raises(DataError, match="data.group_column"):
        run_local(file_config(tmp_path / "g.csv", "data.group_column=team"))


def test_config_checks_of_the_group_column():
    with pytest.raises(ConfigError, match="data.group_column: got 'g'; is read only by data.dataset=file"):
        tiny_config("data.group_column=g")
    with pytest.raises(ConfigError, match="data.group_column: got 'label'; must differ"):
        tiny_config("data.dataset=file", "data.path=x.csv", "data.group_column=label")
    with pytest.raises(ConfigError, match="data.group_column: got 'g'; names the file's true groups"):
        tiny_config("data.dataset=file", "data.path=x.csv", "data.group_column=g", "data.testbed=rotated",
                    "data.partition=iid")
    cfg = tiny_config("data.dataset=file", "data.path=x.csv")
    assert cfg.data.group_column == "" and cfg.digest() == tiny_config("data.dataset=file", "data.path=x.csv",
                                                                       "data.group_column=").digest()


def test_a_sweep_over_the_group_column_loads_each_variant_in_the_driver(tmp_path):
    # trials on worker nodes read no files: every data.* field of a FileSource a space sweeps is loaded here
    from tune_jobs.sweep.trial import load_sources

    group = write_csv(tmp_path / "n.csv", [str(7 * g) for g in blobs()[3]])  # numeric ids: a feature without the option
    base = file_config(tmp_path / "n.csv")
    sources = load_sources(base, {"data.group_column": {"grid_search": ["", "cluster"]}})
    by_groups = {ds.groups is not None: ds for ds in sources.values()}
    assert len(sources) == 2 and by_groups[False].x.shape == (480, 5) and by_groups[True].x.shape == (480, 4)
    assert np.array_equal(by_groups[True].groups, group)
