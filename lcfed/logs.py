"""Logging helpers shared by the library and the ``lcfed`` command: how much this process says.

A module of its own, importing only the standard library, so the job commands (``lcfed job ...``,
which load neither torch nor MLflow), the tracking package and the Ray layer use the same helpers.

The verbosity (:func:`set_verbosity`, from ``lcfed ... -q`` / ``-v``) is applied through each library's
own switches, never by filtering its text: MLflow's ``MLFLOW_LOGGING_LEVEL`` (read when MLflow is
imported) and ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` (its "View run" lines), the level of Ray's
driver logger and whether workers' output reaches the driver (``ray.init(logging_level=...,
log_to_driver=...)``: :func:`ray_init_options`), Tune's ``RunConfig(verbose=...)`` (:func:`tune_verbosity`)
with ``RAY_AIR_NEW_OUTPUT=0`` (Tune's newer console output prints its settings box and TensorBoard hint
at any verbosity), and for an MLflow server's own process uvicorn's log level and Python's warning
filters (:func:`server_environment`). Environment settings go into this process's environment, which the Ray
workers and the tracking server it starts inherit.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

QUIET, DEFAULT, VERBOSE = -1, 0, 1
"""``-q``: errors and the final summary; default: lcfed's own progress too; ``-v``: the libraries' chatter too."""

_verbosity = DEFAULT


@contextmanager
def quiet_logger(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """Logger ``name`` shows only records at ``level`` and above for the block, then its level is put back:
    for a library's chatter (notices, progress per file) where its real failures still raise."""
    log = logging.getLogger(name)
    previous = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(previous)


def verbosity() -> int:
    """This process's verbosity: :data:`QUIET`, :data:`DEFAULT` or :data:`VERBOSE`."""
    return _verbosity


def set_verbosity(level: int) -> None:
    """Set this process's verbosity (see the module's docstring); before MLflow and Ray are imported, so
    that their import-time settings follow it. By default an ``MLFLOW_*`` setting the user made stands;
    ``-q`` overrides it; ``-v`` leaves every library at its own default."""
    global _verbosity
    _verbosity = max(QUIET, min(VERBOSE, level))
    if _verbosity >= VERBOSE:
        return
    put = os.environ.__setitem__ if _verbosity == QUIET else os.environ.setdefault
    put("MLFLOW_LOGGING_LEVEL", "ERROR" if _verbosity == QUIET else "WARNING")
    put("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    if "mlflow" in sys.modules:  # imported already: its loggers were configured from the environment then
        logging.getLogger("mlflow").setLevel(os.environ["MLFLOW_LOGGING_LEVEL"].upper())


#: the environment settings :func:`set_verbosity` makes
VERBOSITY_ENV = ("MLFLOW_LOGGING_LEVEL", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "RAY_AIR_NEW_OUTPUT")


@contextmanager
def verbosity_scope(level: int) -> Iterator[None]:
    """:func:`set_verbosity` for the block, then the verbosity and the environment settings put back (a
    command run from Python, e.g. ``tune_jobs.cli.main`` in a test, leaves the process as it found it)."""
    global _verbosity
    saved = {key: os.environ.get(key) for key in VERBOSITY_ENV}
    previous = _verbosity
    set_verbosity(level)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _verbosity = previous
        if "mlflow" in sys.modules:
            logging.getLogger("mlflow").setLevel(os.environ.get("MLFLOW_LOGGING_LEVEL", "INFO").upper())


def ray_init_options() -> dict[str, Any]:
    """``ray.init`` options for this verbosity: Ray's driver logger at INFO (its default) and the workers'
    output forwarded with ``-v``; else errors only and worker output left in Ray's log files."""
    verbose = _verbosity >= VERBOSE
    return {"logging_level": logging.INFO if verbose else logging.ERROR, "log_to_driver": verbose}


def tune_verbosity() -> int:
    """Tune's ``RunConfig(verbose=...)``: 1 (its status) with ``-v``, else 0 (the sweep prints its own table)."""
    return 1 if _verbosity >= VERBOSE else 0


def progress_shown() -> bool:
    """Whether lcfed's own progress (bars, per-round lines, a sweep's table) is printed: not with ``-q``."""
    return _verbosity > QUIET


def server_environment() -> dict[str, str]:
    """Environment settings for an MLflow server process this one starts, but with ``-v``: uvicorn's log
    level (``MLFLOW_UVICORN_OPTS``, unless the user set it: warnings, or errors with ``-q``; its INFO lines
    include one per request) and no deprecation warnings (Starlette's, raised as the server's app imports
    it, once per worker). MLflow's own level comes with this process's environment (:func:`set_verbosity`)."""
    if _verbosity >= VERBOSE:
        return {}
    level = "error" if _verbosity == QUIET else "warning"
    # Starlette's deprecation warning is a UserWarning of its own class, which a warning filter in the environment
    # cannot name (it is read before site-packages are importable): it is filtered by the module it is raised
    # for, the MLflow server's app importing Starlette's deprecated WSGI middleware
    return {"MLFLOW_UVICORN_OPTS": os.environ.get("MLFLOW_UVICORN_OPTS", f"--log-level {level}"),
            "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::UserWarning:mlflow.server.fastapi_app"}
