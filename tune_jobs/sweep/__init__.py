"""``lcfed sweep``: Ray Tune over any config field, each trial a full federation.

One idea a module: ``objective`` (the metric and how the sweep searches, no Ray; its ``Objective`` is in
the Tune state of a HyperBand sweep), ``options`` (:class:`~tune_jobs.sweep.options.SweepOptions`: what
``lcfed sweep`` and ``lcfed compare`` share, their flags and their checks; the trial engine and its layout,
the storage, and the errors a sweep ends with; no Ray), ``space`` (the search-space file), ``search``
(Tune's searcher and scheduler), ``trial`` (the trainable, in Tune's workers: no MLflow), ``models`` (the
best trial's models, logged and registered), ``callbacks`` (MLflow child runs and the console, in the
driver), ``best`` (the best trial and the parent run's summary), ``figures``, ``run``
(:func:`~tune_jobs.sweep.run.run_sweep`) and ``command`` (``lcfed sweep``).

This package exports nothing: import each name from the module that defines it (``from
tune_jobs.sweep.run import run_sweep``); only what an old sweep's pickled Tune state names resolves here. It stays empty so that importing one of its modules loads
nothing else: neither the ``lcfed`` parser (which imports ``command``) nor a Tune worker (which imports
``trial``) may load Tune, MLflow or matplotlib through it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: what the Tune state of a sweep started before this package was split (one module, cd5345e) pickled under
#: the package's name, and where each lives now: resuming such a sweep unpickles these, and nothing else is
#: offered here
_PICKLED = {"run_trial": ("trial", "run_trial"), "TuneReporter": ("trial", "TuneReporter"),
            "TrialTracker": ("callbacks", "TrialTracker"), "SweepProgress": ("callbacks", "SweepProgress"),
            "_trial_error": ("callbacks", "trial_error"), "_best_result": ("best", "best_result"),
            "_trial_order": ("best", "trial_order")}


def __getattr__(name: str) -> Any:
    if name not in _PICKLED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _PICKLED[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
