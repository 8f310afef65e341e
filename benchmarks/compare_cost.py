"""Where a tiny ``lcfed compare``'s time goes: Ray's start, then per sweep its setup until the trial's first
round, the rounds and the teardown.

The comparison (default: ``configs/demo.yaml``, lcfed, fedavg and ifca, ``--budget 1``, seeds 0 and 1,
``train.rounds=4``: 6 sweeps, 9 trials) runs as ``lcfed compare`` in a fresh child process, untracked
(``--no-track``) or tracked to a sqlite store in a temp dir. The child wraps a few functions of the code it
runs (no change to it): ``ensure_ray``, ``run_sweep``, ``_fit`` (``Tuner.fit``), ``restore_results`` and the
progress callback's trial start and result hooks; each trial's first report gives its first round's start
(the report's time less the round's ``round_seconds``) and ``time_this_iter_s`` (from the trainable's call).
Per sweep::

    setup   sweep's start -> its first trial's first round: driver (run_sweep until Tuner.fit),
            tune (Tuner.fit until the trial starts), trial (until the trainable is called), pre-round
            (the trainable until its first round: config, data, engine)
    rounds  first round's start -> last result
    after   last result -> the next sweep's start (Tune's end, the parent run's logging, phase 2's results)
    mlflow  (tracked) the sweep's parent run opened, its best trial and plots logged, its models logged:
            part of driver and after

``--code DIR`` (repeatable) runs each checkout's code (its ``tune_jobs`` first on the path), ``--parallel N``
(repeatable) each ``lcfed compare --parallel``: the runs alternate between them, so a before/after pair shares the
machine's load. Prints each run, then the median (min-max). With ``--parallel`` above 1 the methods' sweeps run in
driver processes, which this script does not watch: the totals alone are compared.

    .venv/bin/python benchmarks/compare_cost.py                           # this checkout, untracked, once
    .venv/bin/python benchmarks/compare_cost.py --code /work/main --code . --repeats 2 --tracked both
    .venv/bin/python benchmarks/compare_cost.py --parallel 1 --parallel 4 --repeats 3   # one after the other vs side by side
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("driver", "tune", "trial", "pre-round", "setup", "rounds", "after", "mlflow")
LOGGED = ("_open_parent", "log_parent", "_best_models")


def child(events_file: str, argv: list[str]) -> int:
    """Run ``lcfed ARGV`` in this process, its events (name, monotonic time, facts) written to ``events_file``."""
    events: list[dict[str, Any]] = [{"event": "process", "t": float(argv.pop(0))}]

    def note(event: str, **facts: Any) -> None:
        events.append({"event": event, "t": time.monotonic(), **facts})

    import tune_jobs.parent_run as parent_run
    import tune_jobs.sweep.run as sweep_run
    from tune_jobs.cli import main
    from tune_jobs.sweep.callbacks import SweepProgress

    note("imported")

    def wrap(module: Any, name: str) -> None:
        fn = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            note(f"{name}:start")
            try:
                return fn(*args, **kwargs)
            finally:
                note(f"{name}:end")
        setattr(module, name, timed)

    wrap(parent_run, "ensure_ray")
    for name in ("run_sweep", "_fit", "restore_results", "_open_parent", "log_parent", "_best_models"):
        if hasattr(sweep_run, name):
            wrap(sweep_run, name)
    # Tune calls its callbacks with keyword arguments: the names must stay
    on_start_, on_result_ = SweepProgress.on_trial_start, SweepProgress.on_trial_result

    def on_start(self: Any, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        note("trial_start", trial=trial.trial_id)
        on_start_(self, iteration, trials, trial, **info)

    def on_result(self: Any, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        metrics = (result.get("lcfed") or {}).get("metrics") or {}
        note("result", trial=trial.trial_id, round=result.get("round"), pid=result.get("pid"),
             iter_s=result.get("time_this_iter_s"), round_s=metrics.get("round_seconds"),
             acc=metrics.get("acc_mean"))
        on_result_(self, iteration, trials, trial, result, **info)

    SweepProgress.on_trial_start, SweepProgress.on_trial_result = on_start, on_result  # type: ignore[method-assign]
    try:
        return main(argv)
    finally:
        note("main:end")
        Path(events_file).write_text(json.dumps(events))


def breakdown(events: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """The run's figures (seconds) from its events: the totals and one dict per sweep."""
    t0 = events[0]["t"]
    at = {e["event"]: e["t"] for e in reversed(events)}  # the first of each name (a sweep's ParentRun calls
    # ensure_ray again: Ray is up by then)
    sweeps: list[dict[str, Any]] = []
    starts = [i for i, e in enumerate(events) if e["event"] == "run_sweep:start"]
    for n, i in enumerate(starts):
        j = starts[n + 1] if n + 1 < len(starts) else len(events)
        span = events[i:j]
        t = {e["event"]: e["t"] for e in reversed(span)}  # the first of each name
        results = [e for e in span if e["event"] == "result"]
        firsts = {}
        for e in results:
            firsts.setdefault(e["trial"], e)
        first = min(firsts.values(), key=lambda e: e["t"] - e["round_s"])
        round1 = first["t"] - first["round_s"]  # the first round's start, on the driver's clock
        called = first["t"] - first["iter_s"]  # the trainable's call
        end = events[j]["t"] if j < len(events) else at["main:end"]
        # MLflow's share (tracked): the sweep's parent run opened, then the best trial and plots, its models
        spans = [(e["event"].split(":")[0], e["t"]) for e in span if e["event"].split(":")[0] in LOGGED]
        logged = sum(b - a for (n, a), (m, b) in zip(spans[::2], spans[1::2], strict=False) if n == m)
        sweeps.append({"driver": t["_fit:start"] - t["run_sweep:start"],
                       "tune": t["trial_start"] - t["_fit:start"], "trial": called - t["trial_start"],
                       "pre-round": round1 - called, "setup": round1 - t["run_sweep:start"],
                       "rounds": results[-1]["t"] - round1, "after": end - results[-1]["t"],
                       "mlflow": logged, "trials": len(firsts), "pids": sorted({e["pid"] for e in results})})
    ray_s = at["ensure_ray:end"] - at["ensure_ray:start"]
    return {"wall": wall, "imports": at["imported"] - t0, "ray": ray_s,
            "before_ray": at["ensure_ray:start"] - at["imported"],
            "sweeps": sweeps, "exit": wall - (at["main:end"] - t0),
            "rounds": sum(s["rounds"] for s in sweeps), "setup": sum(s["setup"] for s in sweeps),
            "after": sum(s["after"] for s in sweeps)}


def run_once(code: Path, tracked: bool, parallel: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "out"
    argv = ["compare", "--config", str(code / args.config), "--methods", args.methods, "--budget", str(args.budget),
            "--seeds", args.seeds, "--set", f"train.rounds={args.rounds}", "--out", str(out), "-q",
            "--parallel", str(parallel)]
    argv += ["--set", f"tracking.uri=sqlite:///{work / 'mlflow.db'}"] if tracked else ["--no-track"]
    env = {**os.environ, "PYTHONPATH": str(code), **dict(e.split("=", 1) for e in args.env or [])}
    log = work / "compare.log"
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.run([sys.executable, __file__, "--child", str(work / "events.json"), str(t0), *argv],
                              cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"compare failed (exit {proc.returncode}): {log}\n{log.read_text()[-3000:]}")
    fig = breakdown(json.loads((work / "events.json").read_text()), wall)
    fig["report"] = (out / "compare.csv").read_text()
    return fig


def show(label: str, fig: dict[str, Any]) -> None:
    print(f"{label}: total {fig['wall']:.1f} s = imports {fig['imports']:.1f} + before Ray {fig['before_ray']:.1f} "
          f"+ Ray start {fig['ray']:.1f} + sweeps (setup {fig['setup']:.1f}, rounds {fig['rounds']:.1f}, after "
          f"{fig['after']:.1f}) + exit {fig['exit']:.1f}")
    print("    sweep  " + "  ".join(f"{p:>9}" for p in PARTS) + "  trial pids")
    for i, s in enumerate(fig["sweeps"], 1):
        print(f"    {i:>5}  " + "  ".join(f"{s[p]:9.2f}" for p in PARTS) + f"  {s['pids']}")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--code", action="append", type=Path, help="a checkout to run (repeatable; default: this one)")
    p.add_argument("--tracked", choices=("no", "yes", "both"), default="no")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--config", default="configs/demo.yaml", help="relative to the checkout")
    p.add_argument("--methods", default="lcfed,fedavg,ifca")
    p.add_argument("--budget", type=int, default=1)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--parallel", action="append", type=int, help="lcfed compare --parallel N (repeatable, runs "
                   "alternating; default 1: with more, the sweeps run in driver processes and only the totals, Ray's "
                   "start and the imports are broken down)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="set in the comparison's environment (a Ray "
                   "or Tune knob to try; repeatable)")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    args = p.parse_args()
    codes = [c.resolve() for c in (args.code or [ROOT])]
    modes = {"no": [False], "yes": [True], "both": [False, True]}[args.tracked]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        order = codes if r % 2 == 0 else codes[::-1]
        for tracked in modes:
            for code, parallel in [(c, n) for c in order for n in (args.parallel or [1])]:
                label = f"{code} --parallel {parallel} {'tracked' if tracked else 'untracked'}"
                with tempfile.TemporaryDirectory(prefix="compare-cost-") as tmp:
                    fig = run_once(code, tracked, parallel, args, Path(tmp))
                show(f"{label} #{r + 1}", fig)
                runs.setdefault(label, []).append(fig)
    print("\nmedian (min-max) over runs, seconds:")
    for label, figs in runs.items():
        print(f"  {label}: total {spread([f['wall'] for f in figs])}, Ray start {spread([f['ray'] for f in figs])}, "
              f"setup {spread([f['setup'] for f in figs])}, rounds {spread([f['rounds'] for f in figs])}, "
              f"after {spread([f['after'] for f in figs])}")
        reports = {f["report"] for f in figs}
        print(f"    report: {'the same numbers every run' if len(reports) == 1 else 'DIFFERS between runs'}")
    if len(runs) > 1:
        same = {tracked: {f["report"] for lab, figs in runs.items() if lab.endswith(tag) for f in figs}
                for tracked, tag in ((False, " untracked"), (True, " tracked"))}
        for tracked, reports in same.items():
            if reports:
                print(f"  {'tracked' if tracked else 'untracked'}: the runs' reports "
                      f"{'agree' if len(reports) == 1 else 'DIFFER'}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
