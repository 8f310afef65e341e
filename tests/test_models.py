"""Model sizes and the embedding/decision split."""

from __future__ import annotations

import torch

from lcfed.learning.models import LeNet5, build_network, flatten_params, param_spec


def test_lenet5_has_61706_parameters():
    model = LeNet5(1, 28, 10)
    assert sum(p.numel() for p in model.parameters()) == 61_706
    spec = param_spec(model)
    assert spec.size == 61_706
    assert spec.decision_size == 84 * 10 + 10  # h = the last linear layer
    assert spec.embedding_size == 61_706 - 850


def test_lenet5_cifar_shape():
    net, w = build_network("lenet5", (3, 32, 32), 10, seed=0)
    assert w.numel() == 62_006
    assert net(w, torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_functional_call_matches_module_and_init_is_seeded():
    net, w = build_network("lenet5", (1, 28, 28), 10, seed=3)
    _, w_again = build_network("lenet5", (1, 28, 28), 10, seed=3)
    _, w_other = build_network("lenet5", (1, 28, 28), 10, seed=4)
    assert torch.equal(w, w_again) and not torch.equal(w, w_other)
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(net(w, x), net.module(x))
    assert torch.equal(flatten_params(net.module, net.spec), w)
    layers = net.spec.layers()
    assert list(layers) == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert layers["fc3"] == slice(net.spec.embedding_size, net.spec.size)
