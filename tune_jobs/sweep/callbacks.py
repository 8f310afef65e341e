"""The sweep's driver-side Tune callbacks: :class:`TrialTracker` logs every trial to MLflow as a child run of
the sweep's parent, out of the trials' reports; :class:`SweepProgress` is the console, one table of trials
(swept values, round, the metric) in place of Tune's status output, which repeats the whole base config in
every "Current best trial" line.

On a terminal the table is printed when trials change, at most every ``TABLE_EVERY_S``; without one (a
Ray job's log, a pipe) every reported round is a line, so ``lcfed job logs --follow`` shows progress.
The final table is printed either way.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.entities import Param
from ray.tune import Callback

from lcfed.config import ExperimentConfig
from lcfed.logs import progress_shown
from lcfed.run.progress import is_tty
from lcfed.run.result import RunResult
from lcfed.tracking import MLflowObserver, run_name
from lcfed.tracking.naming import SEP, fit_name, named_values, short_names, values_label
from tune_jobs.sweep.objective import METRIC
from tune_jobs.sweep.options import error_line
from tune_jobs.sweep.space import log_param
from tune_jobs.sweep.trial import REPORT_KEY, trial_config

#: seconds between tables on a terminal
TABLE_EVERY_S = 15.0


class TrialTracker(Callback):
    """Logs every trial to MLflow from the sweep's driver, out of the trials' Tune reports: a
    child run per trial (params, per-round metrics, assignments, plots, status)."""

    def __init__(self, uri: str, exp_id: str, parent_id: str, sweep_name: str, rounds: int,
                 swept: Sequence[str] = (), named: Mapping[str, Any] | None = None, logs: Sequence[str] = ()) -> None:
        """``named``: values every trial's run name shows besides its swept ones (the sweep's ``--set``).
        ``logs``: swept keys on a log scale, whose ``log10`` each trial logs too (:func:`log_params`)."""
        self.uri, self.exp_id, self.parent_id, self.sweep_name = uri, exp_id, parent_id, sweep_name
        self.rounds, self.swept, self.named, self.logs = rounds, list(swept), dict(named or {}), list(logs)
        self.runs: dict[str, MLflowObserver] = {}
        self.history: dict[str, list[dict[str, float]]] = {}
        self.assignment: dict[str, np.ndarray] = {}
        self.last_round: dict[str, int] = {}
        self.status: dict[str, str] = {}
        self.names: set[str] | None = None  # child run names in use (unique within the sweep)

    def _name(self, client: Any, trial: Any, cfg: ExperimentConfig) -> str:
        """:func:`trial_run_name`; `` #<trial index>`` where two round alike."""
        if self.names is None:
            children = client.search_runs([self.exp_id], f"tags.mlflow.parentRunId = '{self.parent_id}'")
            self.names = {r.info.run_name for r in children}
        swept = {k: trial.config[k] for k in self.swept if k in trial.config}
        named = {k: v for k, v in getattr(self, "named", {}).items() if k not in swept}  # (pickled before `named`)
        name = trial_run_name(cfg, swept, named)
        if name in self.names:
            index = trial.trial_id.rsplit("_", 1)[-1]
            name = f"{name} #{int(index) if index.isdigit() else index}"
        self.names.add(name)
        return name

    def _run(self, trial: Any, facts: dict[str, str]) -> MLflowObserver:
        tid = trial.trial_id
        if tid not in self.runs:
            client = mlflow.MlflowClient(tracking_uri=self.uri)
            query = f"tags.tune_trial_id = '{tid}' and tags.sweep = '{self.sweep_name}'"
            earlier = client.search_runs([self.exp_id], query)  # a resumed sweep continues the trial's run
            overrides = {k: v for k, v in trial.config.items() if not k.startswith("__")}
            tags = {"tune_trial_id": tid, "sweep": self.sweep_name,
                    **{f"space.{k}": str(v) for k, v in overrides.items()}}
            obs = MLflowObserver(self.uri, parent_run_id=self.parent_id, tags=tags,
                                 resume_run_id=earlier[0].info.run_id if earlier else None)
            cfg = trial_config(trial.config, tid)
            if not earlier:
                cfg = cfg.replace(**{"tracking.run_name": self._name(client, trial, cfg)})
            obs.start(cfg, facts)
            if not earlier and obs.run_id is not None:  # (started: it has a run)
                log_params(obs.client, obs.run_id, trial.config, getattr(self, "logs", ()))  # (pickled before `logs`)
            self.runs[tid] = obs
            self.history[tid] = []
        return self.runs[tid]

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        data = result.get(REPORT_KEY)
        if not isinstance(data, dict):
            return
        obs = self._run(trial, data.get("federation") or {})
        if isinstance(data.get("provenance"), dict):
            obs.log_provenance(data["provenance"])
        if isinstance(data.get("placement"), dict):
            place = data["placement"]
            obs.client.set_tag(obs.run_id, "placement.trial_node", place["trial_node"])
            device_nodes = {a["node_id"] for a in place.get("device_actors", ())} or {place["trial_node"]}
            obs.client.set_tag(obs.run_id, "placement.device_nodes", ",".join(sorted(device_nodes)))
            obs.client.log_dict(obs.run_id, place, "placement.json")
        rnd = int(result.get("round", 0))
        metrics = dict(data.get("metrics", {}))
        assignment = np.asarray(data["assignment"], dtype=np.int64) if "assignment" in data else None
        obs.log_round(rnd, metrics, assignment)
        self.history[trial.trial_id].append({**metrics, "round": rnd})
        self.last_round[trial.trial_id] = rnd
        if assignment is not None:
            self.assignment[trial.trial_id] = assignment

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = trial.trial_id
        if tid not in self.runs:
            return
        obs, hist = self.runs[tid], self.history[tid]
        evals = [h for h in hist if METRIC in h]
        final = dict(evals[-1] if evals else hist[-1] if hist else {})
        obs.on_end(RunResult(final=final, history=hist, assignment=self.assignment.get(tid)))
        stopped = self.last_round.get(tid, -1) < self.rounds - 1  # the scheduler stopped it: not a failure
        # on every trial, so the sweep's saved view always has the column (a tag no run carries is not shown)
        obs.client.set_tag(obs.run_id, "stopped_early", "true" if stopped else "false")
        if stopped:
            obs.client.set_tag(obs.run_id, "stopped_at_round", str(self.last_round.get(tid, -1)))

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        # every trial's status after the controller's last step: its clean-up after a signal marks the
        # running trials TERMINATED, and the result grid of an interrupted fit may list none
        self.status = {t.trial_id: t.status for t in trials}

    def unfinished(self) -> int:
        """Trials neither terminated nor errored at the controller's last step."""
        return sum(status not in ("TERMINATED", "ERROR") for status in self.status.values())

    def close_open(self, reason: str) -> None:
        """Mark the runs of trials the sweep left unfinished KILLED, with the reason."""
        for obs in self.runs.values():
            if not obs.finished:
                obs.on_error(KeyboardInterrupt(reason))
                obs.finished = True

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        obs = self._run(trial, {})
        obs.client.set_tag(obs.run_id, "failure_reason", trial_error(trial)[-5000:])
        obs.client.set_terminated(obs.run_id, "FAILED")
        obs.finished = True


def log_params(client: Any, run_id: str, values: Mapping[str, Any], keys: Sequence[str]) -> None:
    """``log10.<key>`` params of the trial's log-scale swept values that its run logged (a method without μ
    gets no ``log10.method.mu``, so the UI's parallel-coordinates chart leaves it out rather than draw it at
    a made-up value)."""
    logged = client.get_run(run_id).data.params
    params = [Param(log_param(k), f"{math.log10(float(values[k])):.6g}") for k in keys
              if k in logged and isinstance(values.get(k), (int, float)) and values[k] > 0]
    if params:
        client.log_batch(run_id, params=params)


def trial_error(trial: Any) -> str:
    """The trial's exception as ``module.Error: message`` (the last one its traceback names)."""
    text = ""
    if trial.error_file and Path(trial.error_file).is_file():
        text = Path(trial.error_file).read_text(errors="replace")
    return error_line(text)


def trial_run_name(cfg: ExperimentConfig, swept: Mapping[str, Any], named: Mapping[str, Any]) -> str:
    """A trial's run name, led by what differs between the trials, its swept values, then the run's own name
    with the sweep's other ``--set`` values: ``mu=0.0312 lam=0.2 · lcfed rounds=3 · digits dir0.15 · s0`` (the
    runs table cuts long names at the end, where the trials agree); swept values the other parts show (the seed,
    the method, the data) stay there; at most 250 characters."""
    base = run_name(cfg, named)
    lead = values_label(named_values(swept))  # not what the name's other parts show (the seed, the method, the data)
    return fit_name(f"{lead}{SEP}{base}") if lead else base


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _carried(row: dict[str, Any], rnd: int) -> str:
    """The metric's latest evaluated value, with its round when that was an earlier one; never ``nan``."""
    if math.isnan(row["metric"]):
        return "not evaluated yet"
    at = row.get("metric_round", rnd)
    return _value(row["metric"]) + ("" if at == rnd else f" (round {at})")


def trial_index(trial: Any) -> int | None:
    """The trial's creation index (Tune's experiment tag starts with it), None if the tag has none: a
    seeded search's order, where trial ids are random."""
    head = str(getattr(trial, "experiment_tag", "")).split("_", 1)[0]
    return int(head) if head.isdigit() else None


class SweepProgress(Callback):
    """Prints the sweep's progress (see the module's docstring). ``lines``: force per-round lines (True)
    or tables (False); None decides by whether ``file`` (default: standard output) is a terminal. ``label``: the
    start of every line printed (``lcfed compare``: the method, its sweeps side by side with others')."""

    def __init__(self, swept: Sequence[str], metric: str, mode: str, rounds: int, file: Any = None,
                 lines: bool | None = None, label: str | None = None) -> None:
        # no stream kept unless one is given: Tune pickles its callbacks with the experiment state
        self.swept, self.metric, self.mode, self.rounds, self.file = list(swept), metric, mode, rounds, file
        self.label = label
        self.lines = (not is_tty(file or sys.stdout)) if lines is None else lines
        self.rows: dict[str, dict[str, Any]] = {}  # trial id -> values, round, metric, status
        self.order: list[str] = []
        self.changed = False
        self.last_table = time.monotonic()
        self.names = short_names(self.swept)

    def _row(self, trial: Any) -> dict[str, Any]:
        if trial.trial_id not in self.rows:
            # numbered in creation order, as the summary breaks ties
            index = trial_index(trial)
            index = len(self.rows) + 1 if index is None else index
            self.rows[trial.trial_id] = {"values": [trial.config.get(k) for k in self.swept], "round": 0,
                                         "metric": math.nan, "status": "pending", "index": index}
            self.order = sorted(self.rows, key=lambda t: self.rows[t]["index"])
        return self.rows[trial.trial_id]

    def _label(self, trial_id: str) -> str:
        row = self.rows[trial_id]
        values = " ".join(f"{n}={_value(v)}" for n, v in zip(self.names, row["values"], strict=True))
        return f"trial {row['index']} ({trial_id}) {values}".rstrip()

    def _best(self) -> tuple[str, float] | None:
        # as the sweep's summary picks it: among the trials furthest along, a stopped one not compared
        scored = [(tid, r["metric"]) for tid, r in self.rows.items() if not math.isnan(r["metric"])]
        if not scored:
            return None
        farthest = max(self.rows[tid]["round"] for tid, _ in scored)
        scored = [(tid, m) for tid, m in scored if self.rows[tid]["round"] == farthest]
        sign = -1.0 if self.mode == "max" else 1.0
        return min(scored, key=lambda s: (sign * s[1], self.rows[s[0]]["index"]))

    def _print(self, text: str) -> None:
        if progress_shown():  # read when printing: Tune restores a resumed sweep's callbacks from its state
            if getattr(self, "label", None):  # (a sweep saved before labels existed has none)
                text = "\n".join(f"{self.label} | {line}" for line in text.splitlines())
            print(text, file=self.file or sys.stdout, flush=True)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._row(trial)["status"] = "running"
        self.changed = True
        if self.lines:
            self._print(f"{self._label(trial.trial_id)}: started")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        row = self._row(trial)
        row["status"] = "running"
        row["round"] = int(result.get("round", row["round"] - 1)) + 1
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and not math.isnan(value):  # NaN: a round that was not evaluated
            row["metric"], row["metric_round"] = float(value), row["round"] - 1
        self.changed = True
        if self.lines:
            self._print(f"{self._label(trial.trial_id)}: round {row['round'] - 1} ({row['round']}/{self.rounds})  "
                        f"{self.metric} {_carried(row, row['round'] - 1)}")

    def _ended(self, trial: Any, status: str) -> None:
        row = self._row(trial)
        row["status"] = status
        self.changed = True
        if self.lines:
            self._print(f"{self._label(trial.trial_id)}: {status} after round {row['round'] - 1} "
                        f"({row['round']}/{self.rounds})")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        row = self._row(trial)
        self._ended(trial, "done" if row["round"] >= self.rounds else "stopped early")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trial, "error")

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if self.lines or not self.changed or time.monotonic() - self.last_table < TABLE_EVERY_S:
            return
        self._print(self.table())

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._print(self.table())

    def table(self) -> str:
        """The trials as a text table; the best so far is marked ``*``."""
        self.changed, self.last_table = False, time.monotonic()
        best = self._best()
        head = ["", "trial", "status", *self.names, "round", self.metric]
        body = []
        for tid in self.order:
            r = self.rows[tid]
            mark = "*" if best is not None and best[0] == tid else ""
            body.append([mark, str(r["index"]), r["status"], *(_value(v) for v in r["values"]),
                         f"{r['round']}/{self.rounds}", _value(r["metric"])])
        widths = [max(len(row[c]) for row in [head, *body]) for c in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        done = sum(r["status"] in ("done", "stopped early", "error") for r in self.rows.values())
        title = f"sweep: {done}/{len(self.rows)} trials ended"
        if best is not None:
            title += f"; best {self.metric} {_value(best[1])} (trial {self.rows[best[0]]['index']})"
        return "\n".join([title, fmt.format(*head).rstrip(), *(fmt.format(*row).rstrip() for row in body)])
