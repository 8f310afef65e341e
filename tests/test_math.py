"""Hand-computed tiny cases for LCFed's math: the proximal step, aggregation, projection + assignment."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lcfed.config import load_config
from lcfed.learning.clustering import assign_by_cosine, cluster_means
from lcfed.learning.local_update import DeviceData, LocalWork, Proximal, local_update
from lcfed.learning.models import Network, param_spec
from lcfed.learning.similarity import Projector, fit_projector
from lcfed.methods.base import Federation, RoundPlan
from lcfed.methods.lcfed import LCFed, LCFedMessage, LCFedState


class Tiny(nn.Module):
    """x -> a*x (embedding, 1 weight) -> W h + b (decision, 2 classes): 5 parameters."""

    decision_layer = "head"

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(1, 1, bias=False)
        self.head = nn.Linear(1, 2)

    def forward(self, x):
        return self.head(self.emb(x))


def test_one_proximal_sgd_step_by_hand():
    module = Tiny()
    spec = param_spec(module)
    assert spec.names == ("emb.weight", "head.weight", "head.bias") and spec.embedding_size == 1
    net = Network(module, spec)
    # w = [a | W0, W1 | b0, b1] = [1 | 0, 0 | 0, 0]; one sample x = 2, label 0
    w0 = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    data = DeviceData(torch.tensor([[2.0]]), torch.tensor([0]), torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))
    # h = 2, logits 0, p = (.5, .5): dz = (-.5, .5), dW = dz*h = (-1, 1), db = (-.5, .5), da = W.dz = 0
    # mu = 0.5 towards Omega = 1: mu (w - 1) = (0, -.5, -.5, -.5, -.5)
    # lam = 0.2 towards Phi = 3 on the embedding: 0.2 (1 - 3) = -0.4
    # grad = (-0.4, -1.5, 0.5, -1.0, 0.0); w - 0.1 grad:
    expected = torch.tensor([1.04, 0.15, -0.05, 0.10, 0.0])
    prox = [Proximal(torch.ones(5), 0.5), Proximal(torch.tensor([3.0]), 0.2, slice(0, 1))]
    res = local_update(net, w0, data, LocalWork(lr=0.1, batch_size=32, steps=1), np.random.default_rng(0), prox)
    assert torch.allclose(res.weights, expected, atol=1e-6)
    assert res.loss == pytest.approx(np.log(2), abs=1e-6)
    assert torch.equal(w0, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))  # input untouched


def test_local_steps_and_epochs_count_batches():
    module = Tiny()
    net = Network(module, param_spec(module))
    x = torch.randn(10, 1)
    data = DeviceData(x, (x[:, 0] > 0).long(), x, (x[:, 0] > 0).long())
    w = torch.zeros(5)
    assert local_update(net, w, data, LocalWork(0.1, 4, steps=7), np.random.default_rng(0)).steps == 7
    assert local_update(net, w, data, LocalWork(0.1, 4, epochs=2), np.random.default_rng(0)).steps == 6


def _tiny_lcfed(num_devices: int, k: int) -> tuple[LCFed, Federation]:
    cfg = load_config(None, [f"data.num_devices={num_devices}", f"method.num_clusters={k}", "method.rank=2"])
    spec = param_spec(Tiny())  # 5 parameters, embedding = the first one
    fed = Federation(num_devices, np.ones(num_devices, dtype=np.int64), np.zeros(num_devices, dtype=np.int64), spec,
                     torch.zeros(5), 2, 0)
    return LCFed(cfg, fed), fed


def test_phi_and_omega_aggregation_with_unequal_sample_counts():
    strategy, fed = _tiny_lcfed(3, 2)
    # projector = the first two decision coordinates, so assignments are easy to steer
    comps = torch.zeros(2, 5)
    comps[0, 1] = 1.0
    comps[1, 2] = 1.0
    proj = Projector(comps, torch.zeros(5))
    centers = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    state = LCFedState(torch.zeros(1), centers, np.array([0, 1, 1]), proj, fitted_at=0, center_codes=None)
    w = [
        torch.tensor([1.0, 2.0, 0.0, 1.0, 1.0]),  # -> cluster 0
        torch.tensor([4.0, 0.0, 3.0, 2.0, 0.0]),  # -> cluster 1
        torch.tensor([7.0, 0.0, 5.0, 0.0, 4.0]),  # -> cluster 1
    ]
    counts = [1, 3, 6]
    msgs = [LCFedMessage(i, counts[i], 0.5, w[i], proj(w[i])) for i in range(3)]
    plan = RoundPlan(1, (0, 1, 2), None)
    new, stats = strategy.aggregate(state, plan, msgs)
    # Phi = sample-weighted mean of the embeddings: (1*1 + 3*4 + 6*7) / 10 = 5.5
    assert torch.allclose(new.embedding, torch.tensor([5.5]))
    # Omega_0 = w0; Omega_1 = plain mean of w1 and w2 (Eq. 5)
    assert torch.allclose(new.centers[0], w[0])
    assert torch.allclose(new.centers[1], torch.tensor([5.5, 0.0, 4.0, 1.0, 2.0]))
    # the kept center codes are the members' mean codes = the codes of the new centers: (2, 0) and (0, 4)
    assert torch.allclose(new.center_codes, torch.tensor([[2.0, 0.0], [0.0, 4.0]]))
    assert torch.allclose(new.center_codes, proj(new.centers))
    assert list(new.assignment) == [0, 1, 1] and stats.num_clusters == 2
    assert stats.train_loss == pytest.approx(0.5)
    assert stats.bytes_up == 3 * (5 + 2) * 4  # full model + D-dim code, float32


def test_empty_cluster_keeps_its_model():
    prev = torch.tensor([[1.0, 1.0], [9.0, 9.0]])
    out = cluster_means(torch.tensor([[2.0, 4.0], [4.0, 6.0]]), np.array([0, 0]), prev)
    assert torch.equal(out, torch.tensor([[3.0, 5.0], [9.0, 9.0]]))


def test_projection_and_cosine_assignment_three_devices_two_clusters():
    # PCA of three models that vary only along the first axis: one direction, e1, sign fixed positive
    models = torch.tensor([[3.0, 1.0, 0.0], [1.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    proj = fit_projector(models, rank=2)
    assert torch.allclose(proj.mean, torch.tensor([2.0, 1.0, 0.0]))
    assert torch.allclose(proj.components[0], torch.tensor([1.0, 0.0, 0.0]), atol=1e-6)
    assert torch.equal(proj.components[1], torch.zeros(3))  # no second direction in the data
    codes = proj(models)
    assert torch.allclose(codes[:, 0], torch.tensor([1.0, -1.0, 0.0]), atol=1e-6)
    # LrCos against two cluster codes: (1, 0) and (-1, 0)
    centers = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    # device 0: cos = (1, -1) -> 0; device 1: (-1, 1) -> 1; device 2: zero code, cos = (0, 0) -> first max, 0
    assert list(assign_by_cosine(codes, centers)) == [0, 1, 0]


def test_projection_by_hand_2d():
    # Projector M = [[0.6, 0.8]], mean (1, 1): codes are 0.6 (x-1) + 0.8 (y-1)
    proj = Projector(torch.tensor([[0.6, 0.8]]), torch.tensor([1.0, 1.0]))
    codes = proj(torch.tensor([[2.0, 2.0], [1.0, 0.0], [4.0, 5.0]]))
    assert torch.allclose(codes[:, 0], torch.tensor([1.4, -0.8, 5.0]))
    centers = torch.tensor([[1.0], [-1.0]])
    assert list(assign_by_cosine(codes, centers)) == [0, 1, 0]


def test_adjusted_rand_index_is_scikit_learns_to_the_bit():
    """lcfed computes ARI itself (scikit-learn's metrics module costs its driver ~130 MB); the same numbers."""
    from sklearn.metrics import adjusted_rand_score

    from lcfed.learning.recovery import adjusted_rand_index

    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 200))
        a, t = rng.integers(0, int(rng.integers(1, 9)), n), rng.integers(0, int(rng.integers(1, 9)), n)
        if trial % 3 == 0:
            t = a * 5 + 2  # the same partition under other names: 1.0
        assert adjusted_rand_index(a, t) == float(adjusted_rand_score(t, a))
    assert adjusted_rand_index(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])) == -0.5
