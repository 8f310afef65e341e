"""Sample-level DP-SGD inside a device (privacy.sample_noise): the per-sample clipped and noised step by hand, its
seeded noise, its accountant against dp-accounting, and a run resumed bit for bit with its ε."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lcfed.learning.accounting import epsilon, sample_epsilon
from lcfed.learning.local_update import DeviceData, LocalWork, SampleDP, batch_rng, local_update, private_loss_and_grad
from tests.conftest import tiny_config
from tests.test_privacy import straight_and_resumed

pytest.importorskip("dp_accounting")


def _linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x @ w.view(2, 2)  # logits of a 2-class linear model, W flattened


def test_the_dp_sgd_step_by_hand():
    """2 samples at W = 0 (softmax 1/2, 1/2): sample 0's gradient x ⊗ (p − e_0) = [[−1.5, 1.5], [−2, 2]] has norm
    √12.5 and is clipped to 1; sample 1's, [[0.05, −0.05], [0, 0]], is within; their sum plus noise, over 2."""
    w = torch.zeros(4, dtype=torch.float64)
    x = torch.tensor([[3.0, 4.0], [0.1, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    g0 = torch.tensor([-1.5, 1.5, -2.0, 2.0], dtype=torch.float64) / math.sqrt(12.5)
    g1 = torch.tensor([0.05, -0.05, 0.0, 0.0], dtype=torch.float64)
    loss, quiet = private_loss_and_grad(_linear, w, x, y, SampleDP(1.0, 0.0), torch.Generator().manual_seed(3))
    assert loss == pytest.approx(math.log(2)) and torch.allclose(quiet, (g0 + g1) / 2)
    _, noisy = private_loss_and_grad(_linear, w, x, y, SampleDP(1.0, 0.5), torch.Generator().manual_seed(3))
    drawn = torch.randn(4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.5
    assert torch.allclose(noisy, (g0 + g1 + drawn) / 2)


def test_dp_sgd_noise_is_a_function_of_seed_device_and_round():
    data = DeviceData(torch.randn(6, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 0, 1, 1, 0]),
                      torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
    work = LocalWork(lr=0.5, batch_size=3, steps=2, sample_dp=SampleDP(1.0, 1.0))
    w0 = torch.zeros(4)

    def run(device: int, rnd: int) -> torch.Tensor:
        return local_update(_linear, w0, data, work, batch_rng(0, device, rnd)).weights

    assert torch.equal(run(1, 2), run(1, 2))
    assert not torch.equal(run(1, 2), run(2, 2)) and not torch.equal(run(1, 2), run(1, 3))
    plain = local_update(_linear, w0, data, LocalWork(lr=0.5, batch_size=3, steps=2), batch_rng(0, 1, 2)).weights
    assert not torch.equal(plain, run(1, 2))


def test_the_sample_accountant():
    # one device: the sampled Gaussian composed over its steps, the central accountant's number
    assert sample_epsilon([(0.01, 10_000)], 4.0, 1e-5) == epsilon([0.01] * 10_000, 4.0, 1e-5)
    # the worst device: a dominated one (lower rate, fewer steps) changes nothing; two on the front, the larger
    a, b = sample_epsilon([(0.1, 20)], 1.0, 1e-5), sample_epsilon([(0.05, 60)], 1.0, 1e-5)
    assert sample_epsilon([(0.1, 20), (0.05, 10)], 1.0, 1e-5) == a
    assert sample_epsilon([(0.1, 20), (0.05, 60), (0.02, 30)], 1.0, 1e-5) == max(a, b)
    assert sample_epsilon([], 1.0, 1e-5) == 0.0


SAMPLE = ("method.name=fedavg", "privacy.sample_noise=1.0", "privacy.sample_clip=1.0", "train.local_steps=2")


def test_a_dp_sgd_run_resumes_bit_for_bit_and_reports_the_worst_devices_epsilon(tmp_path):
    full = straight_and_resumed(tmp_path, SAMPLE, 3, 2)
    from lcfed.run.setup import prepare

    cfg = tiny_config(*SAMPLE, "train.rounds=3")
    fed = prepare(cfg).federation
    n = int(np.min(fed.train_sizes))
    batch = cfg.train.batch_size
    eps = [row["dp_sample_epsilon"] for row in full.history]
    assert eps == sorted(eps) and full.history[-1]["dp_sample_delta"] == n ** -1.1
    # every device's 2 steps a round, 3 rounds; the smallest device has the highest rate and the same steps
    assert eps[-1] == sample_epsilon([(min(1.0, batch / n), 6)], 1.0, n ** -1.1)
    assert "dp_epsilon" not in full.history[-1]  # no central DP: the server's sums are not noised
