"""The logged models as a user calls them: :class:`RawInputModel` takes samples as the dataset stores them
and applies the run's own standardization inside, so a prediction on raw test images is the run's own;
its MLflow signature and input example; and :class:`ModelBundle`, what rebuilds a run's models in another
process (a sweep's driver, from the trial's last checkpoint).

Separate from :mod:`lcfed.tracking.models` (which builds the modules and logs them) because the wrapper is
what users load back, wherever ``mlflow.pytorch`` or ``mlflow.pyfunc`` runs, and the bundle is written by
Tune trials, which never import MLflow (imported here only inside :func:`signature`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcfed.data.sources import Scaling
from lcfed.run import checkpoint

#: the pyfunc param (and ``forward`` keyword) that picks one model of a stack, by the stack's logged name;
#: not ``device``: MLflow's PyTorch flavour reserves that name for where the model runs
SELECTORS = {"personal": "device_id", "clusters": "cluster"}


class RawInputModel(torch.nn.Module):
    """Samples as the dataset stores them in, logits out (``.argmax(1)``: the classes).

    Images are uint8 ``(N, C, H, W)`` in 0..255, feature vectors float32 ``(N, F)``; the run's
    standardization (``mean`` / ``std``, the training pool's, :class:`lcfed.data.Scaling`) is applied
    inside, exactly as the run applied it, so its predictions on raw test samples are the run's own.
    Any other dtype is refused rather than scaled a second time. ``net`` is the network, or for
    ``personal`` / ``clusters`` a :class:`lcfed.tracking.StackedModels` whose model is picked by
    ``device_id=`` / ``cluster=`` (pyfunc: ``params={"device_id": 3}``).
    """

    # pickled with the logged model: the name users' loaders find it by (``lcfed.tracking`` re-exports it)
    __module__ = "lcfed.tracking"

    def __init__(self, net: Any, scaling: Scaling, input_shape: tuple[int, ...], select: str | None = None) -> None:
        """``input_shape``: one stored sample's, (C, H, W) for images or (F,) for features."""
        super().__init__()
        self.net = net
        self.input_shape = tuple(int(n) for n in input_shape)
        self.images = len(self.input_shape) == 3
        self.select = select
        shape = (1, -1, 1, 1) if self.images else (1, -1)
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.tensor(scaling.mean, dtype=torch.float32).view(shape))
        self.register_buffer("std", torch.tensor(scaling.std, dtype=torch.float32).view(shape))
        # the stack's logged names (device_<d>, cluster_<k>) -> its rows
        self.rows = {int(n.rsplit("_", 1)[1]): i for i, n in enumerate(net.names)} if select else {}

    @property
    def expects(self) -> str:
        return "uint8 images (N, C, H, W) in 0..255" if self.images else "float32 feature vectors (N, F)"

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """Stored samples -> the network's inputs: ``(x / 255 - mean) / std`` for images, ``(x - mean) / std``
        for features, in float32 as the run computed them."""
        want = torch.uint8 if self.images else torch.float32
        if x.dtype != want:
            raise TypeError(f"this model takes samples as the dataset stores them, {self.expects}, and "
                            f"standardizes them itself; got {x.dtype} {tuple(x.shape)}")
        t = x.to(self.mean.device).float()
        if self.images:
            t = t / 255.0
        return (t - self.mean) / self.std

    def forward(self, x: torch.Tensor, device_id: int | None = None, cluster: int | None = None) -> torch.Tensor:
        picked = {"device_id": device_id, "cluster": cluster}
        given = [k for k, v in picked.items() if v is not None]
        if self.select is None:
            if given:
                raise ValueError(f"this model is a single model: no {given[0]}")
            return self.net(self.preprocess(x))
        which = picked[self.select]
        if which is None or set(given) != {self.select}:
            raise ValueError(f"this model holds {len(self.rows)} models: pass {self.select}=<id> "
                             f"(pyfunc: params={{'{self.select}': <id>}}), one of {self._ids()}")
        row = self.rows.get(int(which))
        if row is None:
            raise ValueError(f"{self.select} {which} is not one of the model's {self._ids()}")
        return self.net(self.preprocess(x), row)

    def _ids(self) -> str:
        ids = sorted(self.rows)
        return f"{ids[0]}..{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else str(ids)

    def example(self) -> tuple[np.ndarray, dict[str, int]]:
        """A blank sample of the stored shape and dtype, and the params that pick the first model: the
        logged input example (no device's sample: raw data never leaves its device)."""
        x = np.zeros((1, *self.input_shape), dtype=np.uint8 if self.images else np.float32)
        return x, ({self.select: min(self.rows)} if self.select else {})


def signature(model: RawInputModel) -> Any:
    """The model's MLflow signature: the stored samples' tensor in (batch dimension -1), the float32 outputs
    (logits, or the embedding's features) out, and the param that picks a stacked model (no default)."""
    from mlflow.models.signature import ModelSignature  # MLflow only when a model is logged
    from mlflow.types.schema import ParamSchema, ParamSpec, Schema, TensorSpec

    x, params = model.example()
    with torch.no_grad():
        out = model(torch.from_numpy(x), **params)
    inputs = Schema([TensorSpec(x.dtype, (-1, *x.shape[1:]))])
    outputs = Schema([TensorSpec(np.dtype(np.float32), (-1, *out.shape[1:]))])
    if model.select is None:
        return ModelSignature(inputs, outputs)
    return ModelSignature(inputs, outputs, ParamSchema([ParamSpec(model.select, "long", None)]))


@dataclass(frozen=True)
class ModelBundle:
    """What rebuilds a finished run's logged models: the server's model tensors (``weights``, ``centers``,
    ``embedding``: :data:`lcfed.run.result.SERVER_MODELS`), each device's personalized weights, the sample shape,
    the classes and the run's :class:`Scaling`. A Tune trial writes it beside its last checkpoint."""

    server: dict[str, torch.Tensor]
    personal: dict[int, torch.Tensor]
    input_shape: tuple[int, ...]
    num_classes: int
    scaling: Scaling


def save_bundle(path: str | Path, bundle: ModelBundle) -> Path:
    """Written as a checkpoint's content is (tensors and plain data, read back without pickle)."""
    path = Path(path)
    torch.save(checkpoint.encode(bundle), path)
    return path


def load_bundle(path: str | Path) -> ModelBundle:
    bundle = checkpoint.decode(torch.load(path, map_location="cpu", weights_only=True))
    if not isinstance(bundle, ModelBundle):
        raise checkpoint.CheckpointError(f"{path} holds no final models")
    return bundle
