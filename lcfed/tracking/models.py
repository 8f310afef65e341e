"""The final models as MLflow PyTorch models: the server state's vectors turned back into modules
(:class:`StackedModels` for several of one architecture), each wrapped to take stored samples
(:class:`lcfed.tracking.raw_input.RawInputModel`) and handed to ``mlflow.pytorch`` with its signature.

Separate from the observer because turning flat weight vectors into loadable modules is its own idea
(the class also has to load back wherever ``mlflow.pytorch.load_model`` runs), and because the observer
only decides whether and when to log them. ``mlflow.pytorch`` is imported inside the functions that log.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from lcfed.config import ExperimentConfig
from lcfed.learning.models import ParamSpec
from lcfed.logs import quiet_logger
from lcfed.methods.round import Federation
from lcfed.run.contracts import MAX_PERSONAL_BYTES
from lcfed.run.result import SERVER_MODELS, FinalModels, RunResult
from lcfed.tracking.raw_input import SELECTORS, ModelBundle, RawInputModel, signature


def _module(skeleton: Any, spec: ParamSpec, flat: Any) -> Any:
    """A copy of ``skeleton`` holding the flat weights ``flat`` (in eval mode)."""
    module = copy.deepcopy(skeleton)
    with torch.no_grad():
        for name, value in spec.unflatten(flat.detach().float().cpu()).items():
            module.get_parameter(name).copy_(value)
    return module.requires_grad_(False).eval()


class StackedModels(torch.nn.Module):
    """Several models of one architecture in one module (what ``models/clusters`` and
    ``models/personal`` hold): ``m(x, i)`` is model ``i``'s logits, ``m.module(i)`` a standalone copy
    of it, ``m.names[i]`` its name (``device_<d>``, ``cluster_<k>``), ``m.weights`` the (n, parameters)
    flat weights."""

    # the logged models are pickles that name this class by module: keep the name they have always had
    # (``lcfed.tracking`` re-exports it), so models logged before and after the split load alike
    __module__ = "lcfed.tracking"

    def __init__(self, skeleton: Any, spec: ParamSpec, weights: Any, names: Sequence[str]) -> None:
        super().__init__()
        self.skeleton = copy.deepcopy(skeleton).requires_grad_(False).eval()
        self.spec = spec
        self.weights: torch.Tensor
        self.register_buffer("weights", weights.detach().float().cpu().clone())
        self.names = tuple(names)

    def __len__(self) -> int:
        return int(self.weights.shape[0])

    def forward(self, x: Any, index: int = 0) -> Any:
        return functional_call(self.skeleton, self.spec.unflatten(self.weights[index]), (x,))

    def module(self, index: int) -> Any:
        return _module(self.skeleton, self.spec, self.weights[index])


def final_modules(skeleton: Any, spec: ParamSpec, state: Any) -> dict[str, Any]:
    """The server state's models (:data:`SERVER_MODELS` fields) as modules: a full-size vector
    (``weights``) as the model itself, rows of them (``centers``) as :class:`StackedModels`, the
    embedding part (``embedding``) as the model with an identity for its decision layer."""
    out: dict[str, Any] = {}
    for field_name, name in SERVER_MODELS.items():
        value = getattr(state, field_name, None)
        if not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 1 and value.numel() == spec.size:
            out[name] = _module(skeleton, spec, value)
        elif value.dim() == 2 and value.shape[1] == spec.size:
            out[name] = StackedModels(skeleton, spec, value, [f"cluster_{k}" for k in range(value.shape[0])])
        elif value.dim() == 1 and value.numel() == spec.embedding_size:
            full = torch.cat([value.detach().float().cpu(), torch.zeros(spec.decision_size)])
            module = _module(skeleton, spec, full)
            setattr(module, getattr(skeleton, "decision_layer", "fc3"), torch.nn.Identity())
            out[name] = module
    return out


def server_models(state: Any) -> dict[str, torch.Tensor]:
    """The server state's :data:`SERVER_MODELS` fields that hold tensors (on the CPU)."""
    out = {}
    for field_name in SERVER_MODELS:
        value = getattr(state, field_name, None)
        if isinstance(value, torch.Tensor):
            out[field_name] = value.detach().cpu()
    return out


def model_bundle(fed: Federation, final: FinalModels) -> ModelBundle:
    """What :func:`bundle_models` rebuilds a run's logged models from; ``personal`` only up to
    :data:`MAX_PERSONAL_BYTES`, as logged."""
    if not fed.input_shape or fed.scaling is None:
        raise ValueError("the federation does not say its samples' shape and scaling: no models to log")
    personal = final.personal if len(final.personal) * fed.spec.size * 4 <= MAX_PERSONAL_BYTES else {}
    return ModelBundle(server_models(final.server_state), {int(d): w.detach().cpu() for d, w in personal.items()},
                       tuple(fed.input_shape), fed.num_classes, fed.scaling)


def bundle_models(cfg: ExperimentConfig, b: ModelBundle) -> dict[str, RawInputModel]:
    """Name -> the model a user loads (:class:`RawInputModel`: stored samples in, the run's scaling inside):
    :func:`final_modules` of the server's models and the personalized models as ``personal``, a stack
    addressed by device id."""
    from lcfed.run.sources import network  # the data layer, loaded when models are logged

    net, _ = network(cfg, tuple(b.input_shape), b.num_classes)
    modules = final_modules(net.module, net.spec, SimpleNamespace(**b.server))
    if b.personal:
        devices = sorted(b.personal)
        modules["personal"] = StackedModels(net.module, net.spec, torch.stack([b.personal[d] for d in devices]),
                                            [f"device_{d}" for d in devices])
    return {name: RawInputModel(m, b.scaling, b.input_shape, SELECTORS.get(name)).eval() for name, m in modules.items()}


def run_models(fed: Federation, cfg: ExperimentConfig, result: RunResult) -> dict[str, RawInputModel]:
    """Name -> model of everything a finished run logs (:func:`bundle_models`)."""
    assert result.models is not None
    return bundle_models(cfg, model_bundle(fed, result.models))


@contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to ``uri`` for the block (``mlflow.pytorch.log_model``
    takes no client), then put back as it was, ``$MLFLOW_TRACKING_URI`` included (MLflow's own
    helper unsets that variable on the way out)."""
    import mlflow  # MLflow only when models are logged (never on Tune workers)
    from mlflow.tracking._tracking_service import utils

    old, env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(old)  # type: ignore[arg-type]
        if env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env


@contextmanager
def logging_models_to(uri: str) -> Iterator[None]:
    """The block in which :func:`log_model` calls go to the store ``uri`` (MLflow's global URI, put back
    after), without ``mlflow.pytorch``'s notice about the pickle format for every model."""
    with _global_tracking_uri(uri), quiet_logger("mlflow.pytorch"):
        yield


def log_model(run_id: str, name: str, module: RawInputModel, step: int, method: str) -> str:
    """Log ``module`` as MLflow PyTorch model ``name`` of the run (pickled with the versions of torch and
    numpy as its requirements, its :func:`signature` and a blank input example, tagged with its name and the
    method); its ``models:/`` URI. Loads with ``mlflow.pytorch.load_model`` and ``mlflow.pyfunc.load_model``.
    Call it inside :func:`logging_models_to`."""
    import mlflow.pytorch  # MLflow only when models are logged (never on Tune workers)

    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"]
    x, params = module.example()
    tags = {"lcfed.model": name, "method": method}
    # the logged model is created in its run's experiment: given only a run id, MLflow 3 puts it in the
    # default experiment (no active one here), where neither the run page nor the Models tab lists it and
    # its files go under ./mlruns whatever store is configured
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    logged = client.create_logged_model(
        experiment_id=run.info.experiment_id, name=name, source_run_id=run_id, tags=tags,
        params={k: str(v) for k, v in run.data.params.items()}, model_type=None)
    with _pins_checked_alone(("torch", "numpy")):
        info = mlflow.pytorch.log_model(module, name=name, run_id=run_id, model_id=logged.model_id,
                                        pip_requirements=requirements, serialization_format="pickle", step=step,
                                        signature=signature(module), input_example=(x, params) if params else x,
                                        tags=tags)
    return str(info.model_uri)


@contextmanager
def _pins_checked_alone(packages: tuple[str, ...]) -> Iterator[None]:
    """MLflow checks a logged model's requirements against the installed packages through a map of every
    installed distribution's modules (``importlib_metadata.packages_distributions``: every file of every
    package read, 2-4 s in a CUDA torch environment, once per process). The requirements here are pins of
    ``packages`` taken from the running versions, so inside this block the map holds only those; it is put
    back unbuilt after, for any other caller in the process to build whole."""
    from mlflow.utils import requirements_utils

    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", False) is not None:
        yield  # already built (or MLflow keeps it elsewhere): nothing to save
        return
    requirements_utils._MODULES_TO_PACKAGES = {name: [name] for name in packages}  # type: ignore[assignment]
    try:
        yield
    finally:
        requirements_utils._MODULES_TO_PACKAGES = None
        requirements_utils._PACKAGES_TO_MODULES = None
