"""The sweep's summary plots for its parent run: the top trials' curves, the μ–λ map and a cluster
assignment heatmap. Each function returns a closed figure (pyplot keeps no reference to it; ``savefig``
and MLflow's ``log_figure`` still draw it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.ticker import FuncFormatter, MaxNLocator

from lcfed.tracking import ROUND_AXIS
from tune_jobs.sweep.objective import METRIC

#: a trial's curve: (its final value of the metric, its swept values, rounds, the metric, acc_mean or None)
Curve = tuple[float, dict[str, Any], Any, Any, Any]


def top_trials_figure(curves: Sequence[Curve], metric: str, mode: str) -> Any:
    """The metric per round of the best five trials (``curves`` best first), each labelled with its value and
    swept values."""
    matplotlib.use("Agg")
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for val, cfg, x, y, _ in curves[:5]:
        label = ", ".join(f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                          for k, v in cfg.items())
        ax.plot(x, y, label=f"{val:.3g}: {label}"[:60])
    ax.set_xlabel(ROUND_AXIS)
    ax.set_ylabel(metric)
    ax.set_title(f"top trials ({mode} {metric})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right" if mode == "max" else "upper right")
    fig.tight_layout()
    plt.close(fig)
    return fig


def comparable_values(trials: Sequence[Mapping[str, Any]]) -> tuple[int | None, list[float | None]]:
    """The round every trial is compared at and each trial's value there (None: not comparable).

    Trials hold ``rounds`` and ``values`` (a metric per reported round). The round is the furthest
    any trial reached with a finite value; trials that stopped before it (ASHA, a failure) get None
    rather than an earlier round's value, which no later round's value can be compared with."""
    last: list[dict[int, float]] = []
    for t in trials:
        last.append({int(r): float(v) for r, v in zip(t["rounds"], t["values"], strict=True)
                     if v is not None and math.isfinite(float(v))})
    reached = [max(d) for d in last if d]
    if not reached:
        return None, [None] * len(trials)
    at = max(reached)
    return at, [d.get(at) for d in last]


def mu_lambda_figure(trials: Sequence[Mapping[str, Any]]) -> Any:
    """μ–λ map of a sweep's trials (each a mapping with ``mu``, ``lam``, ``rounds``, ``values``).

    Filled markers, coloured by the metric, are the trials that reached the last round, all at that
    same round (named in the title); trials stopped earlier are hollow and uncoloured."""
    matplotlib.use("Agg")
    at, values = comparable_values(trials)
    mu = [t["mu"] for t in trials]
    lam = [t["lam"] for t in trials]
    done = [i for i, v in enumerate(values) if v is not None]
    early = [i for i, v in enumerate(values) if v is None]
    fig, ax = plt.subplots(figsize=(5.5, 4.4), dpi=100, layout="constrained")
    if done:
        sc = ax.scatter([mu[i] for i in done], [lam[i] for i in done], c=[v for v in values if v is not None], cmap="viridis",
                        s=80, edgecolors="k", label=f"reached round {at}")
        fig.colorbar(sc, ax=ax, label=f"{METRIC} at round {at}")
    if early:
        ax.scatter([mu[i] for i in early], [lam[i] for i in early], facecolors="none", edgecolors="0.4", s=80,
                   linewidths=1.2, label=f"stopped before round {at} (not coloured)")
    if all(isinstance(v, (int, float)) and v > 0 for v in mu + lam):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("μ (cluster proximal weight)")
    ax.set_ylabel("λ (global embedding weight)")
    ax.set_title(f"μ–λ map: {METRIC} at round {at} (MLflow step)" if at is not None else "μ–λ map")
    if early:
        fig.legend(loc="outside lower center", fontsize=8, frameon=False)
    plt.close(fig)
    return fig


def assignment_figure(hist: np.ndarray, rounds: Sequence[int] | np.ndarray | None = None, title: str = "") -> Any:
    """Cluster assignment per round (rows = rounds, columns = devices) with one categorical colour
    per cluster id (a discrete colour bar, integer ticks); unassigned (-1) is grey."""
    matplotlib.use("Agg")
    hist = np.asarray(hist, dtype=np.int64)
    if hist.ndim == 1:
        hist = hist[None]
    ids = [int(v) for v in np.unique(hist) if v >= 0]
    pool = [c for name in ("tab20", "tab20b", "tab20c") for c in plt.get_cmap(name).colors]  # type: ignore[attr-defined]  # a ListedColormap (stubs: Colormap)
    if len(ids) <= 10:
        colours = list(plt.get_cmap("tab10").colors[:len(ids)])  # type: ignore[attr-defined]  # (the same)
    elif len(ids) <= len(pool):
        colours = pool[:len(ids)]
    else:
        colours = list(plt.get_cmap("turbo")(np.linspace(0, 1, len(ids))))
    labels = [str(i) for i in ids]
    if (hist < 0).any():
        colours, labels, ids = [(0.75, 0.75, 0.75)] + colours, ["unassigned"] + labels, [-1] + ids
    codes = np.searchsorted(np.asarray(ids), np.where(hist < 0, -1, hist))
    n = max(len(ids), 1)
    cmap = ListedColormap(colours or [(0.75, 0.75, 0.75)], name="clusters")
    norm = BoundaryNorm(np.arange(n + 1) - 0.5, n)
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100, layout="constrained")
    im = ax.imshow(codes, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    ax.set_xlabel("device")
    ax.set_ylabel(ROUND_AXIS)
    steps = list(range(len(hist))) if rounds is None else [int(r) for r in rounds]
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: str(steps[int(y)]) if 0 <= int(y) < len(steps) else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or "cluster assignment")
    bar = fig.colorbar(im, ax=ax, label="cluster", ticks=np.arange(n))
    bar.ax.set_yticklabels(labels or ["none"])
    bar.ax.tick_params(length=0)
    plt.close(fig)
    return fig
