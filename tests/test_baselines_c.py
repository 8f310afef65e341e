"""Baselines FedProx, SCAFFOLD, Ditto, APFL, FedRep and CFL: each defining step by hand on a tiny model, then
seeded end-to-end runs on digits (their conformance: tests/test_conformance.py, which takes every built-in)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lcfed import conformance, engines
from lcfed.config import load_config
from lcfed.engines.local import run_local
from lcfed.learning.local_update import DeviceData, LocalWork
from lcfed.learning.models import Network, param_spec
from lcfed.methods import METHODS
from lcfed.methods.apfl import APFLDevice
from lcfed.methods.base import DeviceContext, Federation, PersonalModel, RoundPlan, Strategy
from lcfed.methods.cfl import CFLState, UpdateMessage, bipartition, should_split
from lcfed.methods.fedper import PersonalHead
from lcfed.methods.scaffold import ControlVariate, ScaffoldMessage, ScaffoldPayload, ScaffoldState, option_two
from tests.conftest import tiny_config
from tests.test_baselines_b import _e2e_config  # the same small run as the other baselines'
from tests.test_math import Tiny  # w = [a | W0, W1, b0, b1]: logits = W (a x) + b

Q = 1.0 / (1.0 + math.exp(4.0))  # sigmoid(-4)
# the gradient at w = (1 | 1, -1 | 0, 0) on (x = 2, y = 0): logits (2, -2), dz = (-Q, Q), dW = 2 dz, db = dz,
# da = (W . dz) x = -4Q
GRAD_M1 = torch.tensor([-4 * Q, -2 * Q, 2 * Q, -Q, Q])
M1 = torch.tensor([1.0, 1.0, -1.0, 0.0, 0.0])


class Two(nn.Module):
    """x -> (w0 x, w1 x): 2 parameters, all of them the decision layer."""

    decision_layer = "head"

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(1, 2, bias=False)

    def forward(self, x):
        return self.head(x)


def _net(module: nn.Module) -> Network:
    return Network(module.requires_grad_(False), param_spec(module))


def _strategy(name: str, num_devices: int, *extra: str, module: nn.Module | None = None) -> Strategy:
    module = module or Tiny()
    spec = param_spec(module)
    cfg = load_config(None, [f"method.name={name}", f"data.num_devices={num_devices}", *extra])
    fed = Federation(num_devices, np.ones(num_devices, dtype=np.int64), np.zeros(num_devices, dtype=np.int64),
                     spec, torch.zeros(spec.size), 2, 0)
    return METHODS[name].strategy(cfg, fed)


def _data(x: float, y: int) -> DeviceData:
    xs, ys = torch.tensor([[x]]), torch.tensor([y])
    return DeviceData(xs, ys, xs, ys)


def _ctx(data: DeviceData, steps: int = 1, lr: float = 0.1, module: nn.Module | None = None) -> DeviceContext:
    return DeviceContext(0, 0, data, _net(module or Tiny()), LocalWork(lr=lr, batch_size=32, steps=steps), seed=0)


# --- FedProx -------------------------------------------------------------------------------------


def test_fedprox_proximal_gradient_by_hand():
    # two steps from w_t: the first is FedAvg's (w = w_t, no pull); the second adds μ (w_1 - w_t) = -μ lr g_0,
    # so w_2(FedProx) - w_2(FedAvg) = lr² μ g_0, with g_0 the gradient at w_t
    prox, avg = _strategy("fedprox", 1, "method.mu=0.5"), _strategy("fedavg", 1)
    ctx = _ctx(_data(2.0, 0), steps=2)
    _, pulled = prox.local(ctx, None, M1.clone(), None)
    _, plain = avg.local(ctx, None, M1.clone(), None)
    assert torch.allclose(pulled.weights - plain.weights, 0.1**2 * 0.5 * GRAD_M1, atol=1e-7)
    assert pulled.loss == plain.loss  # the reported loss is the supervised one
    # μ = 0 is FedAvg bit for bit, and the server is FedAvg's
    _, zero = _strategy("fedprox", 1, "method.mu=0").local(ctx, None, M1.clone(), None)
    assert torch.equal(zero.weights, plain.weights)
    assert prox.supports_async and type(prox).aggregate is type(avg).aggregate


# --- SCAFFOLD ------------------------------------------------------------------------------------


def test_scaffold_option_two_by_hand():
    c_i, c = torch.tensor([0.1, -0.2]), torch.tensor([0.3, 0.1])
    x, y = torch.tensor([1.0, 2.0]), torch.tensor([0.8, 2.3])
    # (x - y) / (K lr) = (0.2, -0.3) / 0.2 = (1, -1.5);  c_i - c = (-0.2, -0.3)
    assert torch.allclose(option_two(c_i, c, x, y, steps=2, lr=0.1), torch.tensor([0.8, -1.8]))


def test_scaffold_local_steps_and_control_variates_on_two_parameters():
    strategy = _strategy("scaffold", 4, module=Two())
    ctx = _ctx(_data(1.0, 0), steps=2, module=Two())  # logits (w0, w1) at x = 1: grad = (-p1, p1), p1 = σ(w1 - w0)
    c, c_i = torch.tensor([0.1, -0.1]), torch.tensor([0.3, 0.2])
    dev, msg = strategy.local(ctx, ControlVariate(c_i), ScaffoldPayload(torch.zeros(2), c), None)
    # step 1 from y = 0: g = (-.5, .5), g + c - c_i = (-.7, .2): y1 = (.07, -.02)
    # step 2: p1 = σ(-.09), g + c - c_i = (-p1 - .2, p1 - .3): y2 = (.09 + .1 p1, .01 - .1 p1)
    p1 = 1 / (1 + math.exp(0.09))
    y2 = torch.tensor([0.09 + 0.1 * p1, 0.01 - 0.1 * p1])
    assert torch.allclose(msg.delta_weights, y2, atol=1e-7)
    # option II: c_i+ = c_i - c + (0 - y2) / (2 · 0.1) = (-.25 - .5 p1, .25 + .5 p1)
    c_new = torch.tensor([-0.25 - 0.5 * p1, 0.25 + 0.5 * p1])
    assert torch.allclose(dev.control, c_new, atol=1e-6)
    assert torch.allclose(msg.delta_control, c_new - c_i, atol=1e-6)
    assert torch.equal(c_i, torch.tensor([0.3, 0.2]))  # the device's old state is not modified

    # the server: x + η_g mean Δy, c + (1/N) Σ Δc over N = 4 devices; both directions carry two models
    eta = _strategy("scaffold", 4, "method.global_lr=0.5", module=Two())
    state = ScaffoldState(torch.tensor([1.0, 1.0]), torch.tensor([0.1, -0.1]))
    plan = eta.configure(state, 0)
    msgs = [ScaffoldMessage(0, 1, 0.5, torch.tensor([0.2, -0.4]), torch.tensor([0.4, 0.0])),
            ScaffoldMessage(1, 9, 0.5, torch.tensor([0.6, 0.0]), torch.tensor([0.0, -0.8]))]
    new, stats = eta.aggregate(state, plan, msgs)
    assert torch.allclose(new.weights, torch.tensor([1.0 + 0.5 * 0.4, 1.0 + 0.5 * -0.2]))  # unweighted mean
    assert torch.allclose(new.control, torch.tensor([0.1 + 0.1, -0.1 - 0.2]))
    assert stats.bytes_up == 2 * 2 * 2 * 4 and stats.bytes_down == 4 * 2 * 2 * 4  # 4 devices, x and c each


def test_scaffold_with_zero_control_variates_steps_like_fedavg():
    strategy, avg = _strategy("scaffold", 1), _strategy("fedavg", 1)
    ctx = _ctx(_data(2.0, 0), steps=3)
    _, msg = strategy.local(ctx, strategy.init_device(0, M1), ScaffoldPayload(M1.clone(), torch.zeros(5)), None)
    _, plain = avg.local(ctx, None, M1.clone(), None)
    assert torch.allclose(M1 + msg.delta_weights, plain.weights, atol=1e-7)  # Δy is y - x: equal up to rounding


# --- Ditto ---------------------------------------------------------------------------------------

# FedAvg's step from w = 0 on (x = 2, y = 0): h = 0, logits 0, dz = (-.5, .5): only the bias moves
FROM_ZERO = torch.tensor([0.0, 0.0, 0.0, 0.05, -0.05])


def test_ditto_personal_step_by_hand():
    strategy = _strategy("ditto", 1, "method.lam=0.5")
    ctx = _ctx(_data(2.0, 0))
    dev, msg = strategy.local(ctx, PersonalModel(M1.clone()), torch.zeros(5), None)
    assert torch.allclose(msg.weights, FROM_ZERO, atol=1e-7)  # the global model: FedAvg's step
    # v <- v - lr (∇F(v) + λ (v - w_t)), w_t = 0
    assert torch.allclose(dev.weights, M1 - 0.1 * GRAD_M1 - 0.1 * 0.5 * M1, atol=1e-6) and dev.trained
    glob = torch.ones(5)
    assert torch.equal(strategy.personalized(ctx, dev, glob), dev.weights)  # evaluated on the personal model
    assert torch.equal(strategy.personalized(ctx, strategy.init_device(0, M1), glob), glob)  # until it trains
    # λ = 0: the personal model is local training alone
    lonely, _ = _strategy("ditto", 1, "method.lam=0").local(ctx, PersonalModel(M1.clone()), torch.zeros(5), None)
    assert torch.allclose(lonely.weights, M1 - 0.1 * GRAD_M1, atol=1e-6)


# --- APFL ----------------------------------------------------------------------------------------


def test_apfl_mixing_step_by_hand():
    # v̄ = .5 v + .5 w = (.5 | .5, -.5 | 0, 0) at x = 2: h = 1, logits (.5, -.5), dz = (-q, q), q = σ(-1);
    # ∇f(v̄) = (da, dW, db) = (-2q, -q, q, -q, q); v <- v - lr α ∇f(v̄); w takes FedAvg's step
    q = 1 / (1 + math.exp(1.0))
    g_mix = torch.tensor([-2 * q, -q, q, -q, q])
    fixed = _strategy("apfl", 1, "method.alpha=0.5")
    ctx = _ctx(_data(2.0, 0))
    dev, msg = fixed.local(ctx, APFLDevice(M1.clone(), 0.5), torch.zeros(5), None)
    assert torch.allclose(msg.weights, FROM_ZERO, atol=1e-7)
    assert torch.allclose(dev.personal, M1 - 0.1 * 0.5 * g_mix, atol=1e-6) and dev.alpha == 0.5 and dev.trained
    # adaptive: α <- α - η_α <v - w, ∇f(v̄)> = .5 - .2 (-2q - q - q) = .5 + .8 q
    adaptive = _strategy("apfl", 1, "method.alpha=0.5", "method.adaptive=true", "method.alpha_lr=0.2")
    dev2, _ = adaptive.local(ctx, APFLDevice(M1.clone(), 0.5), torch.zeros(5), None)
    assert dev2.alpha == pytest.approx(0.5 + 0.8 * q, abs=1e-6)
    assert torch.equal(dev2.personal, dev.personal)  # the step used the old α
    # evaluated on α v + (1 - α) w with the current global w
    glob = torch.ones(5)
    assert torch.allclose(adaptive.personalized(ctx, dev2, glob), dev2.alpha * dev2.personal + (1 - dev2.alpha) * glob)
    assert torch.equal(adaptive.personalized(ctx, adaptive.init_device(0, M1), glob), glob)


# --- FedRep --------------------------------------------------------------------------------------


def test_fedrep_trains_the_head_then_the_body_by_hand():
    strategy = _strategy("fedrep", 1, "method.head_factor=1")
    dev, msg = strategy.local(_ctx(_data(2.0, 0)), PersonalHead(M1[1:].clone()), M1[:1].clone(), None)
    # head first, body a = 1 frozen: (dW, db) = (-2Q, 2Q, -Q, Q)
    head = torch.tensor([1 + 0.2 * Q, -1 - 0.2 * Q, 0.1 * Q, -0.1 * Q])
    assert torch.allclose(dev.decision, head, atol=1e-7)
    # then the body with the new head: logits (2 + .5Q, -2 - .5Q), r = σ(-(4 + Q)), da = -(4 + .8Q) r
    r = 1 / (1 + math.exp(4 + Q))
    assert torch.allclose(msg.embedding, torch.tensor([1 + 0.1 * (4 + 0.8 * Q) * r]), atol=1e-7)
    # head_factor scales the head's budget: two head steps move the head further along the same direction
    twice, _ = _strategy("fedrep", 1, "method.head_factor=2").local(_ctx(_data(2.0, 0)), PersonalHead(M1[1:].clone()),
                                                                   M1[:1].clone(), None)
    assert (twice.decision - M1[1:]).abs().sum() > (head - M1[1:]).abs().sum()


# --- CFL -----------------------------------------------------------------------------------------


def test_cfl_split_criterion_and_bipartition_by_hand():
    # two pairs pulling in opposite directions: mean (0, 0), norms √1.01 ≈ 1.005 each
    updates = torch.tensor([[1.0, 0.1], [1.0, -0.1], [-1.0, 0.1], [-1.0, -0.1]])
    assert should_split(updates, eps1=0.1, eps2=1.0)  # ‖mean‖ = 0 < 0.1 and max 1.005 > 1
    assert not should_split(updates, eps1=0.1, eps2=1.01)  # nobody pulls hard enough
    # all agree: ‖mean‖ = ‖(1, 0)‖ = 1, not a stationary point of the joint objective
    assert not should_split(updates.abs() * torch.tensor([1.0, 0.0]), eps1=0.5, eps2=0.5)
    # cos between the pairs' members is (1 - .01)/1.01 ≈ .98, across them ≈ -.98: complete linkage splits by sign
    assert list(bipartition(updates)) == [0, 0, 1, 1]
    assert list(bipartition(updates[[2, 0, 3, 1]])) == [0, 1, 0, 1]  # the first row's half is 0


def test_cfl_aggregate_splits_then_averages_each_half():
    strategy = _strategy("cfl", 5, "method.eps1=0.1", "method.eps2=1.0", "method.warmup=1")
    state = CFLState(torch.zeros(1, 2), np.zeros(5, dtype=np.int64))
    ups = [[1.0, 0.1], [1.0, -0.1], [-1.0, 0.1], [-1.0, -0.1]]
    msgs = [UpdateMessage(d, 1 + d, 0.5, torch.tensor(u)) for d, u in enumerate(ups)]  # device 4 sits out
    warm, _ = strategy.aggregate(state, RoundPlan(0, (0, 1, 2, 3), None), msgs)
    assert warm.centers.shape[0] == 1  # round 0 < warmup: no split, one FedAvg step
    new, stats = strategy.aggregate(state, RoundPlan(1, (0, 1, 2, 3), None), msgs)
    assert list(new.assignment) == [0, 0, 1, 1, 0] and stats.num_clusters == 2
    # each half: the old model plus its sample-weighted mean update (weights 1, 2 and 3, 4)
    assert torch.allclose(new.centers, torch.tensor([[1.0, (0.1 - 0.2) / 3], [-1.0, (0.3 - 0.4) / 7]]))
    assert list(state.assignment) == [0] * 5 and torch.equal(state.centers, torch.zeros(1, 2))


def test_cfl_recovers_the_rotated_groups():
    # thresholds that split at the first chance (round 1): on 2 rotated groups the cosine of the updates
    # separates them, ARI 1 against the true groups (the same numbers run after run, splitting: the seeded
    # property of test_cfl_keeps_the_contract_while_it_splits)
    cfg = tiny_config("method.name=cfl", "train.rounds=2", "train.local_steps=5", "train.lr=0.1", "data.testbed=rotated",
                      "data.testbed_groups=2", "data.partition=iid", "method.eps1=1e9", "method.eps2=0", "method.warmup=1")
    a = run_local(cfg)
    assert [row["num_clusters"] for row in a.history] == [1, 2]
    assert a.history[0]["ari"] == 0.0 and a.history[-1]["ari"] == 1.0


def test_cfl_keeps_the_contract_while_it_splits():
    # the default thresholds never split on the check's small federation: force splits, so that the
    # checkpoint after round 1 holds two clusters and the resumed round must still match
    cfg = conformance.small_config("cfl", **{"method.eps1": 1e9, "method.eps2": 0.0, "method.warmup": 0})
    findings = conformance.check("cfl", cfg=cfg)
    assert all(f.ok for f in findings), conformance.report("cfl", findings)


# --- end to end on digits ------------------------------------------------------------------------

E2E = [
    # (method, overrides, a floor on the final mean accuracy; chance is 0.1)
    ("fedprox", ["data.partition=iid"], 0.2),
    ("scaffold", ["data.partition=iid"], 0.2),
    # the personalized ones on 2 classes a device, where FedAvg stays near chance on this budget
    ("ditto", [], 0.4),
    ("apfl", ["method.alpha=0.5"], 0.4),
    ("fedrep", ["method.head_factor=2"], 0.4),
]


@pytest.mark.parametrize("method,extra,min_acc", E2E, ids=[e[0] for e in E2E])
def test_end_to_end_learns(method, extra, min_acc):
    # run after run the same numbers: test_conformance.py's `seeded` for every built-in (these params add no path)
    cfg = _e2e_config(method, *extra)
    a = run_local(cfg)
    assert a.final["acc_mean"] > min_acc, a.final
    if "data.partition=iid" in extra:  # one global model: its training loss falls (not so under label skew)
        assert a.history[-1]["train_loss"] < a.history[0]["train_loss"]


FEDBUFF = ["train.participation=0.5", "devices.simulate=true", "devices.aggregation=async", "devices.async_buffer=2",
           "devices.speed_sigma=1.0"]


@pytest.mark.parametrize("method", ["fedprox", "ditto", "apfl"])
def test_asynchronous_aggregation_runs(method):
    assert METHODS[method].strategy.supports_async
    result = run_local(_e2e_config(method, *FEDBUFF, "train.rounds=2", "train.local_steps=1"))  # runs, not learns
    assert math.isfinite(result.final["train_loss"]) and result.final["staleness_mean"] >= 0


@pytest.mark.parametrize("method", ["scaffold", "fedrep", "cfl"])
def test_no_asynchronous_aggregation(method):
    assert not METHODS[method].strategy.supports_async


NEW = ["fedprox", "scaffold", "ditto", "apfl", "fedrep", "cfl"]


@pytest.mark.slow  # vmapped steps are slow on a CPU (~10 s each here); the GPU's path
@pytest.mark.parametrize("method", ["scaffold", "apfl", "fedrep"])
def test_own_local_loops_vectorize(method):
    # their local loops ask loss_and_grad for each step, so vmapped training (engine.vectorize) batches them too
    small = [f"method.name={method}", "train.rounds=2", *(["method.head_factor=2"] if method == "fedrep" else [])]
    loop = run_local(tiny_config(*small, "engine.vectorize=never"))
    vec = run_local(tiny_config(*small, "engine.vectorize=always"))
    for ra, rb in zip(loop.history, vec.history, strict=True):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-5) and ra["acc_mean"] == rb["acc_mean"]


@pytest.mark.ray
@pytest.mark.slow  # ~1 min: one Ray for every new method; device states (SCAFFOLD's c_i, personal models) on actors
def test_ray_engine_gives_the_in_process_numbers():
    import ray

    from tests.conftest import start_test_ray

    configs = {m: conformance.small_config(m) for m in NEW}
    local = {m: run_local(cfg).history for m, cfg in configs.items()}
    start_test_ray()
    try:
        remote = {m: engines.run(cfg.replace(**{"engine.kind": "ray", "engine.devices_per_actor": 3})).history
                  for m, cfg in configs.items()}
    finally:
        ray.shutdown()
    assert {m: conformance.differences(local[m], remote[m]) for m in NEW} == {m: [] for m in NEW}
