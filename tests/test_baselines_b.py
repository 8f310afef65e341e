"""Baselines FedGroup, FL+HC, Per-FedAvg and ClusterFL: each defining step by hand, then seeded end-to-end runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcfed.config import load_config
from lcfed.engines.local import run_local
from lcfed.learning.local_update import DeviceData, LocalWork
from lcfed.learning.models import Network, param_spec
from lcfed.methods.base import DeviceContext, Federation, RoundPlan
from lcfed.methods.clusterfl import ClusterFL, PersonalModel, indicator_clusters, similarity
from lcfed.methods.fedavg import ModelMessage
from lcfed.methods.fedgroup import FedGroup, decomposed_cosine
from lcfed.methods.flhc import FLHC, hierarchical_labels
from lcfed.methods.perfedavg import Batch, PerFedAvg, PerFedAvgState, hessian_vector_product, maml_step
from tests.conftest import same_history, tiny_config
from tests.test_math import Tiny  # w = [a | W0, W1, b0, b1]: layer emb = a, layer head = the rest


def _net() -> Network:
    module = Tiny()
    return Network(module.requires_grad_(False), param_spec(module))


def _strategy(cls, num_devices: int, *overrides: str, init: torch.Tensor | None = None):
    cfg = load_config(None, [f"data.num_devices={num_devices}", *overrides])
    fed = Federation(num_devices, np.ones(num_devices, dtype=np.int64), np.zeros(num_devices, dtype=np.int64),
                     param_spec(Tiny()), torch.zeros(5) if init is None else init, 2, 0)
    return cls(cfg, fed)


def _one_sample(x: float, y: int) -> DeviceData:
    return DeviceData(torch.tensor([[x]]), torch.tensor([y]), torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))


def _ctx(data: DeviceData, lr: float = 0.1, device: int = 0, rnd: int = 0) -> DeviceContext:
    return DeviceContext(device, rnd, data, _net(), LocalWork(lr=lr, batch_size=32, steps=1), seed=0)


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to renaming the clusters."""
    return all((a[i] == a[j]) == (b[i] == b[j]) for i in range(len(a)) for j in range(len(a)))


def _msg(device: int, weights: list[float] | torch.Tensor, n: int = 1) -> ModelMessage:
    return ModelMessage(device, n, 0.5, torch.as_tensor(weights, dtype=torch.float32))


# --- FedGroup ------------------------------------------------------------------------------------


def test_decomposed_cosine_by_hand():
    # ΔWᵀΔW = diag(1 + 4, 9 + 1, 0): the directions are e2 (σ² = 10), then e1 (σ² = 5)
    updates = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 1.0, 0.0]])
    edc = decomposed_cosine(updates, rank=2)
    assert torch.allclose(edc, torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]], dtype=edc.dtype))
    # rank 1 keeps only e2; the scale of an update does not matter, only its direction
    assert torch.allclose(decomposed_cosine(updates, rank=1)[:, 0], torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=edc.dtype))


def test_fedgroup_cold_start_groups_similar_updates_and_places_a_newcomer():
    w0 = torch.tensor([-1.5, 0.0, 0.0, 0.0, 0.0])  # clustering the raw weights instead of the updates would fail
    strategy = _strategy(FedGroup, 8, "method.name=fedgroup", "method.num_clusters=2", "method.pretrain_fraction=0.5", init=w0)
    state = strategy.init()
    plan = strategy.configure(state, 0)
    sample = plan.devices
    assert len(sample) == 4 and all(plan.instructions[d] == -1 for d in sample)  # all pretrain from w0
    assert torch.equal(plan.payload.init, w0) and plan.down_bytes == 4 * 5 * 4
    # updates: sample[0], sample[2] along e0; sample[1], sample[3] along e1
    deltas = [[2.0, 0.1, 0, 0, 0], [0.1, 1.0, 0, 0, 0], [1.0, -0.1, 0, 0, 0], [0.0, 2.0, 0.1, 0, 0]]
    msgs = [_msg(d, w0 + torch.tensor(u)) for d, u in zip(sample, deltas, strict=True)]
    state, stats = strategy.aggregate(state, plan, msgs)
    a = state.assignment
    assert a[sample[0]] == a[sample[2]] != a[sample[1]] == a[sample[3]]
    assert stats.num_clusters == 2 and (a >= 0).sum() == 4
    g_e0, g_e1 = int(a[sample[0]]), int(a[sample[1]])
    # a group's model is the plain mean of its members' pretrained models
    assert torch.allclose(state.centers[g_e0], w0 + torch.tensor([1.5, 0.0, 0, 0, 0]))
    assert torch.allclose(state.centers[g_e1], w0 + torch.tensor([0.05, 1.5, 0.05, 0, 0]))

    # round 1: members start from their group model, newcomers pretrain from w0
    plan1 = strategy.configure(state, 1)
    newcomers = [d for d in range(8) if d not in sample]
    assert plan1.instructions[sample[0]] == g_e0 and all(plan1.instructions[d] == -1 for d in newcomers)
    new = newcomers[0]
    members = [_msg(sample[0], torch.full((5,), 1.0), n=1), _msg(sample[2], torch.full((5,), 3.0), n=3)]
    newcomer = _msg(new, w0 + torch.tensor([0.3, 2.0, 0.0, 0.5, 0.0]))  # mostly along e1
    state1, stats1 = strategy.aggregate(state, plan1, sorted([*members, newcomer], key=lambda m: m.device))
    assert state1.assignment[new] == g_e1 and stats1.assignment[new] == g_e1
    assert all(state1.assignment[d] == -1 for d in newcomers[1:])
    # FedAvg within the group (sample-weighted); the newcomer's pretrained model is not averaged in
    assert torch.allclose(state1.centers[g_e0], torch.full((5,), 2.5))
    assert torch.equal(state1.centers[g_e1], state.centers[g_e1])
    assert list(state.assignment) != list(state1.assignment)  # the input state was not modified


# --- FL+HC ---------------------------------------------------------------------------------------


def test_hierarchical_cut_merges_only_updates_closer_than_the_threshold():
    updates = torch.tensor([[0.0, 0.0], [0.5, 0.0], [10.0, 0.0], [10.4, 0.0], [30.0, 0.0]])
    for method in ("ward", "average", "complete", "single"):
        assert list(hierarchical_labels(updates, method, 2.0)) == [0, 0, 1, 1, 2]
    # 0.4 <= 0.45 < 0.5: only the closest pair merges
    assert list(hierarchical_labels(updates, "ward", 0.45)) == [0, 1, 2, 2, 3]
    # Ward height of {0, 1} with {2, 3}: sqrt(2 * 2 * 2 / 4) * |0.25 - 10.2| = 14.07
    assert list(hierarchical_labels(updates, "ward", 14.0)) == [0, 0, 1, 1, 2]
    assert list(hierarchical_labels(updates, "ward", 14.1)) == [0, 0, 0, 0, 1]
    assert list(hierarchical_labels(updates, "ward", 1.0, num_clusters=2)) == [0, 0, 0, 0, 1]


def test_flhc_clusters_once_after_warmup_then_fedavg_per_cluster():
    strategy = _strategy(FLHC, 4, "method.name=flhc", "method.warmup_rounds=1", "method.distance_threshold=1.0",
                         "train.participation=0.5")
    state = strategy.init()
    plan0 = strategy.configure(state, 0)
    assert len(plan0.devices) == 2  # warm-up: FedAvg on the sampled participants
    msgs0 = [_msg(d, torch.full((5,), float(i + 1)), n=i + 1) for i, d in enumerate(plan0.devices)]
    state, stats0 = strategy.aggregate(state, plan0, msgs0)
    glob = torch.full((5,), (1 * 1 + 2 * 2) / 3)
    assert torch.allclose(state.centers, glob[None]) and stats0.num_clusters == 1 and not state.clustered

    plan1 = strategy.configure(state, 1)
    assert plan1.devices == (0, 1, 2, 3)  # the clustering round hears from every device
    deltas = [[0, 0, 0, 0, 0], [5, 0, 0, 0, 0], [0.3, 0.2, 0, 0, 0], [5, 0.5, 0, 0, 0]]
    msgs1 = [_msg(d, glob + torch.tensor(u), n=d + 1) for d, u in enumerate(deltas)]
    state, stats1 = strategy.aggregate(state, plan1, msgs1)
    assert list(state.assignment) == [0, 1, 0, 1] and stats1.num_clusters == 2 and state.clustered
    assert torch.allclose(state.centers[0], glob + torch.tensor([0.3 * 3 / 4, 0.2 * 3 / 4, 0, 0, 0]))
    assert torch.allclose(state.centers[1], glob + torch.tensor([5.0, 0.5 * 4 / 6, 0, 0, 0]))

    # afterwards each cluster is its own FedAvg; nobody is re-clustered
    plan2 = strategy.configure(state, 2)
    assert {d: plan2.instructions[d] for d in plan2.devices} == {d: int(state.assignment[d]) for d in plan2.devices}
    far = _msg(0, torch.full((5,), 100.0))
    state2, _ = strategy.aggregate(state, RoundPlan(2, (0,), None), [far])
    assert list(state2.assignment) == [0, 1, 0, 1]
    assert torch.equal(state2.centers[0], far.weights) and torch.equal(state2.centers[1], state.centers[1])


# --- Per-FedAvg ----------------------------------------------------------------------------------


def test_first_order_maml_step_by_hand():
    w = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    # inner step on D = (x=2, y=0) at w: h = 2, logits 0, dz = (-.5, .5): grad = (0, -1, 1, -.5, .5)
    # w_tmp = w - 0.1 grad = (1, .1, -.1, .05, -.05)
    # outer gradient on D' = (x=1, y=1) at w_tmp: h = 1, logits (.15, -.15), p0 = sigmoid(.3), dz = (p0, -p0)
    # dW = db = (p0, -p0), da = (.1 p0 + .1 p0) * 1 = .2 p0;  w <- w - 0.2 * grad
    p0 = 1 / (1 + math.exp(-0.3))
    expected = torch.tensor([1 - 0.04 * p0, -0.2 * p0, 0.2 * p0, -0.2 * p0, 0.2 * p0])
    inner, outer = Batch(torch.tensor([[2.0]]), torch.tensor([0])), Batch(torch.tensor([[1.0]]), torch.tensor([1]))
    new, loss = maml_step(_net(), w, inner, outer, alpha=0.1, beta=0.2)
    assert torch.allclose(new, expected, atol=1e-6)
    assert loss == pytest.approx(math.log(2), abs=1e-6)  # f(w; D), the meta-model's own loss
    assert torch.equal(w, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))


def test_hessian_free_step_adds_the_second_order_correction():
    net, w = _net(), torch.tensor([0.7, 0.3, -0.2, 0.1, 0.05])
    b1, b2, b3 = (Batch(torch.tensor([[x]]), torch.tensor([y])) for x, y in ((2.0, 0), (1.0, 1), (-1.5, 1)))
    fo, _ = maml_step(net, w, b1, b2, alpha=0.1, beta=0.2)
    hf, _ = maml_step(net, w, b1, b2, alpha=0.1, beta=0.2, hessian=b3)
    g_outer = (w - fo) / 0.2
    hv = hessian_vector_product(net, w, b3, g_outer)
    # the Hessian-vector product against central differences of the gradient
    from lcfed.learning.local_update import loss_and_grad

    eps = 1e-2
    fd = (loss_and_grad(net, w + eps * g_outer, b3.x, b3.y)[1] - loss_and_grad(net, w - eps * g_outer, b3.x, b3.y)[1]) / (2 * eps)
    assert torch.allclose(hv, fd, atol=1e-3) and hv.abs().max() > 1e-3
    assert torch.allclose(hf, fo + 0.2 * 0.1 * hv, atol=1e-6)


def test_local_meta_step_and_personalized_one_step_adaptation():
    strategy = _strategy(PerFedAvg, 2, "method.name=perfedavg", "method.alpha=0.1", "method.beta=0.2")
    w = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    ctx = _ctx(_one_sample(2.0, 0))
    # personalized = w - α ∇f(w; a training batch) = (1, .1, -.1, .05, -.05)
    adapted = strategy.personalized(ctx, None, PerFedAvgState(w, rounds=3))
    assert torch.allclose(adapted, torch.tensor([1.0, 0.1, -0.1, 0.05, -0.05]), atol=1e-6)
    # one local meta-step (D = D' = the only sample): at w_tmp, h = 2, logits (.25, -.25), q = sigmoid(-.5),
    # dz = (-q, q), dW = (-2q, 2q), db = (-q, q), da = (-.1 q - .1 q) * 2 = -.4 q;  w - 0.2 grad
    q = 1 / (1 + math.exp(0.5))
    _, msg = strategy.local(ctx, None, w, None)
    assert torch.allclose(msg.weights, torch.tensor([1 + 0.08 * q, 0.4 * q, -0.4 * q, 0.2 * q, -0.2 * q]), atol=1e-6)
    assert msg.loss == pytest.approx(math.log(2), abs=1e-6) and msg.num_samples == 1
    # the server averages the meta-models with equal weights (Alg. 1)
    plan = strategy.configure(strategy.init(), 0)
    state, stats = strategy.aggregate(strategy.init(), plan, [_msg(0, [1.0] * 5, n=1), _msg(1, [3.0] * 5, n=9)])
    assert torch.allclose(state.weights, torch.full((5,), 2.0)) and state.rounds == 1
    assert stats.bytes_up == 2 * 5 * 4 and stats.bytes_down == 2 * 5 * 4


# --- ClusterFL -----------------------------------------------------------------------------------


def test_similarity_is_cosine_of_centred_models_clipped_at_zero():
    # a large common component makes raw cosines all ~0.96; centring exposes the two directions
    models = torch.tensor([[5.0, 1.0, 0.0], [5.0, -1.0, 0.0], [5.0, 1.0, 0.0], [5.0, -1.0, 0.0]])
    s = similarity(models)
    assert torch.allclose(s, torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]], dtype=s.dtype))
    assert list(indicator_clusters(s, 2, seed=0)) in ([0, 1, 0, 1], [1, 0, 1, 0])


def test_indicator_clusters_recover_a_block_similarity():
    blocks = np.array([0, 1, 2, 0, 1, 0, 2])
    sim = torch.where(torch.from_numpy(blocks[:, None] == blocks[None, :]), 0.9, 0.05).double()
    sim.fill_diagonal_(1.0)
    assert _same_partition(indicator_clusters(sim, 3, seed=0), blocks)


def test_clusterfl_reclusters_periodically_and_pulls_towards_the_cluster_mean():
    strategy = _strategy(ClusterFL, 4, "method.name=clusterfl", "method.num_clusters=2", "method.mu=0.5",
                         "method.recluster_every=2")
    state = strategy.init()
    plan = strategy.configure(state, 0)
    assert plan.down_bytes == 0 and all(i == -1 for i in plan.instructions.values())  # nobody clustered yet
    models = [[5, 1, 0, 0, 0], [5, -1, 0, 0, 0], [5, 1.2, 0, 0, 0], [5, -0.8, 0, 0, 0]]
    state, stats = strategy.aggregate(state, plan, [_msg(d, m) for d, m in enumerate(models)])
    a = state.assignment
    assert a[0] == a[2] != a[1] == a[3] and stats.num_clusters == 2
    assert torch.allclose(state.centers[a[0]], torch.tensor([5.0, 1.1, 0, 0, 0]))
    # round 1 is not a re-clustering round: memberships stay even though device 2 moved towards the other side
    moved = [[5, 1, 0, 0, 0], [5, -1, 0, 0, 0], [5, -1.0, 0, 0, 0], [5, -0.8, 0, 0, 0]]
    state1, _ = strategy.aggregate(state, strategy.configure(state, 1), [_msg(d, m) for d, m in enumerate(moved)])
    assert list(state1.assignment) == list(a)
    state2, _ = strategy.aggregate(state1, strategy.configure(state1, 2), [_msg(d, m) for d, m in enumerate(moved)])
    assert state2.assignment[2] == state2.assignment[1] != state2.assignment[0]

    # local step of device 0 in cluster k: SGD on L_sup + μ/2 ||w - Ω_k||², from its own model
    centers = torch.ones(2, 5)
    dev = PersonalModel(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))
    new_dev, msg = strategy.local(_ctx(_one_sample(2.0, 0)), dev, centers, 1)
    # grad L = (0, -1, 1, -.5, .5), μ (w - 1) = (0, -.5, -.5, -.5, -.5): w - 0.1 * sum
    assert torch.allclose(new_dev.weights, torch.tensor([1.0, 0.15, -0.05, 0.1, 0.0]), atol=1e-6)
    assert new_dev.trained and torch.equal(msg.weights, new_dev.weights)


# --- end to end on digits ------------------------------------------------------------------------

E2E = [
    # chance is 0.1 and FedAvg stays there on this budget; the clustered/personalized models must not
    ("fedgroup", ["method.pretrain_fraction=0.5"], 0.25),  # newcomers join in round 1
    ("flhc", ["method.warmup_rounds=1", "method.num_clusters=0", "method.distance_threshold=0.6"], 0.4),
    ("clusterfl", ["method.recluster_every=2"], 0.4),
]




def _e2e_config(method: str, *extra: str):
    return tiny_config(f"method.name={method}", "train.rounds=4", "train.local_steps=5", "train.lr=0.1", "train.eval_every=2", *extra)


@pytest.mark.parametrize("method,extra,min_acc", E2E, ids=[e[0] for e in E2E])
def test_end_to_end_is_deterministic_and_learns(method, extra, min_acc):
    cfg = _e2e_config(method, *extra)
    a, b = run_local(cfg), run_local(cfg)
    same_history(a.history, b.history)
    assert a.final["acc_mean"] > min_acc, a.final
    assert a.assignment is not None and (a.assignment >= 0).all() and a.final["num_clusters"] >= 2
