"""LEAF's synthetic(α, β) generator: sizes, streams, the input covariance, known clusters a method recovers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lcfed.data.generated import (
    BLOCK,
    DEFAULT_PER_DEVICE,
    FEATURES,
    GeneratedSpec,
    device_sizes,
    generate_devices,
    leaf_synthetic,
)
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.run.setup import prepare
from lcfed.run.shards import (
    NodeShard,
    NodeSplit,
    check_generated,
    feature_pieces,
    node_facts,
    node_generated,
    setup_on_hosts,
    shard,
    shard_scaling_rows,
)
from lcfed.run.sources import load
from tests.conftest import tiny_config


def test_sizes_streams_and_the_input_covariance():
    sizes = device_sizes(50, 1000, 4)
    assert sizes.sum() == 1000 and sizes.min() >= 4 and len(set(sizes.tolist())) > 10  # lognormal shares
    ds = leaf_synthetic(20, alpha=1.0, beta=1.0, samples=20 * 600, min_samples=500)
    again = leaf_synthetic(20, alpha=1.0, beta=1.0, samples=20 * 600, min_samples=500)
    assert np.array_equal(ds.x, again.x) and np.array_equal(ds.y, again.y) and ds.groups is None
    assert ds.x.shape == (12_000, FEATURES) and ds.x.dtype == np.float32 and ds.num_classes == 10
    assert np.array_equal(ds.device_ids, np.repeat(np.arange(20), device_sizes(20, 12_000, 500)))
    # around its own centre v_k, a device's feature j varies with variance j^-1.2
    resid = np.concatenate([ds.x[ds.device_ids == d] - ds.x[ds.device_ids == d].mean(0) for d in range(20)])
    for j in (1, 10, 60):
        assert resid[:, j - 1].var() == pytest.approx(j**-1.2, rel=0.1)
    # devices past the first block come from a stream of their own: none repeats the first block's
    big = leaf_synthetic(BLOCK + 4, samples=2 * (BLOCK + 4))
    first, past = big.x[big.device_ids == 0], big.x[big.device_ids == BLOCK]
    assert len(big.y) == 2 * (BLOCK + 4) and not np.allclose(first[:2], past[:2])
    assert len(leaf_synthetic(10).y) == DEFAULT_PER_DEVICE * 10


def test_known_clusters_share_a_model_and_an_input_centre():
    ds = leaf_synthetic(24, beta=0.0, clusters=3, samples=24 * 400, min_samples=400)
    per_device = np.array([np.unique(ds.groups[ds.device_ids == d]) for d in range(24)])
    assert per_device.shape == (24, 1) and np.bincount(per_device[:, 0]).tolist() == [8, 8, 8]
    means = np.stack([ds.x[ds.device_ids == d].mean(0) for d in range(24)])
    near = np.linalg.norm(means[:, None] - means[None], axis=2) < 0.5  # β = 0: a group's devices alike
    assert np.array_equal(near, per_device == per_device.T)
    labels = [np.bincount(ds.y[ds.groups == g], minlength=10) / np.sum(ds.groups == g) for g in range(3)]
    assert min(np.abs(labels[a] - labels[b]).sum() for a, b in ((0, 1), (0, 2), (1, 2))) > 0.5


def _generated(*overrides: str):
    return tiny_config("data.dataset=leaf_synthetic", "data.partition=natural", "data.num_devices=24",
                       "data.synthetic_clusters=3", "data.synthetic_beta=0.3", "data.test_fraction=0.3",
                       "model.name=mlp", *overrides)


def test_lcfed_recovers_the_generated_clusters():
    cfg = _generated("method.num_clusters=3", "method.rank=3", "train.rounds=6", "train.local_steps=5",
                     "train.eval_every=6", "train.participation=1.0")
    setup = prepare(cfg)
    assert setup.federation.group_kind == "leaf_synthetic" and np.bincount(setup.federation.groups).tolist() == [8, 8, 8]
    res = run_local(cfg)
    assert res.final["ari"] == 1.0 and res.final["nmi"] == 1.0 and res.final["acc_mean"] > 0.9


@pytest.mark.parametrize("override,field,says", [
    ("data.partition=dirichlet", "data.partition", "must be natural with data.dataset=leaf_synthetic"),
    ("data.synthetic_clusters=25", "data.synthetic_clusters", r"must be in \[0, num_devices = 24\]"),
    ("data.synthetic_beta=-1", "data.synthetic_beta", "must be a finite number >= 0"),
    ("data.synthetic_samples=30", "data.synthetic_samples", r"num_devices x min_samples \(24 x "),
])
def test_bad_generator_fields_name_the_field(override, field, says):
    with pytest.raises(ConfigError, match=f"{field.replace('.', r'[.]')}.*{says}"):
        _generated(override)


def test_generator_fields_are_refused_for_other_datasets():
    with pytest.raises(ConfigError, match=r"data\.synthetic_alpha.*read only by data\.dataset=leaf_synthetic"):
        tiny_config("data.synthetic_alpha=2")


def test_any_devices_generate_alone_as_in_the_whole_federation():
    spec = GeneratedSpec(BLOCK + 300, clusters=3, samples=4 * (BLOCK + 300), min_samples=2)
    whole, starts = generate_devices(spec, 0, spec.num_devices), spec.starts()
    for first, stop in [(0, 1), (BLOCK - 2, BLOCK + 2), (17, BLOCK + 300), (5, 5)]:  # across a block's edge too
        part = generate_devices(spec, first, stop)
        rows = slice(int(starts[first]), int(starts[stop]))
        for name in ("x", "y", "device_ids", "groups"):
            assert np.array_equal(getattr(part, name), getattr(whole, name)[rows])


class LocalHosts:
    """:class:`lcfed.run.shards.GeneratingHosts` in this process: what the Ray engine's device actors do."""

    def __init__(self, shards: list[NodeShard]) -> None:
        self.shards, self.ds = shards, [sh.generate() for sh in shards]

    def test_split(self):
        self.splits = [sh.test_split(ds) for sh, ds in zip(self.shards, self.ds, strict=True)]
        return [p.counts(sh.stop - sh.first) for p, sh in zip(self.splits, self.shards, strict=True)]

    def partition(self, shards, held_out):
        self.lists = [sh.lists(ds, p) for sh, ds, p in zip(shards, self.ds, self.splits, strict=True)]
        self.rows = [shard_scaling_rows(sh, lists[0], held) for sh, lists, held in zip(shards, self.lists, held_out,
                                                                                      strict=True)]
        return [{**node_facts(sh, ds, lists), "scaling_rows": len(rows)}
                for sh, ds, lists, rows in zip(shards, self.ds, self.lists, self.rows, strict=True)]

    def feature_pieces(self, before, total, mean):
        return [feature_pieces(ds.x, rows, b, total, mean) for ds, rows, b in zip(self.ds, self.rows, before, strict=True)]


@pytest.mark.parametrize("extra,cuts", [
    # known groups, a validation split and newcomers; 3 hosts, so the scaling's chunks of 8,192 rows straddle them
    (["data.num_devices=1000", "data.synthetic_clusters=3", "data.val_fraction=0.2", "data.holdout_fraction=0.01"],
     [0, 333, 700, 1000]),
    # hosts of one device (a chunk across three hosts), a floor of test samples, the dominant labels as groups
    (["data.num_devices=600", "data.min_test_samples=3", "data.test_fraction=0.1", "data.synthetic_samples=30000",
      "data.min_samples=5"], [0, 1, 2, 599, 600]),
    (["data.num_devices=300", "data.normalize=unit"], [0, 150, 300]),
])
def test_hosts_partition_their_generated_devices_as_the_driver_would_the_whole(extra, cuts):
    cfg = tiny_config("data.dataset=leaf_synthetic", "data.partition=natural", "model.name=mlp", *extra)
    spec = node_generated(cfg)
    assert spec is not None and node_generated(cfg.replace(**{"data.subset": 100})) is None
    shards = [NodeShard(spec, a, b, NodeSplit.of(cfg)) for a, b in itertools.pairwise(cuts)]
    hosts = LocalHosts(shards)
    setup, done = setup_on_hosts(cfg, spec, shards, hosts)
    whole, ds = prepare(cfg), load(cfg)
    assert setup.scaling == whole.scaling
    for name in ("train_sizes", "groups", "label_dist", "held_out"):
        assert np.array_equal(getattr(setup.federation, name), getattr(whole.federation, name)), name
    assert setup.federation.partition_stats == whole.federation.partition_stats
    assert setup.federation.group_kind == whole.federation.group_kind
    for sh, lists in zip(done, hosts.lists, strict=True):
        (x0, p0) = shard(ds, whole.partition, range(sh.first, sh.stop))
        for x1, p1 in (sh.build(sh.generate(), lists), sh.build()):  # the host's own lists, and a restarted host's
            assert np.array_equal(x1.x, x0.x) and np.array_equal(x1.y, x0.y)
            for split in ("train", "test", "val"):
                a, b = getattr(p1, split), getattr(p0, split)
                assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def test_generated_data_too_small_for_its_test_floor_is_refused_before_any_host_starts():
    cfg = tiny_config("data.dataset=leaf_synthetic", "data.partition=natural", "model.name=mlp", "data.num_devices=50",
                      "data.min_samples=3", "data.min_test_samples=3", "data.synthetic_samples=150")
    spec = node_generated(cfg)
    assert spec is not None
    with pytest.raises(ConfigError, match=r"data\.min_test_samples") as on_hosts:
        check_generated(cfg, spec)
    with pytest.raises(ConfigError) as whole:
        prepare(cfg)
    assert str(on_hosts.value) == str(whole.value)  # the words the driver's own partition would have said
