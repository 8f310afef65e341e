"""LEAF's synthetic(α, β) generator: sizes, streams, the input covariance, known clusters a method recovers."""

from __future__ import annotations

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
from lcfed.experiment import load, node_generated, node_shard, prepare, shard
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


def test_a_node_shard_is_the_drivers_cut_bit_for_bit():
    cfg = tiny_config("data.dataset=leaf_synthetic", "data.partition=natural", "model.name=mlp", "data.num_devices=90",
                      "data.val_fraction=0.2", "data.synthetic_clusters=3")
    spec = node_generated(cfg)
    assert spec is not None and node_generated(cfg.replace(**{"data.subset": 100})) is None
    ds = load(cfg)
    setup = prepare(cfg, ds)
    for first, stop in [(0, 30), (30, 61), (61, 90)]:
        (x1, p1), (x0, p0) = node_shard(spec, first, stop, setup.partition).build(), shard(ds, setup.partition,
                                                                                         range(first, stop))
        assert np.array_equal(x1.x, x0.x) and np.array_equal(x1.y, x0.y)
        for split in ("train", "test", "val"):
            a, b = getattr(p1, split), getattr(p0, split)
            assert len(a) == len(b) == 90 and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
