"""A run's artifacts: the CSVs (metrics history, per-device results, cluster assignments) and the
accuracy-vs-round figure, and the call that logs them at the end of a run.

Separate from the observer because the texts and the figure are pure functions of a run's results:
the sweep reads ``assignment_history.csv`` back and draws its own plots on the same round axis, and
the tests check the CSVs without a store. matplotlib is imported inside :func:`accuracy_figure` only
(``import lcfed.tracking`` must not load it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lcfed.config import ExperimentConfig
from lcfed.run.metric_catalog import LAYER_FAMILIES, PLOTTED
from lcfed.run.result import RunResult

#: the plotted pair drawn as a band rather than as lines
BAND = ("acc_p10", "acc_p90")

#: x-axis label of plots over rounds: rounds are numbered from 0, as MLflow's metric steps are
ROUND_AXIS = "round (MLflow step, from 0)"


def _fmt(v: Any) -> str:
    return "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def history_csv(history: Sequence[dict[str, float]]) -> str:
    """One row per round, one column per metric (sorted, ``round`` = MLflow step); a plain CSV whose
    first line is the header."""
    keys = sorted({k for row in history for k in row})
    if "round" in keys:
        keys.remove("round")
        keys.insert(0, "round")
    lines = [",".join(keys)] + [",".join(_fmt(row.get(k)) for k in keys) for row in history]
    return "\n".join(lines) + "\n"


def assignment_csv(assignment: Sequence[int] | np.ndarray) -> str:
    """The final cluster of every device: header ``device,cluster``."""
    rows = ["device,cluster"] + [f"{d},{c}" for d, c in enumerate(assignment)]
    return "\n".join(rows) + "\n"


def assignment_history_csv(hist: np.ndarray, rounds: Sequence[int]) -> str:
    """The cluster of every device per round: header ``round,device_0,device_1,...`` (no comment line,
    so MLflow's preview and any CSV reader take the first line as the header); ``round`` is the
    MLflow step, a cluster of -1 means unassigned."""
    hist = np.asarray(hist, dtype=np.int64).reshape(len(rounds), -1)
    header = ",".join(["round"] + [f"device_{d}" for d in range(hist.shape[1])])
    lines = [header] + [",".join(str(int(v)) for v in (r, *row)) for r, row in zip(rounds, hist, strict=True)]
    return "\n".join(lines) + "\n"


def read_assignment_history(text: str) -> tuple[np.ndarray, np.ndarray]:
    """``(rounds, assignment)`` from an ``assignment_history.csv``: the plain CSV that
    :func:`assignment_history_csv` writes, or the older form (a ``#`` comment, no round column,
    rows = rounds from 0)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if lines and lines[0].split(",")[0].strip() == "round":
        data = np.array([[int(v) for v in ln.split(",")] for ln in lines[1:]], dtype=np.int64).reshape(len(lines) - 1, -1)
        return data[:, 0], data[:, 1:]
    data = np.array([[int(float(v)) for v in ln.split(",")] for ln in lines], dtype=np.int64).reshape(len(lines), -1)
    return np.arange(len(data)), data


def devices_csv(result: RunResult) -> str:
    """The last evaluation per device: ``device,cluster,trained,correct,total,accuracy,test_loss``
    (``cluster`` -1 or empty when the method has none; ``trained`` 1 = counted in ``acc_mean``)."""
    lines = ["device,cluster,trained,correct,total,accuracy,test_loss"]
    for d, r in sorted(result.evaluation.items()):
        cluster = "" if result.assignment is None else str(int(result.assignment[d]))
        trained = "" if result.trained is None else str(int(bool(result.trained[d])))
        acc = repr(r.correct / r.total) if r.total else ""
        loss = repr(r.loss_sum / r.total) if r.total else ""
        lines.append(f"{d},{cluster},{trained},{r.correct},{r.total},{acc},{loss}")
    return "\n".join(lines) + "\n"


def layer_rows(history: Sequence[dict[str, float]]) -> tuple[list[str], list[tuple[int, str, int, int]]]:
    """The per-layer traffic of a run's history: its layers (in the order first seen) and one
    ``(round, layer, bytes_up, bytes_down)`` per round and layer (0 where a round moved none of it)."""
    up, down = LAYER_FAMILIES
    layers = list(dict.fromkeys(k.split("/", 1)[1] for row in history for k in row if k.startswith(LAYER_FAMILIES)))
    rows = [(int(row.get("round", i)), layer, int(row.get(up + layer, 0)), int(row.get(down + layer, 0)))
            for i, row in enumerate(history) for layer in layers]
    return layers, rows


def layers_csv(rows: Sequence[tuple[int, str, int, int]]) -> str:
    """``traffic/layers.csv`` of :func:`layer_rows`' rows: ``round,layer,bytes_up,bytes_down``, one row per round
    and model layer (codes and projections under ``other``)."""
    return "\n".join(["round,layer,bytes_up,bytes_down"] + [",".join(map(str, r)) for r in rows]) + "\n"


def layers_figure(layers: Sequence[str], rows: Sequence[tuple[int, str, int, int]], rounds: int,
                  cfg: ExperimentConfig) -> Any:
    """``plots/traffic_layers.png`` of :func:`layer_rows`' layers and rows over ``rounds`` rounds: each layer's
    upload and download over the whole run, in MB (10^6 bytes), as paired horizontal bars, the layers top to
    bottom as the model has them."""
    import matplotlib  # here, not at the top: see accuracy_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the Agg backend

    totals = {layer: [0, 0] for layer in layers}
    for _, layer, up, down in rows:
        totals[layer][0] += up
        totals[layer][1] += down
    fig, ax = plt.subplots(figsize=(6, 1.2 + 0.45 * max(len(layers), 1)), dpi=100, layout="constrained")
    y = np.arange(len(layers))[::-1]
    ax.barh(y + 0.2, [totals[layer][0] / 1e6 for layer in layers], height=0.4, label="uploaded")
    ax.barh(y - 0.2, [totals[layer][1] / 1e6 for layer in layers], height=0.4, label="downloaded")
    ax.set_yticks(y, layers)
    ax.set_xlabel("MB over the run (10^6 bytes)")
    ax.set_title(f"traffic per layer: {cfg.method.name}, {rounds} rounds")
    ax.grid(axis="x", alpha=0.3)
    if layers:
        ax.legend(loc="lower right", frameon=False)
    plt.close(fig)
    return fig


#: x-axis label of plots against the device model's simulated clock
CLOCK_AXIS = "simulated clock (hours)"


def accuracy_figure(history: Sequence[dict[str, float]], cfg: ExperimentConfig, clock: bool = False) -> Any:
    """Personalized test accuracy (mean, weighted mean, 10th-90th percentile band) per round. The
    x values are the rounds as logged (0-based, equal to the MLflow step), or with ``clock`` the device
    model's simulated clock at each round's end, in hours (with ``devices.target_acc`` as a line); the
    legend sits below the axes so it never hides the band."""
    import matplotlib  # here, not at the top: ``import lcfed.tracking`` must not load matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the Agg backend
    from matplotlib.ticker import MaxNLocator  # (the same)

    rows = [r for r in history if "acc_mean" in r]
    fig, ax = plt.subplots(figsize=(6, 4.4), dpi=100, layout="constrained")
    if rows:
        x = [r["sim_clock_seconds"] / 3600 for r in rows] if clock else [int(r["round"]) for r in rows]
        low, high = BAND
        ax.fill_between(x, [r[low] for r in rows], [r[high] for r in rows], alpha=0.2, label=f"{low}–{high}")
        for name, style in zip([n for n in PLOTTED if n not in BAND], ("-", "--", ":", "-."), strict=False):
            ax.plot(x, [r[name] for r in rows], style, label=name)
        if not clock:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        elif cfg.devices.target_acc:
            ax.axhline(cfg.devices.target_acc, color="grey", lw=0.8, ls=":", label="devices.target_acc")
    ax.set_xlabel(CLOCK_AXIS if clock else ROUND_AXIS)
    ax.set_ylabel("personalized test accuracy")
    ax.set_title(f"{cfg.method.name} on {cfg.data.dataset} ({cfg.data.partition})")
    ax.grid(alpha=0.3)
    if rows:
        fig.legend(loc="outside lower center", ncols=3, frameon=False)
    plt.close(fig)
    return fig


def log_artifacts(client: Any, run_id: str, result: RunResult, cfg: ExperimentConfig,
                  assignments: Sequence[np.ndarray], rounds: Sequence[int]) -> None:
    """The end-of-run artifacts: ``metrics/history.csv``, for clustered methods ``clusters/assignment.csv``
    and ``clusters/assignment_history.csv`` (``assignments[i]`` is round ``rounds[i]``'s),
    ``plots/accuracy.png`` (with the device model also ``plots/accuracy_vs_clock.png``), the per-layer
    traffic as ``traffic/layers.csv`` and ``plots/traffic_layers.png`` and, when the run evaluated its
    devices, ``metrics/devices.csv``."""
    client.log_text(run_id, history_csv(result.history), "metrics/history.csv")
    layers, rows = layer_rows(result.history)
    if layers:
        client.log_text(run_id, layers_csv(rows), "traffic/layers.csv")
        client.log_figure(run_id, layers_figure(layers, rows, len(result.history), cfg), "plots/traffic_layers.png")
    if result.assignment is not None:
        client.log_text(run_id, assignment_csv(result.assignment), "clusters/assignment.csv")
        if assignments:
            hist, logged = np.stack(assignments), rounds
        else:  # only the final assignment is known: it belongs to the last round
            last = int(result.history[-1].get("round", 0)) if result.history else 0
            hist, logged = np.asarray(result.assignment)[None], [last]
        client.log_text(run_id, assignment_history_csv(hist, logged), "clusters/assignment_history.csv")
    client.log_figure(run_id, accuracy_figure(result.history, cfg), "plots/accuracy.png")
    if any("sim_clock_seconds" in r for r in result.history):
        client.log_figure(run_id, accuracy_figure(result.history, cfg, clock=True), "plots/accuracy_vs_clock.png")
    if result.evaluation:
        client.log_text(run_id, devices_csv(result), "metrics/devices.csv")
