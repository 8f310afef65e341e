"""The unlogged-metrics file: written when the store is gone at the end of a run, read back and sent to
the run by ``lcfed tracking replay``.

Separate from the observer so that the file's format is written and checked in one place, and so the
replay command needs nothing of a run but the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lcfed.config import TrackingConfig
from lcfed.errors import ConfigError, require
from lcfed.tracking.store import METRICS_PER_BATCH


def write_unlogged(uri: str, run_id: str, points: Sequence[Any]) -> Path:
    """Save MLflow metric points the store never took to ``unlogged-metrics-<run>.json`` in the working
    directory (``{tracking_uri, run_id, metrics: [[key, value, ts, step], ...]}``); the file's path."""
    dump = Path(f"unlogged-metrics-{run_id}.json").resolve()
    dump.write_text(json.dumps({"tracking_uri": uri, "run_id": run_id,
                                "metrics": [[m.key, m.value, m.timestamp, m.step] for m in points]}))
    return dump


def read_unlogged(path: str | Path) -> dict[str, Any]:
    """A dump of unlogged metrics, checked: ``{tracking_uri, run_id, metrics: [[key, value, ts, step], ...]}``.
    Anything else is a :class:`ConfigError` naming the file and what is wrong."""
    what = "must be an unlogged-metrics-<run>.json file that a run wrote when its tracking store was gone"
    p = Path(path)
    require(p.is_file(), "FILE", str(path), what)
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("FILE", str(path), f"{what} (not UTF-8 JSON: {exc})") from None
    require(isinstance(data, dict) and {"tracking_uri", "run_id", "metrics"} <= set(data), "FILE", str(path),
            f"{what} (an object with tracking_uri, run_id and metrics)")
    require(isinstance(data["run_id"], str) and bool(data["run_id"]), "FILE", str(path), f"{what} (run_id: a string)")
    require(isinstance(data["tracking_uri"], str), "FILE", str(path), f"{what} (tracking_uri: a string)")
    try:
        TrackingConfig(uri=data["tracking_uri"]).validate()
    except ConfigError as exc:
        raise ConfigError("FILE", str(path), f"tracking_uri {exc.value!r}: {exc.allowed}") from None
    rows = data["metrics"]
    require(isinstance(rows, list) and all(
        isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r[1:]) for r in rows),
        "FILE", str(path), f"{what} (metrics: a list of [key, value, timestamp, step])")
    return data


def replay(path: str | Path, finish: bool = True) -> tuple[str, int]:
    """Send a file of unlogged metrics (written when the store was gone at the end of a run) to its
    run; mark the run FINISHED unless told not to. Returns (run id, points sent)."""
    import mlflow  # MLflow only for the replay command
    from mlflow.entities import Metric  # (the same)

    data = read_unlogged(path)
    client = mlflow.MlflowClient(tracking_uri=data["tracking_uri"])
    points = [Metric(str(k), float(v), int(ts), int(step)) for k, v, ts, step in data["metrics"]]
    for start in range(0, len(points), METRICS_PER_BATCH):
        client.log_batch(data["run_id"], metrics=points[start : start + METRICS_PER_BATCH])
    if finish:
        client.set_terminated(data["run_id"], "FINISHED")
    return str(data["run_id"]), len(points)
