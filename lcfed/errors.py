"""The error a bad configuration value raises, and the check that raises it.

A leaf module (it imports nothing of lcfed): the methods validate their hyper-parameters with
:func:`require` without importing :mod:`lcfed.config`, which resolves method names through the
registry that imports the methods. :mod:`lcfed.config` re-exports both names; :func:`did_you_mean` completes their messages.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str) -> None:
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{printable(field_name)}: got {value!r}; {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its three fields, so it crosses processes (Ray tasks, Tune trials) intact
        return (type(self), (self.field, self.value, self.allowed))


def printable(text: str) -> str:
    """``text``, or with control characters escaped (``\\r``, ``\\x1f``) where it has any: a field name typed
    with them (a YAML key, a ``--set``) keeps the message on one line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def require(cond: bool, field_name: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` unless ``cond`` holds."""
    if not cond:
        raise ConfigError(field_name, value, allowed)


def did_you_mean(value: Any, choices: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean <prefix><closest>?"`` when ``value`` is a near miss of one of ``choices`` (a typo),
    else ``""``: appended to the message that refuses it."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


# The errors the ``lcfed`` command reports as one line (tune_jobs/cli.py), defined here, in a leaf, so the
# command catches them without importing torch, the data readers or MLflow; each is re-exported where it
# is raised.

class DataError(Exception):
    """A dataset's files are missing or unusable; the message says which and how to fix it."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or does not belong to this config."""


class TrackingError(RuntimeError):
    """The MLflow store could not take the run's data; nothing was dropped silently."""


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite; the run stops with this reason."""


class SweepFailed(RuntimeError):
    """No trial of the sweep produced the metric; the message says how many failed and why."""
