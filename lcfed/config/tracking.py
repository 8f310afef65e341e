"""The ``tracking`` and ``checkpoint`` sections: where a run's records go (the MLflow store, the experiment
and run names, the summary) and where and how often its full state is saved, with the rules of the tracking
fields (:func:`check_tracking`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lcfed.errors import ConfigError, require

__all__ = ["CheckpointConfig", "TRACKING_SCHEMES", "TrackingConfig", "check_tracking", "uri_scheme"]


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking: where runs go and what they are called; how many evaluations the end-of-run
    summary averages (``summary_evals``; the table reproductions average 3 too); how long the end of a run
    waits for a tracking server that is gone (``end_wait_s``: a restart takes seconds)."""

    enabled: bool = True
    uri: str | None = None
    experiment: str = "lcfed"
    run_name: str | None = None
    summary_evals: int = 3
    end_wait_s: float = 30.0

    def validate(self, prefix: str = "tracking") -> None:
        check_tracking(self, prefix)


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often the run's full state is saved (server, devices, history)."""

    dir: str | None = None
    every: int = 1

    def validate(self, prefix: str = "checkpoint") -> None:
        require(self.every >= 1, f"{prefix}.every", self.every, "must be >= 1 (rounds between checkpoints)")


#: tracking-store URI schemes MLflow can log to
TRACKING_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")


def uri_scheme(uri: str) -> str:
    """The URI's scheme, lower-case and without a driver (``postgresql+psycopg2://`` -> ``postgresql``);
    ``""`` for a plain path."""
    return uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""


def check_tracking(tracking: TrackingConfig, prefix: str = "tracking") -> None:
    """``tracking.*``: the summary, the end-of-run wait, the experiment and run names, the store's URI."""
    require(tracking.summary_evals >= 1, f"{prefix}.summary_evals", tracking.summary_evals,
            "must be >= 1 (the summary averages the last N evaluations)")
    require(0 <= tracking.end_wait_s <= 3600, f"{prefix}.end_wait_s", tracking.end_wait_s,
            "must be in [0, 3600] seconds (how long the end of a run waits for a tracking server that is gone "
            "before it saves the unsent metrics for `lcfed tracking replay`)")
    require(bool(tracking.experiment), f"{prefix}.experiment", tracking.experiment, "must be a non-empty name")
    parts = tracking.experiment.split("/")
    require(
        len(tracking.experiment) <= 256 and tracking.experiment.isprintable() and "\\" not in tracking.experiment
        and all(part not in ("", ".", "..") for part in parts),
        f"{prefix}.experiment",
        tracking.experiment,
        "must be a name of at most 256 printable characters; '/' may separate parts, but no part may be "
        "empty, '.' or '..' (the name becomes a directory of the artifact store) and no backslash",
    )
    if tracking.run_name is not None:
        require(0 < len(tracking.run_name) <= 250 and tracking.run_name.isprintable(), f"{prefix}.run_name",
                tracking.run_name, "must be null (use the config's name) or 1-250 printable characters")
    if tracking.uri is not None:
        scheme = uri_scheme(tracking.uri)
        require(
            bool(tracking.uri.strip()) and (scheme == "" or scheme in TRACKING_SCHEMES),
            f"{prefix}.uri",
            tracking.uri,
            f"must be null ($MLFLOW_TRACKING_URI or ./mlflow.db) or a URI with scheme one of "
            f"{list(TRACKING_SCHEMES)}",
        )
        if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
            path = tracking.uri.split("://", 1)[-1]
            suggestion = f"sqlite:///{Path(path).expanduser().absolute()}" + ("" if path.endswith(".db") else "/mlflow.db")
            raise ConfigError(f"{prefix}.uri", tracking.uri,
                              "is a local path: MLflow's file store, which MLflow no longer writes to (maintenance "
                              f"mode): use a sqlite store such as {suggestion} or a tracking server "
                              "http://HOST:PORT (`lcfed mlflow-server`); MLFLOW_ALLOW_FILE_STORE=true keeps "
                              "the file store")
