"""Where Tune keeps a sweep (``--storage``): a path on this machine, or a URI every node reaches; and how many
checkpoints each trial keeps there (``--keep-checkpoints``)."""

from __future__ import annotations

from pathlib import Path

from lcfed.errors import require

#: where Tune keeps sweeps unless --storage says: under the working directory's outputs/, which the
#: project's .gitignore covers (relative: made absolute when the sweep starts)
DEFAULT_STORAGE = "outputs/sweeps"
#: checkpoints each trial keeps (Tune's CheckpointConfig.num_to_keep): the latest, and the one before it in
#: case the latest was being written when the sweep stopped
DEFAULT_KEEP_CHECKPOINTS = 2


def check_keep(keep: int) -> None:
    """``--keep-checkpoints``: at least 1 (a trial resumes from its latest checkpoint)."""
    require(isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1, "--keep-checkpoints", keep,
            "must be an integer >= 1 (each trial's latest checkpoints kept)")


def storage_location(storage: str | Path) -> str:
    """A URI (``s3://``, ``gs://``, ``file://``, ...) goes to Tune as it is; a path is made absolute."""
    text = str(storage)
    if "://" in text:
        return text
    return str(Path(text).expanduser().resolve())


def experiment_path(storage: str, name: str) -> str:
    """``storage``/``name`` for a path or a URI (a query string stays at the end): where Tune keeps the
    sweep ``name``."""
    head, sep, query = storage.partition("?")
    return f"{head.rstrip('/')}/{name}{sep}{query}"


def check_storage(storage_uri: str) -> None:
    """On a multi-node cluster, trials on other nodes write their checkpoints to the storage: a plain
    local path is this node's disk only. ``file://`` says the path is a filesystem every node mounts."""
    import ray  # here: the lcfed parser reads this module's defaults, and loads no Ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    require(nodes == 1 or "://" in storage_uri, "--storage", storage_uri,
            f"must be a URI every one of the cluster's {nodes} nodes reaches (s3://bucket/prefix, gs://...), "
            "or file:///path on a filesystem all nodes mount")
