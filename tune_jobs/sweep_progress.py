"""The sweep's console: one table of trials (swept values, round, the metric) in place of Tune's status
output, which repeats the whole base config in every "Current best trial" line.

On a terminal the table is printed when trials change, at most every ``TABLE_EVERY_S``; without one (a
Ray job's log, a pipe) every reported round is a line, so ``lcfed job logs --follow`` shows progress.
The final table is printed either way.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from lcfed.progress import is_tty

#: seconds between tables on a terminal
TABLE_EVERY_S = 15.0


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def short_names(keys: Sequence[str]) -> list[str]:
    """``method.mu`` -> ``mu`` unless two keys share their last part."""
    tails = [k.split(".")[-1] for k in keys]
    return [t if tails.count(t) == 1 else k for k, t in zip(keys, tails, strict=True)]


def trial_index(trial: Any) -> int | None:
    """The trial's creation index (Tune's experiment tag starts with it), None if the tag has none: a
    seeded search's order, where trial ids are random."""
    head = str(getattr(trial, "experiment_tag", "")).split("_", 1)[0]
    return int(head) if head.isdigit() else None


def progress_callback(swept: Sequence[str], metric: str, mode: str, rounds: int, file: Any = None,
                      lines: bool | None = None) -> Any:
    """A Tune callback printing the sweep's progress (see the module's docstring). ``lines``: force
    per-round lines (True) or tables (False); None decides by whether ``file`` is a terminal."""
    from ray.tune import Callback

    class SweepProgress(Callback):
        def __init__(self) -> None:
            # no stream kept: Tune pickles its callbacks with the experiment state
            self.lines = (not is_tty(file or sys.stdout)) if lines is None else lines
            self.rows: dict[str, dict[str, Any]] = {}  # trial id -> values, round, metric, status
            self.order: list[str] = []
            self.changed = False
            self.last_table = time.monotonic()
            self.names = short_names(list(swept))

        def _row(self, trial: Any) -> dict[str, Any]:
            if trial.trial_id not in self.rows:
                # numbered in creation order, as the summary breaks ties
                index = trial_index(trial)
                index = len(self.rows) + 1 if index is None else index
                self.rows[trial.trial_id] = {"values": [trial.config.get(k) for k in swept], "round": 0,
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
            sign = -1.0 if mode == "max" else 1.0
            return min(scored, key=lambda s: (sign * s[1], self.rows[s[0]]["index"]))

        def _print(self, text: str) -> None:
            print(text, file=file or sys.stdout, flush=True)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._row(trial)["status"] = "running"
            self.changed = True
            if self.lines:
                self._print(f"{self._label(trial.trial_id)}: started")

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            row = self._row(trial)
            row["status"] = "running"
            row["round"] = int(result.get("round", row["round"] - 1)) + 1
            value = result.get(metric)
            if isinstance(value, (int, float)):
                row["metric"] = float(value)
            self.changed = True
            if self.lines:
                self._print(f"{self._label(trial.trial_id)}: round {row['round']}/{rounds}  "
                            f"{metric} {_value(row['metric'])}")

        def _ended(self, trial: Any, status: str) -> None:
            row = self._row(trial)
            row["status"] = status
            self.changed = True
            if self.lines:
                self._print(f"{self._label(trial.trial_id)}: {status} at round {row['round']}/{rounds}")

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            row = self._row(trial)
            self._ended(trial, "done" if row["round"] >= rounds else "stopped early")

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
            head = ["", "trial", "status", *self.names, "round", metric]
            body = []
            for tid in self.order:
                r = self.rows[tid]
                mark = "*" if best is not None and best[0] == tid else ""
                body.append([mark, str(r["index"]), r["status"], *(_value(v) for v in r["values"]),
                             f"{r['round']}/{rounds}", _value(r["metric"])])
            widths = [max(len(row[c]) for row in [head, *body]) for c in range(len(head))]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            done = sum(r["status"] in ("done", "stopped early", "error") for r in self.rows.values())
            title = f"sweep: {done}/{len(self.rows)} trials ended"
            if best is not None:
                title += f"; best {metric} {_value(best[1])} (trial {self.rows[best[0]]['index']})"
            return "\n".join([title, fmt.format(*head).rstrip(), *(fmt.format(*row).rstrip() for row in body)])

    return SweepProgress()
