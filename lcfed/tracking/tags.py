"""A run's tags: what ran (method, dataset, partition, seed: the runs table groups by them), and where its
numbers come from: the command, the code's git commit and the user (MLflow's source tags), and the
numerics provenance (``provenance.numerics`` and ``.fingerprint``; the whole record is an artifact).

Separate from the observer because sweeps and comparisons tag their parent runs with them too, and the
source and provenance tags describe the process, the checkout and the machine, not the federation.
"""

from __future__ import annotations

import functools
import getpass
import subprocess
import sys
from pathlib import Path
from typing import Any

from lcfed.tracking.naming import data_label, devices_label


@functools.cache
def git_commit(where: str | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``where`` (default: this package); None when
    it is not a git checkout or git is missing."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where or Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out if len(out) == 40 else None


def run_tags(cfg: Any, seed: bool = True) -> dict[str, str]:
    """``method``, ``dataset``, ``partition`` (as the run name shows it: ``dir0.15``, ``path2``, ...) and
    ``seed`` of a config: columns to group the MLflow runs table by. ``seed=False``: not the seed (a parent
    run whose children differ in it)."""
    tags = {"method": str(cfg.method.name), "dataset": str(cfg.data.dataset),
            "partition": data_label(cfg).split(" ", 1)[1]}
    devices = devices_label(cfg)
    if devices:
        tags["devices"] = devices
    if seed:
        tags["seed"] = str(cfg.seed)
    return tags


def source_tags() -> dict[str, str]:
    """MLflow's source tags, which its fluent API sets and an explicit client does not: the command
    (``mlflow.source.name``, ``.type``), the code's git commit when it runs from a checkout, the user."""
    from mlflow.utils import mlflow_tags as mt  # MLflow only when a run is created (never on Tune workers)

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python"
    tags = {mt.MLFLOW_SOURCE_NAME: argv0, mt.MLFLOW_SOURCE_TYPE: "LOCAL"}
    commit = git_commit()
    if commit:
        tags[mt.MLFLOW_GIT_COMMIT] = commit
    try:
        tags[mt.MLFLOW_USER] = getpass.getuser()
    except Exception:  # no user name in the environment (e.g. a container's uid without passwd entry)
        pass
    return tags


#: the provenance fields a run carries as tags (the whole record is its ``provenance.json``): what decides
#: whether two runs' numbers may differ, searchable without crowding the run page's tags
PROVENANCE_TAGS = ("numerics", "fingerprint")


def provenance_tags(provenance: dict[str, str]) -> dict[str, str]:
    """``provenance.<field>`` tags of :func:`lcfed.numerics.provenance.record`'s record, the fields of
    :data:`PROVENANCE_TAGS` only (MLflow caps a tag at 8000 characters)."""
    return {f"provenance.{k}": str(provenance[k])[:8000] for k in PROVENANCE_TAGS if k in provenance}
