"""This machine's CPU, memory, disk, network and GPU as ``system/*`` metrics of a run, sampled by
MLflow's monitor thread while the run trains.

Separate from the observer because the monitor is a thread with its own start and (prompt, optionally
unflushed) stop, and neither may ever fail a run.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

#: seconds between two samples of the system metrics (``system/cpu_utilization_percentage``, memory,
#: disk, network, GPU): MLflow's default; ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` overrides it
SYSTEM_METRICS_INTERVAL_S = 10.0


def wanted_by_env() -> bool:
    """Whether runs sample system metrics: only when ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is true (or 1).

    Off by default: they sample the machine of the process that logs the run, which with Ray is the driver,
    not the nodes that train; a run of seconds gets one sample; and MLflow's run page lists them above
    the model's metrics, ahead of accuracy."""
    return os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false").lower() in ("true", "1")


def start_monitor(run_id: str, uri: str, resumed: bool) -> Any:
    """MLflow's system-metrics sampler (a thread) on this run, started; None (with a warning) when it
    cannot run, e.g. without psutil: the run goes on without them."""
    try:
        # MLflow only where a run is logged (never on Tune workers)
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                       resume_logging=resumed, tracking_uri=uri)
        monitor.start()
        return monitor
    except Exception as exc:
        warnings.warn(f"system metrics not logged: {type(exc).__name__}: {exc}", stacklevel=2)
        return None


def stop_monitor(monitor: Any, flush: bool) -> None:
    """Stop the sampler: its thread ends within a second; what it holds is sent only when ``flush``
    (when the store is gone it would wait out the client's retries)."""
    monitor._shutdown_event.set()
    thread = getattr(monitor, "_process", None)
    if thread is not None:
        thread.join(timeout=5.0)
    monitor._process = None
    if flush:
        try:
            pending = monitor.aggregate_metrics()  # samples since the last logged point (a short run's only one)
            if pending:
                monitor.publish_metrics(pending)
            monitor.mlflow_logger.flush()
        except Exception as exc:
            # stacklevel 3: the observer's caller of its stop_system_metrics, as the warning always named
            warnings.warn(f"last system metrics not logged: {type(exc).__name__}: {exc}", stacklevel=3)
