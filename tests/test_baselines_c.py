"""Baselines FedProx, SCAFFOLD, Ditto, APFL and FedRep: each defining step by hand on a tiny model, then
seeded end-to-end runs on digits (their conformance: tests/test_conformance.py, which takes every built-in)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lcfed.config import load_config
from lcfed.engines.local import run_local
from lcfed.learning.local_update import DeviceData, LocalWork
from lcfed.learning.models import Network, param_spec
from lcfed.methods import METHODS
from lcfed.methods.base import DeviceContext, Federation, Strategy
from lcfed.methods.scaffold import ControlVariate, ScaffoldMessage, ScaffoldPayload, ScaffoldState, option_two
from tests.conftest import same_history, tiny_config
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


# --- end to end on digits ------------------------------------------------------------------------

E2E = [
    # (method, overrides, a floor on the final mean accuracy; chance is 0.1)
    ("fedprox", ["data.partition=iid"], 0.2),
    ("scaffold", ["data.partition=iid"], 0.2),
]


def _e2e_config(method: str, *extra: str):
    return tiny_config(f"method.name={method}", "train.rounds=4", "train.local_steps=5", "train.lr=0.1",
                       "train.eval_every=2", *extra)


@pytest.mark.parametrize("method,extra,min_acc", E2E, ids=[e[0] for e in E2E])
def test_end_to_end_is_deterministic_and_learns(method, extra, min_acc):
    cfg = _e2e_config(method, *extra)
    a, b = run_local(cfg), run_local(cfg)
    same_history(a.history, b.history)
    losses = [row["train_loss"] for row in a.history]
    assert losses[-1] < losses[0] and a.final["acc_mean"] > min_acc, a.final
