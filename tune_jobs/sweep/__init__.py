"""``lcfed sweep``: Ray Tune over any config field, each trial a full federation (:func:`run_sweep`).

One idea a module: ``objective`` (the metric and how the sweep searches, no Ray), ``placement`` (the trial
engine and its layout, no Ray), ``space`` (the search-space file), ``search`` (Tune's searcher and
scheduler), ``trial`` (the trainable, in Tune's workers: no MLflow), ``storage``, ``models`` (the best trial's models, logged and registered), ``callbacks`` (MLflow
child runs and the console, in the driver), ``best`` (the best trial and the parent run's summary),
``figures``, ``errors``, ``options`` (:class:`SweepOptions`: what ``lcfed sweep`` and ``lcfed compare`` share, their
flags and their checks, no Ray), ``run`` (:func:`run_sweep`) and ``command`` (``lcfed sweep``).

The names below are importable from here as before the package was split. They load on first use (PEP
562): importing a module of this package runs this file first, and neither the ``lcfed`` parser (which
imports ``command``) nor a Tune worker (which imports ``trial``) may load Tune, MLflow or matplotlib
through it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: module -> the names it gives this package
_HOMES = {
    "objective": ("METRIC", "SCHEDULERS", "SEARCHES", "SEARCH_LIBRARIES", "Objective",
                  "resolve_objective"),
    "placement": ("trial_engines", "resolve_trial_engine", "trial_layout", "local_trial_cpus"),
    "space": ("SPACES_DIR", "DOMAINS", "FLOAT_DOMAINS", "INTEGER_DOMAINS", "load_space", "domain_extremes",
              "check_draw_type", "space_spec", "describe_domain", "swept_keys"),
    "search": ("check_search", "make_search", "make_scheduler"),
    "trial": ("REPORT_KEY", "MODELS_FILE", "TuneReporter", "device_accuracies", "trial_config", "trial_resources", "load_sources",
              "run_trial"),
    "storage": ("DEFAULT_STORAGE", "DEFAULT_KEEP_CHECKPOINTS", "check_keep", "storage_location", "check_storage"),
    "options": ("SweepOptions", "SWEEP_FLAGS", "add_sweep_options", "sweep_options"),
    "models": ("REGISTERED", "log_best_models", "register_run", "register_sweep_best", "model_uris", "prune_models"),
    "callbacks": ("TrialTracker", "SweepProgress", "child_name", "short_names", "trial_index"),
    "best": ("best_result", "trial_order"),
    "figures": ("comparable_values", "mu_lambda_figure", "assignment_figure"),
    "errors": ("SweepFailed", "SweepInterrupted"),
    "run": ("run_sweep", "restore_results", "view_key", "forward_signals_to_tune"),
    "command": ("add_parser", "cmd_sweep"),
}
#: names of the single module this package was, now under another name; the Tune state of a sweep started
#: before the split names ``_trial_error`` (it pickles the callbacks), so resuming that sweep needs it
_RENAMED = {"_best_result": ("best", "best_result"), "_trial_order": ("best", "trial_order"),
            "_trial_error": ("callbacks", "trial_error")}

_WHERE = {name: (module, name) for module, names in _HOMES.items() for name in names} | _RENAMED
__all__ = sorted(name for names in _HOMES.values() for name in names)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _WHERE[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value  # found here directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
