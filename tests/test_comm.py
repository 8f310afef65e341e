"""Communication accounting per layer and the simulated round time, against hand counts on LeNet-5."""

from __future__ import annotations

import pytest
import torch

from lcfed.engines.local import run_local
from lcfed.learning.models import build_network
from lcfed.methods.traffic import downlink_traffic, layer_traffic
from lcfed.run.setup import prepare
from tests.conftest import tiny_config

# LeNet-5 on 1x28x28, 10 classes: parameters per layer (weights + biases)
LAYERS = {"conv1": 6 * 25 + 6, "conv2": 16 * 6 * 25 + 16, "fc1": 400 * 120 + 120, "fc2": 120 * 84 + 84, "fc3": 84 * 10 + 10}
# multiply-adds of one forward pass: conv1 padded to 28x28 output, conv2 10x10 output, then the three linears
MACS = 6 * 25 * 28 * 28 + 16 * 6 * 25 * 10 * 10 + 400 * 120 + 120 * 84 + 84 * 10


@pytest.fixture(scope="module")
def spec():
    net, _ = build_network("lenet5", (1, 28, 28), 10, 0)
    return net.spec


def test_layer_traffic_splits_models_embeddings_and_named_layers(spec):
    assert sum(LAYERS.values()) == spec.size == 61_706
    full = layer_traffic(spec, torch.zeros(spec.size))
    assert full == {k: 4 * v for k, v in LAYERS.items()}
    emb = layer_traffic(spec, {"phi": torch.zeros(spec.embedding_size), "code": torch.zeros(7)})
    assert emb == {**{k: 4 * v for k, v in LAYERS.items() if k != "fc3"}, "other": 28}
    centers = layer_traffic(spec, torch.zeros(3, spec.size, dtype=torch.float64))  # rows of models, 8-byte floats
    assert centers["fc1"] == 3 * 8 * LAYERS["fc1"]
    partial = layer_traffic(spec, {"conv2": torch.zeros(LAYERS["conv2"]), "fc3": torch.zeros(LAYERS["fc3"])})
    assert partial == {"conv2": 4 * LAYERS["conv2"], "fc3": 4 * LAYERS["fc3"]}
    assert downlink_traffic(spec, [(torch.zeros(spec.size), 5), (torch.zeros(4), 2)]) == {
        **{k: 20 * v for k, v in LAYERS.items()}, "other": 32}


def test_forward_flops_of_lenet5():
    assert prepare(tiny_config()).federation.flops_per_sample == 2 * MACS


@pytest.mark.parametrize("method", ["fedavg", "fedper", "lcfed"])
def test_round_metrics_carry_layer_bytes_and_simulated_time(method):
    cfg = tiny_config(f"method.name={method}", "train.rounds=2", "train.participation=0.5",
                      "network.bandwidth_mbps=2", "network.device_gflops=5")
    result = run_local(cfg)
    first, second = result.history
    n = 4  # half of 8 devices
    for row in result.history:
        ups = {k.split("/", 1)[1]: v for k, v in row.items() if k.startswith("bytes_up/")}
        downs = {k.split("/", 1)[1]: v for k, v in row.items() if k.startswith("bytes_down/")}
        assert sum(ups.values()) == row["bytes_up"] and sum(downs.values()) == row["bytes_down"]
        # 3 local steps x batch 32, forward + backward = 3 forward passes, at 5 GFLOP/s
        assert row["sim_compute_seconds"] == pytest.approx(3 * 32 * 3 * 2 * MACS / 5e9)
        assert row["sim_comm_seconds"] == pytest.approx((row["bytes_up"] + row["bytes_down"]) / n * 8 / 2e6)
    if method == "fedavg":  # every participant sends and receives the whole model
        assert {k: first[f"bytes_up/{k}"] for k in LAYERS} == {k: n * 4 * v for k, v in LAYERS.items()}
        assert first["sim_comm_seconds"] == pytest.approx(2 * 61_706 * 4 * 8 / 2e6)
    if method == "fedper":  # the decision layer stays on the device
        assert "bytes_up/fc3" not in first and "bytes_down/fc3" not in first
    if method == "lcfed":  # round 1: assigned devices also get their cluster model; codes are "other"
        assert second["bytes_up/other"] > 0 and second["bytes_down/fc3"] > 0
    assert second["sim_seconds_total"] == pytest.approx(
        first["sim_comm_seconds"] + first["sim_compute_seconds"] + second["sim_comm_seconds"] + second["sim_compute_seconds"])
