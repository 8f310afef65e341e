"""FedAC: the gap ratio and Cluster Number Tuning by hand, EM re-clustering on LrCos, the paper's CNN,
and seeded runs on digits whose K changes during the run (deterministic, resumable)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcfed.config import load_config
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.learning.models import ParamSpec, build_network, param_spec
from lcfed.learning.similarity import Projector
from lcfed.methods.base import Federation, RoundPlan
from lcfed.methods.fedac import FedAC, FedACParams, FedACState, gap_ratios, split_labels, tune_clusters
from lcfed.methods.lcfed import LCFedMessage
from lcfed.run import checkpoint
from lcfed.run.loop import load_resume
from tests.conftest import same_metrics, tiny_config
from tests.test_math import Tiny

# --- the paper's CNN ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,total",
    [
        # conv1 c*32*25 + 32, conv2 32*64*25 + 64 = 51,264, fc1 64*s*s*1024 + 1024 (s = side / 4),
        # fc2 1024*512 + 512 = 524,800, fc3 512*10 + 10 = 5,130 (the decision h)
        # 3x32x32 (s = 8): 2,432 + 51,264 + 4,195,328 + 524,800 + 5,130
        ((3, 32, 32), 4_778_954),
        # 1x28x28 (s = 7):   832 + 51,264 + 3,212,288 + 524,800 + 5,130
        ((1, 28, 28), 3_794_314),
    ],
)
def test_cnn_parameter_count_and_split(shape, total):
    net, w = build_network("cnn", shape, 10, seed=0)
    assert w.numel() == total and net.spec.size == total
    assert net.spec.decision_size == 5_130 and net.spec.embedding_size == total - 5_130
    assert list(net.spec.layers()) == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert net(w, torch.zeros(2, *shape)).shape == (2, 10)


# --- gap ratio and Cluster Number Tuning by hand ---------------------------------------------------

# 2-D models; an identity projector makes a model's code the model itself (used by splits only)
IDENTITY = Projector(torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_gap_ratio_of_three_parameter_models_by_hand():
    # cluster 0: (0,0,0), (2,0,0): Ω_0 = (1,0,0), Dist_intra = (1 + 1) / 2 = 1
    # cluster 1: (0,4,1), (2,4,-1), (1,4,0): Ω_1 = (1,4,0), Dist_intra = (2 + 2 + 0) / 3 = 4/3
    models = _t([[0, 0, 0], [2, 0, 0], [0, 4, 1], [2, 4, -1], [1, 4, 0]])
    labels = np.array([0, 0, 1, 1, 1])
    # the fallback (e.g. the training centers) is not Ω: each Ω_k is the mean of its members' models
    g = gap_ratios(models, labels, _t([[9, 9, 9], [-9, 0, 0]]))
    assert torch.allclose(g.centers, _t([[1, 0, 0], [1, 4, 0]]))
    # Dist_inter = ‖Ω_0 − Ω_1‖² / (K − 1) = 16 for both
    assert g.intra == pytest.approx([1, 4 / 3]) and g.inter == pytest.approx([16, 16])
    assert g.ratios == pytest.approx([1 / 16, 1 / 12])
    # a third cluster, the lone device (4,0,3): ‖Ω_0 − Ω_2‖² = 18, ‖Ω_1 − Ω_2‖² = 34, so
    # Dist_inter = (16 + 18) / 2, (16 + 34) / 2, (18 + 34) / 2 and G = 1/17, (4/3)/25, 0
    g3 = gap_ratios(torch.cat([models, _t([[4, 0, 3]])]), np.array([0, 0, 1, 1, 1, 2]), torch.zeros(3, 3))
    assert g3.sq_dists == pytest.approx(np.array([[0, 16, 18], [16, 0, 34], [18, 34, 0]]))
    assert g3.inter == pytest.approx([17, 25, 26]) and g3.ratios == pytest.approx([1 / 17, 4 / 75, 0])
    # a cluster without members: Ω is its fallback row, G is NaN (no change)
    g_empty = gap_ratios(models, labels, _t([[0, 0, 0], [0, 0, 0], [1, 0, 0]]))
    assert torch.equal(g_empty.centers[2], _t([[1, 0, 0]])[0]) and math.isnan(g_empty.ratios[2])
    assert g_empty.inter[0] == pytest.approx((16 + 0) / 2)


def _tune(centers, labels, models=None, k_min=2, k_max=4):
    labels = np.asarray(labels)
    models = list(centers[labels] if models is None else models)
    return tune_clusters(centers, labels, models, IDENTITY, 0.2, 0.8, k_min, k_max)


def test_cnt_keeps_k_when_every_gap_is_inside_the_range():
    # training centers (0, 1), (4, 0); the members' means, Ω, are (0, 0) and (4, 0)
    centers = _t([[0, 1], [4, 0], [100, 100]])  # cluster 2 has no device: dropped before the G's
    t = _tune(centers, [0, 0, 1, 1], _t([[0, -2], [0, 2], [4, -3], [4, 3]]))
    # Dist_intra = (4 + 4) / 2 = 4 and (9 + 9) / 2 = 9; Dist_inter = ‖Ω_0 − Ω_1‖² = 16 (the empty
    # center does not enter): G = (0.25, 0.5625), within (0.2, 0.8)
    assert t.dropped == (2,) and t.gaps.ratios == pytest.approx([0.25, 0.5625])
    assert t.merges == () and t.splits == ()
    # unchanged clusters keep their training centers
    assert torch.equal(t.centers, centers[:2]) and list(t.assignment) == [0, 0, 1, 1]


def test_cnt_splits_a_wide_cluster_with_one_recluster_iteration():
    # cluster 1: (4, 5), (4, -5), (4, 3), (4, -3) around (4, 0): Dist_intra = (25 + 25 + 9 + 9) / 4 = 17,
    # G1 = 17 / 16 > 0.8; G0 = 4 / 16 = 0.25 stays
    models = _t([[0, -2], [0, 2], [4, 5], [4, -5], [4, 3], [4, -3]])
    centers = _t([[0, 0], [4, 0]])
    t = _tune(centers, [0, 0, 1, 1, 1, 1], models)
    assert t.gaps.ratios == pytest.approx([0.25, 17 / 16]) and t.splits == (1,) and t.merges == ()
    # seeds: the farthest pair (4, ±5) (distance 100); E-step by cosine: (4, 3) joins (4, 5)
    # (cos 31/32.0 vs 1/32.0), (4, -3) joins (4, -5); each half's center is the mean of its models
    assert torch.allclose(t.centers, _t([[0, 0], [4, 4], [4, -4]]))
    assert list(t.assignment) == [0, 0, 1, 2, 1, 2]
    # at K = k_max the same cluster is kept whole
    capped = _tune(centers, [0, 0, 1, 1, 1, 1], models, k_max=2)
    assert capped.splits == () and torch.equal(capped.centers, centers)


def test_cnt_merges_a_lone_device_into_the_nearest_cluster():
    # clusters: {(0, ±5)} with Ω (0, 0); {(4, 0)}; {(0, 10)}. Squared center distances 16 (0-1),
    # 100 (0-2), 116 (1-2): Dist_inter = 58, 66, 108; Dist_intra = 25, 0, 0
    models = _t([[0, -5], [0, 5], [4, 0], [0, 10]])
    centers = _t([[0, 1], [4, 0], [0, 10]])  # training center 0 is off its members' mean
    t = _tune(centers, [0, 0, 1, 2], models)
    assert t.gaps.ratios == pytest.approx([25 / 58, 0.0, 0.0])
    # cluster 1 merges into its nearest, cluster 0 (16 < 116); cluster 2 would too, but K = k_min = 2
    assert t.merges == ((1, 0),) and t.splits == ()
    # the merged center is the mean of the union's models: ((0, -5) + (0, 5) + (4, 0)) / 3
    assert torch.allclose(t.centers, _t([[4 / 3, 0], [0, 10]]))
    assert list(t.assignment) == [0, 0, 0, 1]


def test_split_of_parallel_codes_is_skipped():
    # every code points the same way: the cosine E-step puts all in one half
    assert split_labels(_t([[1, 1], [2, 2], [3, 3]])) is None
    assert list(split_labels(_t([[1, 0], [0, 1], [1, 0.1]]))) == [0, 1, 0]


def test_an_assigned_device_without_a_model_is_an_error():
    with pytest.raises(ValueError, match="device 1"):
        tune_clusters(_t([[0, 0], [1, 1]]), np.array([0, 1]), [_t([[0, 0]])[0], None], IDENTITY, 0.2, 0.8, 2, 4)


# --- the strategy on the 5-parameter Tiny model ----------------------------------------------------


def _strategy(*overrides: str, devices: int = 3) -> FedAC:
    cfg = load_config(
        None,
        ["method.name=fedac", f"data.num_devices={devices}", "method.num_clusters=2", "method.rank=2", *overrides],
    )
    fed = Federation(
        devices,
        np.ones(devices, dtype=np.int64),
        np.zeros(devices, dtype=np.int64),
        param_spec(Tiny()),
        torch.zeros(5),
        2,
        0,
    )
    return FedAC(cfg, fed)


def _projector() -> Projector:
    comps = torch.zeros(2, 5)
    comps[0, 1] = comps[1, 2] = 1.0  # codes = the two decision weights W0, W1
    return Projector(comps, torch.zeros(5))


def test_em_reclustering_assigns_by_lrcos_argmax_and_keeps_every_latest_model():
    strategy = _strategy("method.tune_every=0", "method.refit_every=2")
    proj = _projector()
    centers = torch.tensor([[0.0, 1, 0, 0, 0], [0, 0, 10, 0, 0]])  # codes (1, 0) and (0, 10)
    state = FedACState(torch.zeros(1), centers, np.array([0, 1, 0]), proj, 0, None, (None,) * 3)
    weights = [
        torch.tensor([0.0, 0.5, 2, 0, 0]),  # code (0.5, 2): cos .24 vs .97 -> 1 (L2 would say 0: 4.25 vs 64.25)
        torch.tensor([0.0, 5, 1, 0, 0]),  # (5, 1): cos .98 vs .20 -> 0
        torch.tensor([0.0, 0, 3, 0, 0]),  # (0, 3): -> 1
    ]
    msgs = [LCFedMessage(d, 1, 0.5, w, proj(w)) for d, w in enumerate(weights)]
    new, stats = strategy.aggregate(state, RoundPlan(1, (0, 1, 2), None), msgs)
    assert list(new.assignment) == [1, 0, 1] and stats.num_clusters == 2
    # M-step (Eq. 5): plain means of the members
    assert torch.allclose(new.centers, torch.stack([weights[1], (weights[0] + weights[2]) / 2]))
    assert all(new.models[d] is weights[d] for d in range(3))  # the uploads themselves, no copies

    # round 2 (a refit of M): the participants' models are replaced, device 2 keeps its last one
    msgs2 = [LCFedMessage(d, 1, 0.5, weights[d] + 1, proj(weights[d] + 1)) for d in (0, 1)]
    refit, _ = strategy.aggregate(new, RoundPlan(2, (0, 1), None), msgs2)
    assert refit.fitted_at == 2
    assert refit.models[0] is msgs2[0].weights and refit.models[1] is msgs2[1].weights
    assert refit.models[2] is weights[2]


def test_gap_ratio_counts_members_not_sampled_this_round_with_their_last_model():
    # clusters {0, 1} and {2, 3}; only device 0 takes part in round 1
    strategy = _strategy(devices=4)
    proj = _projector()
    stored = (
        torch.tensor([0.0, 9, 9, 9, 9]),  # device 0's previous model, replaced this round
        torch.tensor([0.0, 0, 1, 0, 0]),  # device 1: code (0, 1)
        torch.tensor([0.0, 1, 1, 0.5, 0]),
        torch.tensor([0.0, 1, 1, -0.5, 0]),
    )
    centers = torch.tensor([[0.0, 1, 0.2, 0, 0], [0, 1, 1, 0, 0]])  # codes (1, .2) and (1, 1)
    state = FedACState(torch.zeros(1), centers, np.array([0, 0, 1, 1]), proj, 0, None, stored)
    w0 = torch.tensor([0.0, 1, 0, 0, 0])  # code (1, 0): cos .98 vs .71 -> cluster 0
    new, stats = strategy.aggregate(state, RoundPlan(1, (0,), None), [LCFedMessage(0, 1, 0.5, w0, proj(w0))])
    # Ω_0 = mean(w0, stored 1) = (0, .5, .5, 0, 0), Dist_intra = 2 / 4 = 0.5; Ω_1 = (0, 1, 1, 0, 0),
    # Dist_intra = 0.25; Dist_inter = ‖Ω_0 − Ω_1‖² = 0.5: G = (1.0, 0.5), so cluster 0 is split
    # (were device 1 left out, cluster 0 would have no spread, G_0 = 0 and, at K = min_clusters, no change)
    assert stats.num_clusters == 3 and list(new.assignment) == [0, 2, 1, 1]
    # the halves {0} and {1}: each center is its member's latest model
    assert torch.allclose(new.centers, torch.stack([w0, centers[1], stored[1]]))
    assert new.models[0] is w0 and new.models[1] is stored[1]


def test_downlink_after_a_refit_carries_the_new_projector():
    strategy = _strategy()
    state = FedACState(torch.zeros(1), torch.zeros(2, 5), np.array([0, 1, -1]), _projector(), 1, None, (None,) * 3)
    plan = strategy.configure(state, 2)
    assert [n for _, n in plan.downlink] == [3, 2, 3]  # Φ to all, a center to the 2 assigned, M to all
    # Φ: 1 float; a center: 5; M: 2 x 5 components + a 5-float mean
    assert plan.down_bytes == 3 * 1 * 4 + 2 * 5 * 4 + 3 * 15 * 4
    assert [n for _, n in strategy.configure(state, 3).downlink] == [3, 2]


# --- K finds the true number of groups -------------------------------------------------------------


def _four_groups(seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """20 device models in 4 groups of 5 (dim 208). Group g sits at a vertex (e_g / √2: squared
    distance 1 between groups) and is made of two tight subgroups at ±0.5 e_(4+g) (c = 0.25), and each
    model has isotropic noise of total variance s² = 0.3 over 200 further coordinates (left out of the
    codes by the PCA). With K = 4 the groups' G ≈ (c + s²)(1 - 1/5) ≈ 0.44; with two groups in one
    cluster G ≈ 0.5 + 2 (c + s²) > 0.8 (split), and a subgroup on its own has G ≈ 0.1 (merge): Alg. 3's
    mean over all other centers in Dist_inter needs such structure (halves of an isotropic group have
    about the group's own G and are never merged back)."""
    rng = np.random.default_rng(seed)
    w = np.zeros((20, 208))
    groups = np.repeat(np.arange(4), 5)
    for i, g in enumerate(groups):
        w[i, g] = 1 / np.sqrt(2)
        w[i, 4 + g] = 0.5 if i % 2 == 0 else -0.5
    w[:, 8:] = rng.standard_normal((20, 200)) * np.sqrt(0.3 / 200)
    return torch.tensor(w, dtype=torch.float32), groups


@pytest.mark.parametrize("k0", [2, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_cnt_finds_four_groups_from_two_and_from_eight_clusters(k0, seed):
    models, groups = _four_groups(seed)
    m, dim = models.shape
    cfg = load_config(None, ["method.name=fedac", f"data.num_devices={m}", f"method.num_clusters={k0}", "method.rank=8"])
    spec = ParamSpec(("emb.weight", "head.weight"), ((dim - 4,), (4,)), (0, dim - 4), dim - 4)
    strategy = FedAC(cfg, Federation(m, np.ones(m, dtype=np.int64), groups, spec, torch.zeros(dim), 2, 0))
    state, ks = strategy.init(), []
    for rnd in range(6):  # every device takes part and uploads the same model each round
        proj = state.projector
        msgs = [LCFedMessage(i, 1, 0.0, models[i], None if proj is None else proj(models[i])) for i in range(m)]
        state, stats = strategy.aggregate(state, RoundPlan(rnd, tuple(range(m)), None), msgs)
        ks.append(stats.num_clusters)
    assert ks[-3:] == [4, 4, 4], ks
    # the clusters are the groups, and their gap ratios lie inside (a, b)
    assert len(set(zip(state.assignment.tolist(), groups.tolist(), strict=True))) == 4
    gaps = gap_ratios(list(models), state.assignment, state.centers).ratios
    assert ((0.2 < gaps) & (gaps < 0.8)).all(), gaps


def test_params_defaults_and_validation():
    p = FedACParams()
    assert (p.gap_low, p.gap_high, p.refit_every, p.tune_every, p.min_clusters) == (0.2, 0.8, 100, 1, 2)
    assert isinstance(tiny_config("method.name=fedac").method.params, FedACParams)


@pytest.mark.parametrize(
    "override,field",
    [
        ("method.gap_low=0", "method.gap_low"),
        ("method.gap_high=0.2", "method.gap_high"),  # b must exceed a = 0.2
        ("method.min_clusters=1", "method.min_clusters"),
        ("method.min_clusters=4", "method.min_clusters"),  # above the initial K = 3
        ("method.max_clusters=2", "method.max_clusters"),  # below the initial K = 3
        ("method.tune_every=-1", "method.tune_every"),
        ("method.tune_start=-1", "method.tune_start"),
        ("method.num_clusters=9", "method.num_clusters"),  # LCFed's bound: K <= devices per round
    ],
)
def test_invalid_params_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        tiny_config("method.name=fedac", override)


# --- seeded runs on digits -------------------------------------------------------------------------

RUN = ["method.name=fedac", "data.num_devices=12", "train.participation=0.5", "train.local_steps=2"]




@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("fedac-full")
    return run_local(tiny_config(*RUN, "train.rounds=10", f"checkpoint.dir={ckpt}")), ckpt


def test_k_changes_during_a_seeded_run_and_is_logged_every_round(full_run):
    result, ckpt = full_run
    ks = [int(row["num_clusters"]) for row in result.history]
    assert len(ks) == 10 and all(2 <= k <= 20 for k in ks)
    assert len(set(ks)) > 1, ks  # CNT moved K at least once
    # the logged K is the number of centers the server holds
    final = checkpoint.load(ckpt / "latest.pt").server_state
    assert isinstance(final, FedACState) and final.centers.shape[0] == ks[-1]
    assert result.assignment is not None and 0 <= result.assignment.min() and result.assignment.max() < ks[-1]
    again = run_local(tiny_config(*RUN, "train.rounds=10"))
    same_metrics(result.history, again.history)
    assert np.array_equal(result.assignment, again.assignment)


def test_resume_across_changes_of_k_is_identical(full_run, tmp_path):
    result, _ = full_run
    run_local(tiny_config(*RUN, "train.rounds=5", f"checkpoint.dir={tmp_path}"))
    cont = tiny_config(*RUN, "train.rounds=10", f"checkpoint.dir={tmp_path}")
    snap = load_resume(cont)
    assert snap is not None and snap.next_round == 5
    resumed = run_local(cont, resume=snap)
    same_metrics(result.history, resumed.history)
    assert np.array_equal(result.assignment, resumed.assignment)
    # the checkpoint holds K = ks[4] centers and K keeps moving afterwards: resume restores a resized state
    ks = [int(row["num_clusters"]) for row in result.history]
    assert snap.server_state.centers.shape[0] == ks[4] and len(set(ks[4:])) > 1, ks
