"""Baselines IFCA, FeSEM, FedPer and CGPFL: each defining step by hand on a 5-parameter model, plus
seeded end-to-end runs on digits and IFCA on Ray against the in-process reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcfed.config import load_config
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from lcfed.learning.local_update import DeviceData, LocalWork
from lcfed.learning.models import Network, param_spec
from lcfed.methods import METHODS
from lcfed.methods.base import DeviceContext, Federation, RoundPlan, Strategy
from lcfed.methods.cgpfl import CGPFLState
from lcfed.methods.fedavg import ModelMessage
from lcfed.methods.fedper import EmbeddingMessage, PersonalHead
from lcfed.methods.fesem import FeSEMState, span_coordinates
from lcfed.methods.ifca import IFCAMessage, IFCAState, cluster_losses
from lcfed.methods.lcfed import PersonalModel
from lcfed.run.setup import prepare
from tests.conftest import tiny_config
from tests.test_math import Tiny

# Tiny: w = [a | W0, W1 | b0, b1], logits = W * (a x) + b; the embedding φ is a, the decision h the rest.
Q = 1.0 / (1.0 + math.exp(4.0))  # sigmoid(-4): softmax mass on the wrong class when the logits are (2, -2)
P = 1.0 - Q
ONE_STEP = LocalWork(lr=0.1, batch_size=32, steps=1)  # one batch = all of a tiny device's samples


def _net() -> Network:
    module = Tiny()
    return Network(module, param_spec(module))


def _strategy(name: str, num_devices: int, *extra: str) -> Strategy:
    cfg = load_config(None, [f"method.name={name}", f"data.num_devices={num_devices}", *extra])
    fed = Federation(num_devices, np.ones(num_devices, dtype=np.int64), np.zeros(num_devices, dtype=np.int64),
                     param_spec(Tiny()), torch.zeros(5), 2, 0)
    return METHODS[name].strategy(cfg, fed)


def _data(x: float, y: int, copies: int = 1) -> DeviceData:
    xs, ys = torch.full((copies, 1), x), torch.full((copies,), y, dtype=torch.long)
    return DeviceData(xs, ys, xs, ys)


def _ctx(device: int, data: DeviceData) -> DeviceContext:
    return DeviceContext(device, 1, data, _net(), ONE_STEP, 0)


# one SGD step (lr 0.1) from w = (1 | 1, -1 | 0, 0) at x = 2: logits (2, -2)
# label 0: dz = (-Q, Q), dW = 2 dz, db = dz, da = (W . dz) x = -4Q
STEP_FROM_M1_LABEL0 = torch.tensor([1 + 0.4 * Q, 1 + 0.2 * Q, -1 - 0.2 * Q, 0.1 * Q, -0.1 * Q])
# label 1: dz = (P, -P), da = 4P
STEP_FROM_M1_LABEL1 = torch.tensor([1 - 0.4 * P, 1 - 0.2 * P, -1 + 0.2 * P, -0.1 * P, 0.1 * P])
# label 1 from w = (1 | -1, 1 | 0, 0): logits (-2, 2), dz = (Q, -Q), da = (-Q - Q) 2 = -4Q
STEP_FROM_M2_LABEL1 = torch.tensor([1 + 0.4 * Q, -1 - 0.2 * Q, 1 + 0.2 * Q, -0.1 * Q, 0.1 * Q])

# three hand-made cluster models: indifferent, "class 0 for x > 0", "class 1 for x > 0"
CENTERS = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 1.0, -1.0, 0.0, 0.0], [1.0, -1.0, 1.0, 0.0, 0.0]])


# --- IFCA ---------------------------------------------------------------------------------------


def test_ifca_device_joins_the_min_loss_cluster_and_trains_its_model():
    strategy = _strategy("ifca", 3, "method.num_clusters=3")
    losses = cluster_losses(_net(), CENTERS, _data(2.0, 0))
    assert torch.allclose(losses, torch.tensor([math.log(2), math.log1p(math.exp(-4)), math.log1p(math.exp(4))], dtype=torch.float64))
    state, msg = strategy.local(_ctx(0, _data(2.0, 0)), None, CENTERS, None)
    assert state is None and isinstance(msg, IFCAMessage)
    assert msg.cluster == 1 and torch.allclose(msg.weights, STEP_FROM_M1_LABEL0, atol=1e-6)
    _, msg = strategy.local(_ctx(1, _data(2.0, 1)), None, CENTERS, None)
    assert msg.cluster == 2 and torch.allclose(msg.weights, STEP_FROM_M2_LABEL1, atol=1e-6)
    # evaluation picks by training loss too
    assert torch.equal(strategy.personalized(_ctx(1, _data(2.0, 1)), None, CENTERS), CENTERS[2])


def test_ifca_server_averages_per_cluster_with_sample_weights_and_counts_k_models_down():
    strategy = _strategy("ifca", 4, "method.num_clusters=3")
    state = IFCAState(CENTERS, np.full(4, -1))
    plan = strategy.configure(state, 0)
    assert plan.devices == (0, 1, 2, 3) and plan.down_bytes == 4 * 3 * 5 * 4  # K float32 models each
    u, v, z = torch.arange(5.0), torch.full((5,), 4.0), torch.ones(5)
    msgs = [IFCAMessage(0, 1, 0.2, u, 1), IFCAMessage(1, 3, 0.6, v, 1), IFCAMessage(3, 2, 0.4, z, 0)]
    new, stats = strategy.aggregate(state, RoundPlan(0, (0, 1, 3), None, down_bytes=60), msgs)
    assert torch.allclose(new.centers[1], (1 * u + 3 * v) / 4)  # sample-weighted
    assert torch.equal(new.centers[0], z)
    assert torch.equal(new.centers[2], CENTERS[2])  # nobody chose it: kept
    assert list(new.assignment) == [1, 1, -1, 0] and list(stats.assignment) == [1, 1, -1, 0]
    assert stats.num_clusters == 2 and stats.bytes_up == 3 * 5 * 4 and stats.bytes_down == 60
    assert stats.train_loss == pytest.approx((0.2 + 3 * 0.6 + 2 * 0.4) / 6)
    assert list(state.assignment) == [-1] * 4 and torch.equal(state.centers, CENTERS)  # inputs untouched


def test_ifca_initial_models_are_distinct_draws_of_the_init():
    setup = prepare(tiny_config("method.name=ifca"))
    fed = setup.federation
    centers = METHODS["ifca"].strategy(tiny_config("method.name=ifca"), fed).init().centers
    assert centers.shape == (3, fed.spec.size) and torch.equal(centers[0], fed.init)
    for j in (1, 2):
        assert not torch.equal(centers[j], centers[0])
        for name, block in fed.spec.unflatten(centers[j]).items():  # each tensor: same values, shuffled
            assert torch.equal(block.flatten().sort().values, fed.spec.unflatten(fed.init)[name].flatten().sort().values)
    assert not torch.equal(centers[1], centers[2])


# --- FeSEM --------------------------------------------------------------------------------------


def _e(*values: float) -> torch.Tensor:
    return torch.tensor([*values, *[0.0] * (5 - len(values))])


def test_fesem_e_step_by_l2_and_m_step_plain_means():
    strategy = _strategy("fesem", 4, "method.num_clusters=2")
    centers = torch.stack([_e(1), _e(10)])
    state = FeSEMState(centers, np.array([0, 1, 1, -1]))
    # (6, 3) is as cosine-close to both centers as to the e1 axis but L2-closer to (10, 0): 5 < 5.83
    models = [_e(2), _e(9, 1), _e(6, 3)]
    msgs = [ModelMessage(i, n, 0.5, w) for i, (n, w) in enumerate(zip([1, 3, 6], models, strict=True))]
    new, stats = strategy.aggregate(state, RoundPlan(2, (0, 1, 2), None), msgs)
    assert list(new.assignment) == [0, 1, 1, -1] and stats.num_clusters == 2
    assert torch.equal(new.centers[0], _e(2))
    assert torch.allclose(new.centers[1], _e(7.5, 2))  # plain mean, not sample-weighted (7.2, 2.1)


def test_fesem_first_round_picks_seeds_among_models_then_one_em_step():
    strategy = _strategy("fesem", 4, "method.num_clusters=2")
    state = strategy.init()
    models = [_e(0), _e(10.2), _e(0.2), _e(10)]
    msgs = [ModelMessage(i, 1, 0.5, w) for i, w in enumerate(models)]
    new, _ = strategy.aggregate(state, RoundPlan(0, (0, 1, 2, 3), None), msgs)
    a = new.assignment
    assert a[0] == a[2] != a[1] == a[3]
    assert torch.allclose(new.centers[a[0]], _e(0.1)) and torch.allclose(new.centers[a[1]], _e(10.1))
    again, _ = strategy.aggregate(state, RoundPlan(0, (0, 1, 2, 3), None), msgs)
    assert list(again.assignment) == list(a)


def test_span_coordinates_keep_every_distance_and_angle():
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    c = span_coordinates(x)
    assert c.shape == (6, 6)
    assert torch.allclose(c @ c.T, x.double() @ x.double().T, atol=1e-9)


def test_fesem_device_trains_from_its_center_not_its_own_model():
    strategy = _strategy("fesem", 3, "method.num_clusters=3")
    own = PersonalModel(torch.full((5,), 5.0), True)
    dev, msg = strategy.local(_ctx(0, _data(2.0, 0)), own, CENTERS, 1)
    assert torch.allclose(msg.weights, STEP_FROM_M1_LABEL0, atol=1e-6)  # type: ignore[attr-defined]
    assert dev.trained and torch.equal(dev.weights, msg.weights)  # type: ignore[attr-defined]
    assert torch.equal(strategy.personalized(_ctx(0, _data(2.0, 0)), dev, strategy.eval_payload(FeSEMState(CENTERS, np.zeros(3)))), dev.weights)
    plan = strategy.configure(FeSEMState(CENTERS, np.array([1, -1, 0])), 3)
    assert plan.instructions == {0: 1, 1: -1, 2: 0} and plan.down_bytes == 3 * 5 * 4  # one model each


# --- FedPer -------------------------------------------------------------------------------------


def test_fedper_averages_only_the_embedding_and_keeps_each_head_personal():
    strategy = _strategy("fedper", 2)
    phi = torch.tensor([1.0])
    head = PersonalHead(torch.tensor([1.0, -1.0, 0.0, 0.0]))
    dev_a, msg_a = strategy.local(_ctx(0, _data(2.0, 0)), head, phi, None)
    dev_b, msg_b = strategy.local(_ctx(1, _data(2.0, 1, copies=3)), head, phi, None)
    # each head is its own local result; only φ is uploaded
    assert torch.allclose(dev_a.decision, STEP_FROM_M1_LABEL0[1:], atol=1e-6)
    assert torch.allclose(dev_b.decision, STEP_FROM_M1_LABEL1[1:], atol=1e-6)
    assert isinstance(msg_a, EmbeddingMessage) and torch.allclose(msg_a.embedding, STEP_FROM_M1_LABEL0[:1], atol=1e-6)
    plan = strategy.configure(strategy.init(), 0)
    new, stats = strategy.aggregate(strategy.init(), plan, [msg_a, msg_b])
    expected_phi = (1 * (1 + 0.4 * Q) + 3 * (1 - 0.4 * P)) / 4  # sample-weighted, n = 1 and 3
    assert torch.allclose(new.embedding, torch.tensor([expected_phi]), atol=1e-6)
    assert stats.bytes_up == 2 * 4 and plan.down_bytes == 2 * 4  # one float32 (φ) each way per device
    assert torch.allclose(strategy.personalized(_ctx(1, _data(2.0, 1)), dev_b, new.embedding),
                          torch.cat([new.embedding, dev_b.decision]))
    assert torch.equal(head.decision, torch.tensor([1.0, -1.0, 0.0, 0.0]))  # input untouched


# --- CGPFL --------------------------------------------------------------------------------------


def test_cgpfl_assigns_by_cosine_and_groups_are_plain_means():
    strategy = _strategy("cgpfl", 3, "method.num_clusters=2")
    centers = torch.stack([_e(1), _e(0, 10)])
    state = CGPFLState(centers, np.array([0, 0, 1]))
    # (0.5, 3) is L2-closer to (1, 0) (3.04 < 7.02) but points along (0, 10): cosine sends it there
    models = [_e(0.5, 3), _e(3, 0.5), _e(0, 4, 1)]
    msgs = [ModelMessage(i, i + 1, 0.5, w) for i, w in enumerate(models)]
    new, stats = strategy.aggregate(state, RoundPlan(4, (0, 1, 2), None), msgs)
    assert list(new.assignment) == [1, 0, 1] and list(stats.assignment) == [1, 0, 1]
    assert torch.equal(new.centers[0], _e(3, 0.5))
    assert torch.allclose(new.centers[1], _e(0.25, 3.5, 0.5))


def test_cgpfl_first_grouping_follows_directions_not_distances():
    strategy = _strategy("cgpfl", 4, "method.num_clusters=2")
    # two directions; by L2, (1, 0.1) and (0.1, 1) would pair up against the two long models
    models = [_e(1, 0.1), _e(10), _e(0.1, 1), _e(0, 5)]
    new, _ = strategy.aggregate(strategy.init(), RoundPlan(0, (0, 1, 2, 3), None), [ModelMessage(i, 1, 0.5, w) for i, w in enumerate(models)])
    a = new.assignment
    assert a[0] == a[1] != a[2] == a[3]
    assert torch.allclose(new.centers[a[0]], _e(5.5, 0.05)) and torch.allclose(new.centers[a[2]], _e(0.05, 3))


def test_cgpfl_proximal_pull_to_the_group_model_from_the_personal_model():
    strategy = _strategy("cgpfl", 2, "method.num_clusters=2", "method.mu=0.5")
    centers = torch.stack([torch.zeros(5), torch.ones(5)])
    own = PersonalModel(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))
    # CE gradient at θ = (1 | 0 | 0), x = 2, y = 0: (0, -1, 1, -0.5, 0.5); μ(θ − Ω_1) = (0, -.5, -.5, -.5, -.5)
    dev, msg = strategy.local(_ctx(0, _data(2.0, 0)), own, centers, 1)
    assert torch.allclose(msg.weights, torch.tensor([1.0, 0.15, -0.05, 0.10, 0.0]), atol=1e-6)  # type: ignore[attr-defined]
    assert dev.trained and torch.equal(dev.weights, msg.weights)  # type: ignore[attr-defined]
    # no group yet: plain SGD
    _, msg = strategy.local(_ctx(0, _data(2.0, 0)), own, centers, -1)
    assert torch.allclose(msg.weights, torch.tensor([1.0, 0.1, -0.1, 0.05, -0.05]), atol=1e-6)  # type: ignore[attr-defined]
    plan = strategy.configure(CGPFLState(centers, np.array([1, -1])), 1)
    assert plan.down_bytes == 1 * 5 * 4  # only the assigned device downloads its group model


@pytest.mark.parametrize(
    "override",
    ["method.num_clusters=9", "method.num_clusters=0"],
)
@pytest.mark.parametrize("name", ["ifca", "fesem", "cgpfl"])
def test_cluster_count_is_validated(name, override):
    with pytest.raises(ConfigError, match="method.num_clusters"):
        tiny_config(f"method.name={name}", override)


def test_cgpfl_mu_is_validated_and_k_bounded_by_participants():
    with pytest.raises(ConfigError, match="method.mu"):
        tiny_config("method.name=cgpfl", "method.mu=-1")
    with pytest.raises(ConfigError, match="method.num_clusters"):
        tiny_config("method.name=fesem", "train.participation=0.25")  # 2 per round < K = 3
    assert tiny_config("method.name=ifca", "train.participation=0.25").method.params.num_clusters == 3


# --- end to end ---------------------------------------------------------------------------------




MODEL_BYTES = 61_706 * 4


@pytest.mark.parametrize(
    "name,min_acc,up,down",
    [
        # 8 devices, K = 3; bytes per round (all devices take part)
        ("ifca", 0.25, 8 * MODEL_BYTES, 8 * 3 * MODEL_BYTES),
        ("fesem", 0.3, 8 * MODEL_BYTES, 8 * MODEL_BYTES),
        ("fedper", 0.4, 8 * (61_706 - 850) * 4, 8 * (61_706 - 850) * 4),
        ("cgpfl", 0.45, 8 * MODEL_BYTES, 8 * MODEL_BYTES),
    ],
)
def test_seeded_run_on_digits_learns(name, min_acc, up, down):
    # run after run the same numbers: test_conformance.py's `seeded` for every built-in (no round-dependent params)
    cfg = tiny_config(f"method.name={name}", "train.rounds=5", "train.eval_every=5")
    a = run_local(cfg)
    assert a.final["acc_mean"] > min_acc, a.final
    last = a.history[-1]
    assert last["bytes_up"] == up and last["bytes_down"] == down
    if name != "fedper":
        assert a.assignment is not None and a.assignment.min() >= 0 and last["num_clusters"] >= 1
