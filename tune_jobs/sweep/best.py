"""The sweep's outcome: the best trial (:func:`best_result`) and what its parent run shows of it
(:func:`log_parent`): the best trial's metrics, swept values and run, ``best.json`` and the summary plots."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from lcfed.errors import SweepFailed
from lcfed.tracking import mlflow_key, read_assignment_history
from tune_jobs.sweep.callbacks import trial_index
from tune_jobs.sweep.figures import Curve, assignment_figure, mu_lambda_figure, top_trials_figure
from tune_jobs.sweep.objective import METRIC
from tune_jobs.sweep.options import error_line
from tune_jobs.sweep.space import finite_number, swept_keys
from tune_jobs.sweep.trial import REPORT_KEY


def best_result(results: Any, metric: str = METRIC, mode: str = "max", order: Mapping[str, int] | None = None) -> Any:
    """The best trial: among those that reached the most rounds (under ASHA / HyperBand the survivors; a
    trial stopped at round 2 is not compared with finished ones on its round-2 accuracy), the best last
    ``metric``; ties go to the trial created first (``order``: trial id -> creation index, else the id)."""
    scored = [r for r in results if r.metrics and finite_number(r.metrics.get(metric))]
    if not scored:
        errors = [error_line(str(r.error)) for r in results if r.error is not None]
        why = f"; first error: {errors[0]}" if errors else ""
        raise SweepFailed(f"no trial of {len(results)} reported a finite {metric} ({len(errors)} failed){why}")

    def reached(r: Any) -> float:
        rnd = r.metrics.get("round")
        return float(rnd) if finite_number(rnd) else -1.0

    farthest = max(reached(r) for r in scored)
    scored = [r for r in scored if reached(r) == farthest]
    sign = -1.0 if mode == "max" else 1.0
    order = order or {}

    def key(r: Any) -> tuple[float, float, str]:
        tid = str(r.metrics.get("trial_id", ""))
        return sign * r.metrics[metric], order.get(tid, math.inf), tid

    return min(scored, key=key)


def trial_order(results: Any) -> dict[str, int]:
    """Trial id -> creation index (:func:`trial_index`)."""
    trials = getattr(getattr(results, "_experiment_analysis", None), "trials", None) or []
    return {str(t.trial_id): i for t in trials if (i := trial_index(t)) is not None}


def child_run(client: Any, exp_id: str, result: Any) -> Any:
    """The MLflow child run of a Tune result (found by its ``tune_trial_id`` tag), or None."""
    trial_id = result.metrics.get("trial_id") if result.metrics else None
    runs = client.search_runs([exp_id], f"tags.tune_trial_id = '{trial_id}'") if trial_id else []
    return runs[0] if runs else None


def log_parent(client: Any, parent_id: str, exp_id: str, results: Any, best: Any, best_cfg: dict, space: dict,
               metric: str = METRIC, mode: str = "max", links: str = "") -> None:
    """The best trial on the sweep's parent run (:func:`_log_best`; ``links``: the rest of its description),
    and summary plots (:func:`_log_plots`)."""
    _log_best(client, parent_id, exp_id, best, best_cfg, space, metric, mode, links)
    _log_plots(client, parent_id, exp_id, results, best, space, metric, mode)


def _log_best(client: Any, parent_id: str, exp_id: str, best: Any, best_cfg: dict, space: dict, metric: str,
              mode: str, links: str = "") -> None:
    """Metrics: the best trial's child run's metrics under their own keys (the parent row shows its
    ``accuracy/acc_mean``), plus ``best_<metric>`` in the metric's section (``accuracy/best_acc_mean``). Params: its swept values under the children's names
    (``method.mu``), so the collapsed parent row fills those columns. Tags ``best.*`` and ``best.json`` too."""
    value = float(best.metrics.get(metric, float("nan")))
    step = int(best.metrics.get("round", 0))
    ts = int(time.time() * 1000)
    child = child_run(client, exp_id, best)
    points = [Metric(mlflow_key(f"best_{metric}"), value, ts, step)]
    if child is not None:
        points += [Metric(k, float(v), ts, step) for k, v in child.data.metrics.items() if math.isfinite(v)]
        _mark_best(client, parent_id, exp_id, child, metric, value, links)
    client.log_batch(parent_id, metrics=points)
    for k, v in best_cfg.items():
        client.set_tag(parent_id, f"best.{k}", str(v))
    swept = [k for k in swept_keys(space) if k in best_cfg]
    try:  # params are write-once: a resumed sweep whose errored trials now win keeps the first best's
        client.log_batch(parent_id, params=[Param(k, str(best_cfg[k])[:6000]) for k in swept])
    except MlflowException:
        client.set_tag(parent_id, "best_params_stale", "true: see the best.* tags")
    client.set_tag(parent_id, "best_trial_id", str(best.metrics.get("trial_id")))
    client.log_dict(parent_id, {"best_config": best_cfg, f"best_{metric}": best.metrics.get(metric), "metric": metric,
                                "mode": mode, "best_trial_id": best.metrics.get("trial_id")}, "best.json")


def _mark_best(client: Any, parent_id: str, exp_id: str, child: Any, metric: str, value: float, links: str = "") -> None:
    """The best trial, findable in the UI: the parent's ``best_run_id``/``best_run_name`` tags, its description
    (shown as Markdown on its page) linking to the trial, and the trial's own ``best_trial`` tag (a column of
    the runs table), taken off a trial a resumed sweep no longer finds best."""
    before = client.get_run(parent_id).data.tags.get("best_run_id")
    if before and before != child.info.run_id:
        with contextlib.suppress(MlflowException):
            client.delete_tag(before, "best_trial")
    client.set_tag(parent_id, "best_run_id", child.info.run_id)
    client.set_tag(parent_id, "best_run_name", child.info.run_name)
    client.set_tag(child.info.run_id, "best_trial", "true")
    client.set_tag(parent_id, "mlflow.note.content",
                   f"Best trial: [{child.info.run_name}](#/experiments/{exp_id}/runs/{child.info.run_id}) "
                   f"({metric} {value:.4g})" + (f"\n\n{links}" if links else ""))


def _log_plots(client: Any, parent_id: str, exp_id: str, results: Any, best: Any, space: dict, metric: str,
               mode: str) -> None:
    """The top trials' curves; the μ–λ map (``acc_mean``, whatever the metric) where the space sweeps both;
    the best trial's cluster assignment."""
    curves = _curves(results, metric, mode)
    client.log_figure(parent_id, top_trials_figure(curves, metric, mode), "plots/top_trials.png")
    acc_curves = [t for t in curves if t[4] is not None]
    if "method.mu" in space and "method.lam" in space and acc_curves:
        trials = [{"mu": c.get("method.mu"), "lam": c.get("method.lam"), "rounds": x, "values": acc}
                  for _, c, x, _, acc in acc_curves]
        client.log_figure(parent_id, mu_lambda_figure(trials), "plots/mu_lambda_heatmap.png")
    _log_assignment_heatmap(client, parent_id, exp_id, best)


def _curves(results: Any, metric: str, mode: str) -> list[Curve]:
    """Every trial that reported the metric, best first: its final value, swept values, rounds, the metric
    per round and ``acc_mean`` per round."""
    curves = []
    for r in results:
        df = r.metrics_dataframe
        y = _column(df, metric) if r.metrics is not None and df is not None else None
        if y is None:  # e.g. a trial that failed in its first round
            continue
        x = df["round"].to_numpy() if "round" in df else np.arange(len(df))
        curves.append((float(r.metrics.get(metric, float("nan"))),
                       {k: v for k, v in r.config.items() if not k.startswith("__")}, x, y, _column(df, METRIC)))
    sign = -1.0 if mode == "max" else 1.0
    curves.sort(key=lambda t: sign * t[0] if math.isfinite(t[0]) else math.inf)
    return curves


def _column(df: Any, name: str) -> Any:
    """A metric's column of a trial's results: the top-level metric, or one of the nested ones."""
    for col in (name, f"{REPORT_KEY}/metrics/{name}"):
        if col in df:
            return df[col].to_numpy(dtype=float)
    return None


def _log_assignment_heatmap(client: Any, parent_id: str, exp_id: str, best: Any) -> None:
    """The best trial's cluster assignment per round (rows = rounds, columns = devices)."""
    trial_id = best.metrics.get("trial_id")
    runs = client.search_runs([exp_id], f"tags.tune_trial_id = '{trial_id}'") if trial_id else []
    if not runs:
        return
    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # one small CSV: no bar between the table and the summary
    try:
        text = client.download_artifacts(runs[0].info.run_id, "clusters/assignment_history.csv")
    except Exception:
        return  # methods without clusters have no assignment
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
    rounds, hist = read_assignment_history(Path(text).read_text())
    fig = assignment_figure(hist, rounds, title="cluster assignment of the best trial")
    client.log_figure(parent_id, fig, "plots/assignment_heatmap.png")
