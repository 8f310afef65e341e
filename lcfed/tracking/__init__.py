"""MLflow tracking: the round observer that logs a federation run, and what sweeps, comparisons and
reproductions share with it (the store, experiments, tags, artifacts, the run guard, the replay of
metrics a gone store never took).

One idea per module; this package re-exports the names code imports from ``lcfed.tracking`` (the
modules of this package import from each other, never through this file):

- ``store``: the tracking URI, the lock around a local sqlite store, the client, experiments, a
  server's health;
- ``naming``: a run's default name (method, values set, data, seed) and each metric's key (its section);
- ``tags``: what ran (method, dataset, partition, seed), source tags (command, git commit, user) and
  numerics provenance tags;
- ``inputs``: a run's params (config, federation facts) and its dataset input (partition digest);
- ``rounds``: the points a round logs and the buffer that carries them through a store outage;
- ``system``: the system-metrics sampler;
- ``artifacts``: the CSVs, the accuracy figure and the call that logs them;
- ``models``: the final models as MLflow PyTorch models (:class:`StackedModels`);
- ``raw_input``: the model a user loads (:class:`RawInputModel`: stored samples in, the run's scaling
  inside), its signature, and the :class:`ModelBundle` a sweep's trial hands its driver;
- ``guard``: :class:`RunGuard`, which closes a run whose process died;
- ``unlogged``: the unlogged-metrics file and ``lcfed tracking replay``;
- ``ui``: the MLflow UI hint and the shared runs-table views;
- ``observer``: :class:`MLflowObserver`, which calls them in a run's order.

Importing this package loads neither MLflow nor matplotlib (Tune trials import it on worker nodes,
where MLflow is not installed): each module imports them inside the functions that log or draw. Nor torch:
a name is imported from its module on first use (a command that refuses its flags never loads torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lcfed.tracking.artifacts import (
        ROUND_AXIS,
        accuracy_figure,
        assignment_history_csv,
        devices_csv,
        history_csv,
        read_assignment_history,
    )
    from lcfed.tracking.guard import RunGuard
    from lcfed.tracking.inputs import dataset_input, federation_facts, log_dataset, partition_digest
    from lcfed.tracking.models import (
        StackedModels,
        bundle_models,
        final_modules,
        log_model,
        logging_models_to,
        model_bundle,
    )
    from lcfed.tracking.naming import metric_name, mlflow_key, run_name
    from lcfed.tracking.observer import MLflowObserver
    from lcfed.tracking.raw_input import SELECTORS, ModelBundle, RawInputModel, load_bundle, save_bundle
    from lcfed.tracking.store import (
        EXPERIMENT_KIND,
        HTTP_RETRY_BUDGET,
        STORE_LOCK_TIMEOUT_S,
        TrackingError,
        check_registry,
        check_tracking_store,
        get_or_create_experiment,
        open_client,
        resolve_tracking_uri,
        store_lock,
    )
    from lcfed.tracking.system import SYSTEM_METRICS_INTERVAL_S
    from lcfed.tracking.tags import git_commit, provenance_tags, run_tags, source_tags
    from lcfed.tracking.ui import SHARED_VIEW_TAG, share_view, ui_hint, view_url
    from lcfed.tracking.unlogged import read_unlogged, replay

#: each name of the face and the module that defines it
_WHERE = {
    "EXPERIMENT_KIND": "lcfed.tracking.store",
    "HTTP_RETRY_BUDGET": "lcfed.tracking.store",
    "MLflowObserver": "lcfed.tracking.observer",
    "ModelBundle": "lcfed.tracking.raw_input",
    "ROUND_AXIS": "lcfed.tracking.artifacts",
    "RawInputModel": "lcfed.tracking.raw_input",
    "RunGuard": "lcfed.tracking.guard",
    "SELECTORS": "lcfed.tracking.raw_input",
    "SHARED_VIEW_TAG": "lcfed.tracking.ui",
    "STORE_LOCK_TIMEOUT_S": "lcfed.tracking.store",
    "SYSTEM_METRICS_INTERVAL_S": "lcfed.tracking.system",
    "StackedModels": "lcfed.tracking.models",
    "TrackingError": "lcfed.tracking.store",
    "accuracy_figure": "lcfed.tracking.artifacts",
    "assignment_history_csv": "lcfed.tracking.artifacts",
    "bundle_models": "lcfed.tracking.models",
    "check_registry": "lcfed.tracking.store",
    "check_tracking_store": "lcfed.tracking.store",
    "dataset_input": "lcfed.tracking.inputs",
    "devices_csv": "lcfed.tracking.artifacts",
    "federation_facts": "lcfed.tracking.inputs",
    "final_modules": "lcfed.tracking.models",
    "get_or_create_experiment": "lcfed.tracking.store",
    "git_commit": "lcfed.tracking.tags",
    "history_csv": "lcfed.tracking.artifacts",
    "load_bundle": "lcfed.tracking.raw_input",
    "log_dataset": "lcfed.tracking.inputs",
    "log_model": "lcfed.tracking.models",
    "logging_models_to": "lcfed.tracking.models",
    "metric_name": "lcfed.tracking.naming",
    "mlflow_key": "lcfed.tracking.naming",
    "model_bundle": "lcfed.tracking.models",
    "open_client": "lcfed.tracking.store",
    "partition_digest": "lcfed.tracking.inputs",
    "provenance_tags": "lcfed.tracking.tags",
    "read_assignment_history": "lcfed.tracking.artifacts",
    "read_unlogged": "lcfed.tracking.unlogged",
    "replay": "lcfed.tracking.unlogged",
    "resolve_tracking_uri": "lcfed.tracking.store",
    "run_name": "lcfed.tracking.naming",
    "run_tags": "lcfed.tracking.tags",
    "save_bundle": "lcfed.tracking.raw_input",
    "share_view": "lcfed.tracking.ui",
    "source_tags": "lcfed.tracking.tags",
    "store_lock": "lcfed.tracking.store",
    "ui_hint": "lcfed.tracking.ui",
    "view_url": "lcfed.tracking.ui",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
