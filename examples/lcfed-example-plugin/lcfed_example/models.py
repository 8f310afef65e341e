"""A model plugin: a builder (input_shape, num_classes) -> nn.Module that names its decision layer."""

from __future__ import annotations

import math

from torch import nn


class MLP(nn.Module):
    decision_layer = "head"  # the last linear layer: LCFed-style methods share the rest (the embedding)

    def __init__(self, inputs: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """One hidden layer of 64 on any input shape (lcfed's built-in ``mlp`` has two of 128)."""
    return MLP(math.prod(input_shape), 64, num_classes)
