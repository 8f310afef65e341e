"""What a round moves, priced in bytes: every tensor and array a message or a broadcast holds
(:func:`tensor_bytes`), and the same split over the model's layers (:func:`layer_traffic`,
:func:`downlink_traffic`) for the per-layer communication that DC-PFL's schedule and the metrics count."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lcfed.learning.models import ParamSpec


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor/array reachable in ``obj`` (dataclasses, mappings, sequences)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(tensor_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def layer_traffic(spec: ParamSpec, obj: Any) -> dict[str, int]:
    """Bytes of ``obj`` per model layer (``spec.layers()`` names), the rest under ``"other"``.

    A 1-D tensor the size of the whole model, of the embedding or of the decision part is split
    over those layers; a 2-D tensor of such rows likewise, row by row; a mapping keyed by layer
    names counts each value under its layer. Codes, projections and anything else are ``"other"``.
    """
    out: dict[str, int] = {}
    layers = spec.layers()
    emb = spec.embedding_size
    parts = {
        spec.size: list(layers.items()),
        emb: [(n, sl) for n, sl in layers.items() if sl.stop <= emb],
        spec.decision_size: [(n, sl) for n, sl in layers.items() if sl.start >= emb],
    }

    def add(key: str, nbytes: int) -> None:
        if nbytes:
            out[key] = out.get(key, 0) + nbytes

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor) and o.dim() in (1, 2) and o.shape[-1] in parts and parts[o.shape[-1]]:
            rows = 1 if o.dim() == 1 else o.shape[0]
            for name, sl in parts[o.shape[-1]]:
                add(name, rows * (sl.stop - sl.start) * o.element_size())
        elif isinstance(o, (torch.Tensor, np.ndarray)):
            add("other", tensor_bytes(o))
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            for f in dataclasses.fields(o):
                walk(getattr(o, f.name))
        elif isinstance(o, Mapping):
            for k, v in o.items():
                if k in layers and isinstance(v, torch.Tensor):
                    add(str(k), tensor_bytes(v))
                else:
                    walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(obj)
    return out


def downlink_traffic(spec: ParamSpec, downlink: Sequence[tuple[Any, int]]) -> dict[str, int]:
    """Per-layer bytes of a plan's downlink: each object's traffic times its number of receivers."""
    out: dict[str, int] = {}
    for obj, count in downlink:
        for k, v in layer_traffic(spec, obj).items():
            out[k] = out.get(k, 0) + v * int(count)
    return out
