"""Per-round metrics on their way to the store: the points one round logs, and the buffer that keeps
them while a tracking server is gone, so that training never waits on tracking.

Separate from the observer because outage handling is its own small state machine (sending, buffering
with one warning, saving what is left for ``lcfed tracking replay``) that the observer only feeds and
asks to flush.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lcfed.learning.metrics import cluster_sizes
from lcfed.run.metric_catalog import LAYER_FAMILIES, order_key
from lcfed.tracking.naming import mlflow_key
from lcfed.tracking.store import METRICS_PER_BATCH, reachable
from lcfed.tracking.unlogged import write_unlogged

#: seconds between two asks of a tracking server that is gone at the end of a run
POLL_S = 1.0


def round_points(rnd: int, metrics: dict[str, float], assignment: np.ndarray | None, method_params: Any) -> list[Any]:
    """Round ``rnd``'s metrics as MLflow points (step = round; ``round`` itself, non-finite values and the
    per-layer traffic, logged as a table at the end, left out), with ``cluster_size_<c>`` for every cluster
    of ``assignment`` (at least the method's ``num_clusters``, empty ones as 0), each under its section's key
    (:func:`~lcfed.tracking.naming.mlflow_key`), in the catalogue's order: accuracy first."""
    from mlflow.entities import Metric  # MLflow only where a run is logged (never on Tune workers)

    ts = int(time.time() * 1000)
    values = {k: v for k, v in metrics.items() if k != "round" and not k.startswith(LAYER_FAMILIES)}
    if assignment is not None:
        k = getattr(method_params, "num_clusters", int(assignment.max()) + 1)
        for c, size in enumerate(cluster_sizes(assignment, max(k, int(assignment.max()) + 1))):
            values[f"cluster_size_{c}"] = float(size)
    return [Metric(mlflow_key(k), float(v), ts, rnd) for k, v in sorted(values.items(), key=lambda kv: order_key(kv[0]))
            if np.isfinite(v)]


class MetricBuffer:
    """Metric points not yet accepted by the store ``uri``; :meth:`flush` sends them to one run."""

    def __init__(self, client: Any, uri: str) -> None:
        self.client = client
        self.uri = uri
        self.points: list[Any] = []
        self.unreachable_since = 0.0  # when the store stopped taking points (0: it takes them)
        self.unlogged: Path | None = None  # where the points the store never took were saved

    def add(self, points: list[Any]) -> None:
        self.points.extend(points)

    def flush(self, run_id: str, final: bool, wait_s: float = 0.0, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Send buffered metrics; True once the store has them all. While the store is unreachable they
        stay buffered (training goes on, one warning). At the end (``final``) a store that is gone gets up
        to ``wait_s`` seconds to come back (:meth:`wait_for_store`); then what is left is saved to a file
        that ``lcfed tracking replay`` sends later."""
        # the warnings' stacklevel 3 names the observer's method that flushed (the observer calls this)
        if final and not self.wait_for_store(wait_s, give_up):
            exc: Exception = ConnectionError(f"{self.uri} does not answer /health")
        elif self.points and self.unreachable_since and not reachable(self.uri):
            exc = ConnectionError(f"{self.uri} does not answer /health")
        else:
            try:
                while self.points:
                    self.client.log_batch(run_id, metrics=self.points[:METRICS_PER_BATCH])
                    del self.points[:METRICS_PER_BATCH]
                self.unreachable_since = 0.0
                return True
            except Exception as err:
                exc = err
        if final:
            self.unlogged = write_unlogged(self.uri, run_id, self.points)
            warnings.warn(f"MLflow store {self.uri} unreachable at the end of the run: {len(self.points)} metric "
                          f"points saved in {self.unlogged} ({type(exc).__name__})", stacklevel=3)
            return False
        if not self.unreachable_since:
            self.unreachable_since = time.time()
            warnings.warn(f"MLflow store {self.uri} unreachable ({type(exc).__name__}); buffering metrics",
                          stacklevel=3)
        return False

    def wait_for_store(self, wait_s: float, give_up: Callable[[], bool]) -> bool:
        """Whether the store answers, asking it every second for up to ``wait_s`` seconds (a tracking
        server being restarted is back within seconds; a longer outage ends in the replay file) or until
        ``give_up()`` (a signal to stop). A store this process opens itself always answers."""
        if reachable(self.uri):
            return True
        if wait_s <= 0:
            return False
        warnings.warn(f"MLflow store {self.uri} unreachable at the end of the run: trying again for up to "
                      f"{wait_s:g} s (tracking.end_wait_s)", stacklevel=4)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0 and not give_up():
            time.sleep(min(POLL_S, left))
            if reachable(self.uri, timeout=min(2.0, max(deadline - time.monotonic(), 0.5))):
                return True
        return False
