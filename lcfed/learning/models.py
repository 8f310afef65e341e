"""Models and their flat-parameter view.

Every method works on one flat float vector per model (aggregation, proximal terms, PCA), so a
model is described by a :class:`ParamSpec`: the named tensors in order, their offsets, and where the
embedding φ ends and the decision h (the last linear layer) begins.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.func import functional_call

from lcfed.learning.pooling import max_pool2


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max-pooling; 61,706 parameters for 1x28x28 input and 10 classes."""

    #: name of the decision layer h; everything before it is the embedding φ
    decision_layer = "fc3"

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> None:
        super().__init__()
        # 28x28 input is padded to LeNet's native 32x32 so both input sizes yield 16x5x5 features
        pad = 2 if image_size == 28 else 0
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=pad)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool2(torch.relu(self.conv1(x)))
        x = max_pool2(torch.relu(self.conv2(x)))
        x = x.flatten(1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class FedACCNN(nn.Module):
    """FedAC's convnet: two convolutions, three fully connected layers (Zhang et al., arXiv:2403.16460, §5.1).

    The paper gives only the layer counts, that the last linear layer is the decision h, and that
    the model has "over 4,700,000" parameters. Widths here: McMahan et al.'s FedAvg CNN convolutions
    (5x5, 32 then 64 channels, 'same' padding, each followed by 2x2 max-pooling), then 1024 -> 512 ->
    classes, which gives 4,778,954 parameters on 3x32x32 input with 10 classes (3,794,314 on 1x28x28).
    """

    decision_layer = "fc3"

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        side = image_size // 4  # two 2x2 poolings
        self.fc1 = nn.Linear(64 * side * side, 1024)
        self.fc2 = nn.Linear(1024, 512)
        self.fc3 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool2(torch.relu(self.conv1(x)))
        x = max_pool2(torch.relu(self.conv2(x)))
        x = x.flatten(1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class MLP(nn.Module):
    """A multilayer perceptron on any input (flattened): two hidden layers of ``hidden`` ReLU units and a
    linear decision layer ``head``; for feature vectors (tables, LEAF's Synthetic), and images at a pinch."""

    decision_layer = "head"

    def __init__(self, inputs: int, num_classes: int, hidden: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        return self.head(x)


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"{name} takes images (C, H, W), got inputs of shape {input_shape} "
                         "(feature vectors: model.name=mlp)")
    return int(input_shape[0]), int(input_shape[1]), int(input_shape[2])


def _lenet5(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """LeNet-5 (61,706 parameters on 1x28x28, 10 classes): 2 conv + 3 fc; decision layer fc3. 28x28 or 32x32."""
    channels, height, width = _image_shape("lenet5", input_shape)
    if height != width or height not in (28, 32):
        raise ValueError(f"lenet5 takes 28x28 or 32x32 input, got {height}x{width}")
    return LeNet5(channels, height, num_classes)


def _cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FedAC's CNN (4,778,954 parameters on 3x32x32): 2 conv + 3 fc; decision layer fc3. 28x28 or 32x32."""
    channels, height, width = _image_shape("cnn", input_shape)
    if height != width or height not in (28, 32):
        raise ValueError(f"cnn takes 28x28 or 32x32 input, got {height}x{width}")
    return FedACCNN(channels, height, num_classes)


def _mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """An MLP on any input shape (flattened): 2 hidden layers of 128 ReLU units; decision layer head."""
    return MLP(math.prod(input_shape), num_classes)


#: a model builder: (input_shape, num_classes) -> module with ``decision_layer``
Builder = Callable[[tuple[int, ...], int], nn.Module]

#: the built-in models: name -> builder (plugins' names are resolved by :func:`lcfed.registry.model`)
MODELS: dict[str, Builder] = {
    "lenet5": _lenet5,
    "cnn": _cnn,
    "mlp": _mlp,
}


@dataclass(frozen=True)
class ParamSpec:
    """Layout of a model's parameters in its flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    embedding_size: int

    @property
    def size(self) -> int:
        return self.offsets[-1] + _numel(self.shapes[-1]) if self.names else 0

    @property
    def decision_size(self) -> int:
        return self.size - self.embedding_size

    def layers(self) -> dict[str, slice]:
        """Flat slice of each layer (parameters grouped by module prefix, e.g. ``conv1``)."""
        out: dict[str, slice] = {}
        for name, shape, off in zip(self.names, self.shapes, self.offsets, strict=True):
            layer = name.rsplit(".", 1)[0]
            start = out[layer].start if layer in out else off
            out[layer] = slice(start, off + _numel(shape))
        return out

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``flat`` shaped as the model's named parameters."""
        # one split (a C call) rather than a slice per parameter: this runs on every forward pass
        parts = flat.split(self.sizes)
        return {name: part.view(shape) for name, part, shape in zip(self.names, parts, self.shapes, strict=True)}

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        """Each parameter's length in the flat vector."""
        return tuple(_numel(shape) for shape in self.shapes)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def param_spec(model: nn.Module) -> ParamSpec:
    """The flat layout of ``model``; the decision part is its ``decision_layer``, placed last."""
    decision = getattr(model, "decision_layer", None)
    named = list(model.named_parameters())
    if decision is None:
        raise ValueError(f"{type(model).__name__} must declare decision_layer")
    emb = [(n, p) for n, p in named if not n.startswith(decision + ".")]
    dec = [(n, p) for n, p in named if n.startswith(decision + ".")]
    if not dec:
        raise ValueError(f"{type(model).__name__}.decision_layer={decision!r} names no parameters")
    names, shapes, offsets = [], [], []
    off = 0
    for n, p in emb + dec:
        names.append(n)
        shapes.append(tuple(p.shape))
        offsets.append(off)
        off += p.numel()
    embedding_size = sum(p.numel() for _, p in emb)
    return ParamSpec(tuple(names), tuple(shapes), tuple(offsets), embedding_size)


def flatten_params(model: nn.Module, spec: ParamSpec) -> torch.Tensor:
    """The model's parameters as one flat float32 vector in ``spec`` order."""
    params = dict(model.named_parameters())
    return torch.cat([params[n].detach().reshape(-1) for n in spec.names]).float().clone()


class Model(Protocol):
    """What device-side code calls: logits of a model at flat weights ``flat`` on inputs ``x``
    (a :class:`Network`, or :class:`lcfed.learning.vectorized.BatchedNet`, which batches gradients)."""

    def __call__(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...


@dataclass
class Network:
    """A model skeleton evaluated functionally at any flat parameter vector."""

    module: nn.Module
    spec: ParamSpec

    def __call__(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, self.spec.unflatten(flat), (x,))


def build_network(model: str | Builder, input_shape: tuple[int, ...], num_classes: int, seed: int,
                  name: str = "") -> tuple[Network, torch.Tensor]:
    """The model skeleton and its seeded initial flat weights (identical on every process).

    ``model`` is a built-in's name (:data:`MODELS`) or a builder: a plugin's comes from
    :func:`lcfed.registry.model` (as :func:`lcfed.run.sources.network` resolves ``model.name``); ``name``
    is what an error calls it."""
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown built-in model {model!r}: one of {sorted(MODELS)} "
                             "(a plugin's builder comes from lcfed.registry.model)")
        builder, name = MODELS[model], name or model
    else:
        builder, name = model, name or getattr(model, "__name__", "model")
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only: torch.manual_seed also queues a seeding of each accelerator not yet started (and
        # a formatted stack with it, ~5 ms a call), which fork_rng(devices=[]) would not undo
        torch.default_generator.manual_seed(seed)
        module = builder(input_shape, num_classes)  # (C, H, W) or (F,)
    if not isinstance(module, nn.Module):
        raise ValueError(f"model {name!r} built a {type(module).__name__}, not a torch.nn.Module")
    spec = param_spec(module)
    init = flatten_params(module, spec)
    return Network(module.requires_grad_(False), spec), init
