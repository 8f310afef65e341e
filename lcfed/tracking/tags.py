"""Where a run's numbers come from, as run tags: the command, the code's git commit and the user (MLflow's
source tags), and the numerics provenance (``provenance.*``).

Separate from the observer because they describe the process, the checkout and the machine that
produced the numbers, not the federation being logged.
"""

from __future__ import annotations

import functools
import getpass
import subprocess
import sys
from pathlib import Path


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


def provenance_tags(provenance: dict[str, str]) -> dict[str, str]:
    """``provenance.<field>`` tags of :func:`lcfed.numerics.provenance`'s record (MLflow caps a tag at 8000 characters)."""
    return {f"provenance.{k}": str(v)[:8000] for k, v in provenance.items()}
