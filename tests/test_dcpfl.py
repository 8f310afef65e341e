"""DC-PFL: discrepancy, dendrogram cut, rapid-decrease detector, layer schedule and split trial by
hand on tiny inputs, then a seeded run on digits (deterministic, resumable, cheaper uplink than FedAvg)."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from lcfed.config import load_config
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.learning.local_update import DeviceData, LocalWork, batch_rng, local_update
from lcfed.learning.models import Network, param_spec
from lcfed.methods.base import DeviceContext, Federation
from lcfed.methods.dcpfl import (
    DCPFL,
    DCPFLMessage,
    DCPFLParams,
    DeviceModel,
    Instruction,
    TrialPayload,
)
from lcfed.methods.dcpfl_steps import (
    average_linkage,
    discrepancy_matrix,
    due_layers,
    knee,
    layer_discrepancy,
    layer_intervals,
    next_split,
    noise_level,
    rdp_end,
    threshold_groups,
)
from lcfed.run.loop import load_resume
from tests.conftest import same_metrics, tiny_config
from tests.test_math import Tiny  # w = [a | W0, W1, b0, b1]: layer emb = a, layer head = the rest


def _strategy(num_devices: int, *overrides: str) -> DCPFL:
    cfg = load_config(None, [f"data.num_devices={num_devices}", "method.name=dcpfl", *overrides])
    fed = Federation(
        num_devices,
        np.ones(num_devices, dtype=np.int64),
        np.zeros(num_devices, dtype=np.int64),
        param_spec(Tiny()),
        torch.zeros(5),
        2,
        0,
    )
    return DCPFL(cfg, fed)


def _full(device: int, w: list[float], n: int = 1, loss: float = 1.0) -> DCPFLMessage:
    t = torch.tensor(w, dtype=torch.float32)
    return DCPFLMessage(device, n, loss, {"emb": t[:1], "head": t[1:]})


def _ctx(device: int = 0, rnd: int = 0) -> DeviceContext:
    module = Tiny()
    net = Network(module.requires_grad_(False), param_spec(module))
    data = DeviceData(
        torch.tensor([[1.0], [2.0]]), torch.tensor([0, 1]), torch.zeros(0, 1), torch.zeros(0, dtype=torch.long)
    )
    return DeviceContext(device, rnd, data, net, LocalWork(lr=0.1, batch_size=32, steps=2), seed=0)


# --- model discrepancy (Eq. 3, 5) ----------------------------------------------------------------


def test_discrepancy_is_min_max_scaled_l1_per_parameter():
    w1 = [0.0, 1.0, 2.0, 3.0, 4.0]  # S = [0, .25, .5, .75, 1]
    w2 = [0.0, 2.0, 4.0, 6.0, 8.0]  # twice w1: the same S, so D = 0 (scale does not count)
    w3 = [10.0, 11.0, 14.0, 12.0, 13.0]  # S = [0, .25, 1, .5, .75]: |S1 - S3| = [0, 0, .5, .25, .25] -> 1/5
    d = discrepancy_matrix(torch.tensor([w1, w2, w3]))
    assert torch.allclose(d, torch.tensor([[0, 0, 0.2], [0, 0, 0.2], [0.2, 0.2, 0]], dtype=torch.float64))


def test_warmup_averages_the_discrepancy_over_t_start_rounds_and_builds_the_dendrogram():
    s = _strategy(3, "method.t_start=2")
    state = s.init()
    # round 0: the models above -> D12 = 0, D13 = D23 = 0.2
    round0 = [[0, 1, 2, 3, 4], [0, 2, 4, 6, 8], [10, 11, 14, 12, 13]]
    # round 1: S1 = [1, .75, .5, .25, 0], S2 = S3 = [0, .25, .5, .75, 1] -> D12 = D13 = 3/5 = 0.6, D23 = 0
    round1 = [[4, 3, 2, 1, 0], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    for rnd, models in enumerate((round0, round1)):
        plan = s.configure(state, rnd)
        assert all(i.upload == ("emb", "head") for i in plan.instructions.values())  # warm-up: full models
        state, _ = s.aggregate(state, plan, [_full(d, w) for d, w in enumerate(models)])
        assert state.tree is None if rnd == 0 else state.tree is not None
    # averages: D12 = (0 + .6)/2 = .3, D13 = (.2 + .6)/2 = .4, D23 = (.2 + 0)/2 = .1
    expected = torch.tensor([[0, 0.3, 0.4], [0.3, 0, 0.1], [0.4, 0.1, 0]], dtype=torch.float64)
    assert torch.allclose(state.disc_sum / 2, expected)
    # average linkage: {2,3} at .1, then 1 joins at mean(.3, .4) = .35 = gamma_global
    assert np.allclose(state.tree[:, 2], [0.1, 0.35])
    assert state.synced_at == 2 and np.array_equal(state.groups, [0, 0, 0])


def test_layer_discrepancy_by_hand():
    models = torch.tensor([[0.0, 1.0, 2.0, 5.0, 5.0], [0.0, 2.0, 1.0, 1.0, 3.0]])
    center = torch.tensor([0.0, 1.5, 1.5, 3.0, 4.0])
    # layer a = [0:3]: S(c) = [0, 1, 1]; S(w1) = [0, .5, 1] -> .5/3; S(w2) = [0, 1, .5] -> .5/3; mean 1/6
    # layer b = [3:5]: S(c) = [0, 1]; w1 is constant -> S = [0, 0] -> 1/2; S(w2) = [0, 1] -> 0; mean 1/4
    disc = layer_discrepancy(models, center, {"a": slice(0, 3), "b": slice(3, 5)})
    assert torch.allclose(disc, torch.tensor([1 / 6, 1 / 4], dtype=torch.float64))


# --- hierarchical group graph and gamma~ ---------------------------------------------------------


def test_dendrogram_cut_at_normalized_thresholds():
    # devices a, c, b, d (in this order): D(a,b) = 1, D(c,d) = 9, every other pair 10
    d = np.array([[0, 10, 1, 10], [10, 0, 10, 9], [1, 10, 0, 10], [10, 9, 10, 0]], dtype=float)
    tree = average_linkage(d)
    # merges: {a,b} at 1, {c,d} at 9, then mean(10, 10, 10, 10) = 10 = gamma_global
    assert np.allclose(tree[:, 2], [1, 9, 10])
    one, two, three, four = [0, 0, 0, 0], [0, 1, 0, 1], [0, 1, 0, 2], [0, 1, 2, 3]
    for gamma, groups in [
        (1.0, one),
        (0.95, two),
        (0.9, two),
        (0.89, three),
        (0.8, three),
        (0.1, three),
        (0.09, four),
        (0.0, four),
    ]:
        assert threshold_groups(tree, gamma).tolist() == groups, gamma
    # gamma~ steps of 0.2: 0.8 already gives three groups (no level gives two)
    level, groups = next_split(tree, np.zeros(4, dtype=np.int64), 0, 0.2)
    assert level == 1 and groups.tolist() == three
    level, groups = next_split(tree, np.zeros(4, dtype=np.int64), 0, 0.05)  # 0.95 -> two groups
    assert level == 1 and groups.tolist() == two
    # from three groups at 0.8, the levels 0.6, 0.4, 0.2 change nothing: the next split is gamma~ = 0
    level, groups = next_split(tree, np.array(three), 1, 0.2)
    assert level == 5 and groups.tolist() == four
    assert next_split(tree, np.array(four), 5, 0.2) is None  # every device alone: the structure is final


# --- rapid-decrease period -----------------------------------------------------------------------


def test_knee_is_the_point_farthest_below_the_chord_of_the_normalized_curve():
    # [10, 4, 2, 1, 1]: y = (c - 1) / 9 = [1, 1/3, 1/9, 0, 0] over x = [0, .25, .5, .75, 1]
    # 1 - x - y = [0, 5/12, 7/18, 1/4, 0]: the knee is point 1, 5/12 below the chord
    j, bend = knee([10, 4, 2, 1, 1])
    assert j == 1 and bend == pytest.approx(5 / 12)
    # both axes are normalized: the loss's units and offset change nothing
    assert knee([103, 43, 23, 13, 13]) == (1, pytest.approx(5 / 12))
    # a straight decrease has no bend (every point on the chord); a constant or too short curve neither
    assert knee([5, 4, 3, 2, 1])[1] == pytest.approx(0, abs=1e-12)
    assert knee([2, 2, 2]) == (0, 0.0) and knee([3, 1]) == (0, 0.0)


def test_rdp_end_by_hand():
    losses = [5, 9, 11, 5, 3, 2, 2, 2]
    # window 2: l_w(1..7) = 7, 10, 8, 4, 2.5, 2, 2; the decrease starts at the peak, round 2
    # from it: y = [1, .75, .25, .0625, 0, 0] over x = [0, .2, .4, .6, .8, 1]
    # 1 - x - y = [0, .05, .35, .3375, .2, 0]: knee at the third point, round 4, bend .35, 3 rounds old
    # drop 10 - 2 = 8; noise: diffs [4, 2, -6, -2, -1, 0, 0], median 0, MAD 2 -> 1.4826 * 2 / sqrt 2
    assert noise_level(losses) == pytest.approx(1.4826 * math.sqrt(2))
    p = DCPFLParams(window=2, t_obv=3, min_drop=0.05, min_snr=5, min_bend=0.25)
    assert rdp_end(losses, p) == 4
    # the smoothed noise is 1.4826 * sqrt 2 / sqrt 2 = 1.4826: 5 of them are 7.41 < 8, 6 are 8.90 > 8
    assert rdp_end(losses, replace(p, min_snr=6)) is None
    assert rdp_end(losses, replace(p, min_drop=0.81)) is None  # 8 < 0.81 * 10
    assert rdp_end(losses, replace(p, min_bend=0.36)) is None  # not flat enough yet
    assert rdp_end(losses, replace(p, t_obv=4)) is None  # the knee is only 3 rounds old
    assert rdp_end(losses[:3], p) is None  # fewer than 3 smoothed losses


def _exp_losses(s: float, rounds: int, noise: float = 0.01, seed: int = 0) -> np.ndarray:
    t = np.arange(rounds)
    return np.exp(-t / s) + 0.3 + noise * np.random.default_rng(seed).standard_normal(rounds)


def _ends(losses: np.ndarray, p: DCPFLParams) -> list[tuple[int, int]]:
    """(detection round, knee round) of each period, a new period starting after each detection
    (what the strategy does when a split is accepted)."""
    out, start = [], 0
    for n in range(1, len(losses) + 1):
        k = rdp_end(losses[start:n], p)
        if k is not None:
            out.append((n - 1, start + k))
            start = n
    return out


def _exp_knee(min_bend: float) -> tuple[float, float]:
    """For exp(-u): the span z (in decay scales) at which the curve normalized over [0, z] first lies
    min_bend below its chord, and the knee there (where the normalized slope is -1), in decay scales."""
    x = np.linspace(0, 1, 20_001)

    def bend(z: float) -> float:
        y = (np.exp(-x * z) - math.exp(-z)) / (1 - math.exp(-z))
        return float((1 - x - y).max())

    lo, hi = 0.01, 20.0
    for _ in range(50):  # the bend grows with z
        lo, hi = (lo, (lo + hi) / 2) if bend((lo + hi) / 2) >= min_bend else ((lo + hi) / 2, hi)
    return hi, math.log(hi / (1 - math.exp(-hi)))


def test_the_period_ends_at_the_knee_whatever_the_decay_scale():
    # l(t) = exp(-t/s) + 0.3 + 1 % noise. The smoothed curve (trailing window w) is again an exponential
    # of scale s from round w - 1 on, so the analytic answer is, in rounds: detection at w - 1 + z s,
    # knee at w - 1 + u s, with (z, u) = (2.12, 0.87) for a bend of 0.25.
    # The literal Eq. 4 (rounds, raw loss) ended all three periods at round 9.
    p = DCPFLParams()
    z, u = _exp_knee(p.min_bend)
    assert z == pytest.approx(2.12, abs=0.01) and u == pytest.approx(0.87, abs=0.01)
    found = {}
    for s in (5, 15, 40):
        ends = _ends(_exp_losses(s, 4 * s + 20), p)
        assert ends, s
        found[s] = ends[0]
        detected, at = ends[0]
        tol = max(2.0, 0.1 * s)
        assert abs(detected - (p.window - 1 + z * s)) <= tol, (s, ends)
        assert abs(at - (p.window - 1 + u * s)) <= tol, (s, ends)
        assert s <= detected - (p.window - 1) <= 3 * s  # the curve has flattened, not too late
    # measured: {5: (16, 9), 15: (35, 17), 40: (89, 40)}
    assert found[5] < found[15] < found[40]


def test_a_two_phase_curve_ends_its_first_period_at_the_fast_knee():
    t = np.arange(150)
    noise = 0.005 * np.random.default_rng(0).standard_normal(150)
    losses = 0.6 * np.exp(-t / 4) + 0.6 * np.exp(-t / 60) + 0.2 + noise
    ends = _ends(losses, DCPFLParams())
    # measured: [(16, 9), (143, 73)]: the fast phase's knee (4 + 0.87 * 4 = 7.5 without the slow one)
    # and, in the next period, the slow phase's, long after
    assert len(ends) == 2
    (first, knee1), (second, knee2) = ends
    assert first <= 4 + 3 * 4 and 4 + 4 <= knee1 <= 4 + 2 * 4
    assert second >= 60 and knee2 >= 60


def test_flat_noisy_straight_or_rising_curves_never_end_a_period():
    p = DCPFLParams()
    t = np.arange(300)
    noise = np.random.default_rng(0).standard_normal(300)
    curves = {
        "flat, 1% noise": 0.5 + 0.005 * noise,
        "flat, 30% noise (like the tiny federations' losses)": 0.5 + 0.15 * noise,
        "straight decrease": 1.0 - 0.002 * t + 0.005 * noise,
        "rising": 0.5 + 0.001 * t + 0.005 * noise,
    }
    for name, losses in curves.items():
        assert _ends(losses, p) == [], name
    # without the noise guard the 30 % curve fakes knees again and again
    assert len(_ends(curves["flat, 30% noise (like the tiny federations' losses)"], replace(p, min_snr=0))) > 3


# --- layer-wise aggregation (Eq. 6) --------------------------------------------------------------


def test_layer_intervals_and_due_rounds():
    disc = np.array([[0.01, 0.5, 0.3, 0.02, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]])
    # group 0: mean 1.03/5 = 0.206, so layers under 0.0206 (0.01 and 0.02) are low: every 3*5 = 15 rounds
    # group 1: no layer below 0.1 of the mean
    iv = layer_intervals(disc, tau=5, alpha=3, low_ratio=0.1)
    assert iv.tolist() == [[15, 5, 5, 15, 5], [5, 5, 5, 5, 5]]
    due = {
        since: due_layers(iv, since)[0].nonzero()[0].tolist() for since in range(1, 16) if due_layers(iv, since).any()
    }
    assert due == {5: [1, 2, 4], 10: [1, 2, 4], 15: [0, 1, 2, 3, 4]}


def test_schedule_uploads_due_layers_and_sends_back_the_group_average():
    s = _strategy(2, "method.t_start=1", "method.tau=2", "method.alpha=2")
    state = s.init()
    plan = s.configure(state, 0)
    # warm-up round: heads h0 = [0, 1, 2, 3] (1 sample), h1 = [3, 2, 1, 0] (3 samples); centre = (h0 + 3 h1)/4
    # S(centre) = S(h1) = [1, 2/3, 1/3, 0]; S(h0) = [0, 1/3, 2/3, 1] -> |.| = 8/3 / 4 = 2/3; D_head = (2/3 + 0)/2 = 1/3
    # emb has one weight: S is constant, D_emb = 0 < 0.1 * mean(0, 1/3): emb is low (every 2*2 = 4), head every 2
    msgs = [_full(0, [1, 0, 1, 2, 3], n=1), _full(1, [2, 3, 2, 1, 0], n=3)]
    state, _ = s.aggregate(state, plan, msgs)
    assert state.intervals.tolist() == [[4, 2]] and state.synced_at == 1
    uploads, down, up = {}, {}, {}
    for rnd in range(1, 9):
        plan = s.configure(state, rnd)
        uploads[rnd] = plan.instructions[0].upload
        down[rnd] = plan.down_bytes
        sent = [
            DCPFLMessage(m.device, m.num_samples, 1.0, {k: v for k, v in m.layers.items() if k in uploads[rnd]})
            for m in msgs
        ]
        state, stats = s.aggregate(state, plan, sent)
        up[rnd] = stats.bytes_up
        if uploads[rnd] == ("head",):
            assert torch.allclose(state.pending[0]["head"], torch.tensor([2.25, 1.75, 1.25, 0.75]))
    # round 4 uploads everything (a full synchronization): intervals re-derived (same models, same result)
    # and the clock restarts at round 5
    assert uploads == {1: (), 2: ("head",), 3: (), 4: ("emb", "head"), 5: (), 6: ("head",), 7: (), 8: ("emb", "head")}
    assert up == {1: 0, 2: 2 * 16, 3: 0, 4: 2 * 20, 5: 0, 6: 2 * 16, 7: 0, 8: 2 * 20}
    # each device receives its group's average of the aggregated layers at the start of the next round
    assert down == {1: 2 * 20, 2: 0, 3: 2 * 16, 4: 0, 5: 2 * 20, 6: 0, 7: 2 * 16, 8: 0}


def test_device_overwrites_received_layers_and_uploads_only_due_ones():
    s = _strategy(2)
    own = torch.tensor([0.5, 0.1, -0.2, 0.3, 0.0])
    received = {0: {"head": torch.tensor([1.0, -1.0, 0.5, 0.5])}}
    dev, msg = s.local(_ctx(), DeviceModel(own), received, Instruction(0, ("head",)))
    start = torch.tensor([0.5, 1.0, -1.0, 0.5, 0.5])  # own emb, the group's head
    res = local_update(_ctx().net, start, _ctx().data, _ctx().work, batch_rng(0, 0, 0))
    assert torch.equal(dev.weights, res.weights) and msg.loss == res.loss
    assert list(msg.layers) == ["head"] and torch.equal(msg.layers["head"], res.weights[1:])
    # a device of another group ignores group 0's layers and, with nothing due, uploads no tensors
    dev, msg = s.local(_ctx(), DeviceModel(own), received, Instruction(1))
    assert torch.equal(dev.weights, local_update(_ctx().net, own, _ctx().data, _ctx().work, batch_rng(0, 0, 0)).weights)
    assert msg.layers == {}


# --- split trial -----------------------------------------------------------------------------------


def _trial_state(s: DCPFL):
    d = np.array([[0, 10, 1, 10], [10, 0, 10, 9], [1, 10, 0, 10], [10, 9, 10, 0]], dtype=float)
    state = replace(s.init(), tree=average_linkage(d), synced_at=6, upload_at=10, losses=(2.0, 1.0))
    plan = s.configure(state, 10)
    assert s.kind(state, 10) == "upload" and all(i.upload == ("emb", "head") for i in plan.instructions.values())
    msgs = [_full(0, [1] * 5), _full(1, [2] * 5), _full(2, [3] * 5, n=3), _full(3, [4] * 5)]
    state, _ = s.aggregate(state, plan, msgs)
    # G0 = one group: (1 + 2 + 3*3 + 4)/6 = 16/6; G1 at gamma~ = 0.8 = {0, 2}, {1}, {3}: (1 + 9)/4, 2, 4
    assert torch.allclose(state.trial.old_models, torch.full((1, 5), 16 / 6))
    assert torch.allclose(state.trial.new_models[:, 0], torch.tensor([2.5, 2.0, 4.0]))
    assert state.trial.new_groups.tolist() == [0, 1, 0, 2] and state.upload_at == -1
    plan = s.configure(state, 11)
    assert isinstance(plan.payload, TrialPayload) and s.kind(state, 11) == "trial"
    assert [plan.instructions[d].new_group for d in range(4)] == [0, 1, 0, 2]
    assert plan.down_bytes == 4 * 20 + (2 + 1 + 1) * 20  # every device gets its old and its new group model
    return state, plan


def _losses(old: list[float], new: list[float]) -> list[DCPFLMessage]:
    return [DCPFLMessage(d, 3 if d == 2 else 1, o, new_loss=n) for d, (o, n) in enumerate(zip(old, new, strict=True))]


def test_split_is_kept_when_the_mean_loss_improves():
    s = _strategy(4, "method.gamma_step=0.2")
    state, plan = _trial_state(s)
    # plain means: old 1.0 > new (0.5 + 2 + 0.5 + 0.5)/4 = 0.875 (device 1 alone is worse; the mean decides)
    state, stats = s.aggregate(state, plan, _losses([1, 1, 1, 1], [0.5, 2, 0.5, 0.5]))
    assert state.groups.tolist() == [0, 1, 0, 2] and state.level == 1 and stats.num_clusters == 3
    assert state.losses == () and state.adopt and state.upload_at == -1 and state.trial is None
    assert stats.train_loss == pytest.approx(
        (0.5 + 2 + 3 * 0.5 + 0.5) / 6
    )  # reported: the kept model's, sample-weighted
    nxt = s.configure(state, 12)
    assert all(i.adopt for i in nxt.instructions.values()) and s.kind(state, 12) == "train"


def test_split_is_reverted_and_retried_after_t_sp_rounds():
    s = _strategy(4, "method.gamma_step=0.2", "method.t_sp=6")
    state, plan = _trial_state(s)
    # equal means (1.0 vs 1.0) are no improvement: keep G0
    state, stats = s.aggregate(state, plan, _losses([1, 1, 1, 1], [1.2, 0.8, 1.0, 1.0]))
    assert state.groups.tolist() == [0, 0, 0, 0] and state.level == 0 and stats.num_clusters == 1
    assert not state.adopt and state.losses == (2.0, 1.0, 1.0, 1.0) and state.upload_at == 11 + 6
    assert [s.kind(state, r) for r in (12, 16, 17)] == ["train", "train", "upload"]
    assert not any(i.adopt for i in s.configure(state, 12).instructions.values())


def test_trial_device_trains_both_group_models_and_keeps_the_chosen_one():
    s = _strategy(2)
    old, new = torch.zeros(1, 5), torch.tensor([[0.0] * 5, [0.3, 0.2, -0.1, 0.0, 0.1]])
    ctx = _ctx(device=1, rnd=3)
    dev, msg = s.local(ctx, DeviceModel(torch.ones(5)), TrialPayload(old, new), Instruction(0, new_group=1))
    ref_old = local_update(ctx.net, old[0], ctx.data, ctx.work, batch_rng(0, 1, 3))
    ref_new = local_update(ctx.net, new[1], ctx.data, ctx.work, batch_rng(0, 1, 3))
    assert torch.equal(dev.weights, ref_old.weights) and torch.equal(dev.candidate, ref_new.weights)
    assert (msg.loss, msg.new_loss) == (ref_old.loss, ref_new.loss) and msg.layers == {}
    # evaluated before the next round: the candidate if the server kept the split
    assert torch.equal(s.personalized(ctx, dev, True), ref_new.weights) and torch.equal(
        s.personalized(ctx, dev, False), ref_old.weights
    )
    # next round: adopt -> train from the candidate; otherwise from the old-structure model
    kept, _ = s.local(_ctx(1, 4), dev, {}, Instruction(0, adopt=True))
    assert torch.equal(
        kept.weights, local_update(ctx.net, ref_new.weights, ctx.data, ctx.work, batch_rng(0, 1, 4)).weights
    )
    assert kept.candidate is None


def test_params_are_validated():
    with pytest.raises(ConfigError, match="train.participation"):
        tiny_config("method.name=dcpfl", "train.participation=0.5")
    with pytest.raises(ConfigError, match="method.tau"):
        tiny_config("method.name=dcpfl", "method.tau=0")
    with pytest.raises(ConfigError, match="method.gamma_step"):
        tiny_config("method.name=dcpfl", "method.gamma_step=0")
    with pytest.raises(ConfigError, match="method.min_bend"):
        tiny_config("method.name=dcpfl", "method.min_bend=0")
    with pytest.raises(ConfigError, match="method.min_drop"):
        tiny_config("method.name=dcpfl", "method.min_drop=1")
    with pytest.raises(ConfigError, match="method.min_snr"):
        tiny_config("method.name=dcpfl", "method.min_snr=-1")
    p = tiny_config("method.name=dcpfl").method.params  # the paper's values (Sec. V-A)
    assert (p.t_start, p.window, p.t_obv, p.t_sp, p.gamma_step, p.tau, p.alpha, p.low_ratio) == (
        5,
        5,
        3,
        6,
        0.2,
        5,
        3,
        0.1,
    )
    assert (p.min_drop, p.min_snr, p.min_bend) == (0.05, 8.0, 0.25)  # the detector's (not in the paper)


# --- end to end ------------------------------------------------------------------------------------




MODEL_BYTES = 61_706 * 4
# short time scales so that 10 rounds see the warm-up, layer-wise rounds and a split trial. The
# tiny federation's loss hardly falls in 10 rounds (2.22, 2.19, 2.05, 1.63, 2.50, 2.24, 2.07, ...), so
# the detector is told to take that small bend after the bump for a knee: no noise guard, bend 0.1.
# It ends the period at round 6 (knee at round 5), the full upload is round 7, the trial round 8.
FAST = (
    "train.eval_every=5",
    "train.lr=0.1",
    "method.t_start=3",
    "method.window=1",
    "method.t_obv=1",
    "method.min_snr=0",
    "method.min_bend=0.1",
    "method.tau=2",
    "method.alpha=2",
)


class _KeepAfter:
    """Copies the checkpoint directory aside once round ``rnd`` (from 0) is written."""

    def __init__(self, src, dst, rnd):
        self.src, self.dst, self.rnd = src, dst, rnd

    def on_start(self, cfg, fed):
        pass

    def on_round(self, rnd, metrics, stats):
        if rnd == self.rnd:
            shutil.copytree(self.src, self.dst)

    def on_end(self, result):
        pass


def test_seeded_run_is_deterministic_resumable_and_uploads_less_than_fedavg(tmp_path):
    # the run's checkpoint after 9 rounds (right after the trial, candidates pending), kept aside and resumed:
    # no second run up to there (a run stopped, then extended: test_checkpoint.py::test_resume_is_bit_identical)
    keep = _KeepAfter(tmp_path / "a", tmp_path / "b", 8)
    full = run_local(tiny_config("method.name=dcpfl", "train.rounds=10", *FAST, f"checkpoint.dir={tmp_path / 'a'}"), [keep])
    cont = tiny_config("method.name=dcpfl", "train.rounds=10", *FAST, f"checkpoint.dir={tmp_path / 'b'}")
    assert load_resume(cont).next_round == 9
    resumed = run_local(cont, resume=load_resume(cont))
    same_metrics(full.history, resumed.history)
    assert np.array_equal(full.assignment, resumed.assignment)
    h = full.history
    assert all(r["bytes_up"] == 8 * MODEL_BYTES for r in h[:3])  # warm-up: full models
    # a split trial happened: a full upload, then both group models down and no weights up
    trial = [r for r in h if r["bytes_down"] == 2 * 8 * MODEL_BYTES and r["bytes_up"] == 0]
    assert [r["round"] for r in trial] == [8] and h[7]["bytes_up"] == 8 * MODEL_BYTES
    assert h[-1]["num_clusters"] > 1
    fedavg = run_local(tiny_config("method.name=fedavg", "train.rounds=10", "train.eval_every=5", "train.lr=0.1"))
    # measured: DC-PFL 0.54, FedAvg 0.28 (2 classes per device), uplink 13.8 MB vs 19.7 MB
    assert full.final["acc_mean"] > max(0.5, fedavg.final["acc_mean"]), (full.final, fedavg.final)
    assert h[-1]["bytes_up_total"] < fedavg.history[-1]["bytes_up_total"]


@pytest.mark.slow  # ~13 s, 45 rounds; the period rule by hand: test_the_period_ends_at_the_knee... and the two after it
def test_splits_follow_the_loss_curve_not_a_fixed_cadence():
    # 45 rounds with the paper's constants. The literal Eq. 4 ended every period at its earliest
    # allowed round and split at rounds 14, 26 and 38 (1 -> 2 -> 4 -> 7 groups), whatever the loss did.
    cfg = tiny_config("method.name=dcpfl", "train.rounds=45", "train.eval_every=45", "train.lr=0.1")
    groups = [int(r["num_clusters"]) for r in run_local(cfg).history]
    splits = [rnd for rnd in range(1, len(groups)) if groups[rnd] != groups[rnd - 1]]
    # measured: one split, at round 37. The warm-up's smoothed loss falls 1.97 -> 1.1 by round 19 (knee
    # at round 15), which the noise of these losses (round-to-round 0.35) does not yet confirm; the
    # second fall to 0.78 does, at round 35 (full upload 36, trial 37, kept)
    assert 1 <= len(splits) < 3 and splits[0] > 14, groups
