"""Sweep throughput: one ``lcfed sweep`` of N configs against the same N configs as sequential
``lcfed run`` calls, on this machine.

Both sides are whole commands started as subprocesses (interpreter start, imports, Ray start for the
sweep, MLflow logging to a fresh sqlite store each) on the same configs: the cartesian grid of
``--grid`` values over the base config (default: configs/demo.yaml, 10 rounds, μ x λ in
{0.01, 0.1}^2 = 4 configs), FIFO (no early stopping), so every trial runs every round. Prints both
wall times and sweep/loop, and checks that every trial's final acc_mean and train_loss equal its
``lcfed run``'s (exactly: the engines are bit-identical). ``--repeats R`` alternates the order.

    .venv/bin/python benchmarks/sweep_vs_loop.py                    # 4 configs x 10 rounds
    .venv/bin/python benchmarks/sweep_vs_loop.py --trial-engine ray # the actor path in every trial
    .venv/bin/python benchmarks/sweep_vs_loop.py --quick            # 2 configs x 2 rounds
    .venv/bin/python benchmarks/sweep_vs_loop.py --only sweep       # one side (for an external timer)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RESULTS = ROOT / "benchmarks" / "results"
KEYS = ("acc_mean", "train_loss")
#: their keys in MLflow (the run-page section first: lcfed.tracking.naming)
MLFLOW_KEYS = {"acc_mean": "accuracy/acc_mean", "train_loss": "loss/train_loss"}


def parse_grid(items: list[str]) -> dict[str, list[float | int | str]]:
    grid: dict[str, list[float | int | str]] = {}
    for item in items:
        key, _, values = item.partition("=")
        grid[key] = [_value(v) for v in values.split(",")]
    return grid


def _value(text: str) -> float | int | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def lcfed(args: list[str], cwd: Path, log: Path) -> float:
    """Run ``lcfed ARGS`` in ``cwd``; its wall time in seconds (output appended to ``log``)."""
    t0 = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.run([str(BIN / "lcfed"), *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"lcfed {' '.join(args[:1])} failed (exit {proc.returncode}); see {log}")
    return wall


def run_loop(base: list[str], points: list[dict[str, Any]], work: Path) -> tuple[float, dict[tuple, dict]]:
    uri = f"sqlite:///{work / 'loop.db'}"
    numbers: dict[tuple, dict] = {}
    t0 = time.monotonic()
    for i, point in enumerate(points):
        out = work / f"run{i}.json"
        sets = [a for k, v in point.items() for a in ("--set", f"{k}={v}")]
        lcfed(["run", *base, *sets, "--set", f"tracking.uri={uri}", "-q", "--json", str(out)], work, work / "loop.log")
        summary = json.loads(out.read_text())
        numbers[tuple(point.values())] = {k: summary[k] for k in KEYS}
    return time.monotonic() - t0, numbers


def run_sweep(base: list[str], grid: dict[str, list], work: Path, engine: str, tag: str) -> tuple[float, dict, dict]:
    import mlflow
    import yaml

    uri = f"sqlite:///{work / f'sweep{tag}.db'}"
    space = work / "space.yaml"
    space.write_text(yaml.safe_dump({k: {"grid": v} for k, v in grid.items()}))
    out = work / f"sweep{tag}.json"
    wall = lcfed(["sweep", *base, "--space", str(space), "--scheduler", "fifo", "--trial-engine", engine,
                  "--name", f"bench{tag}", "--storage", str(work / "tune"), "--set", f"tracking.uri={uri}",
                  "--json", str(out)], work, work / "sweep.log")
    summary = json.loads(out.read_text())
    client = mlflow.MlflowClient(tracking_uri=uri)
    numbers: dict[tuple, dict] = {}
    for run in client.search_runs([summary["experiment_id"]]):
        if run.data.tags.get("mlflow.parentRunId") == summary["parent_run_id"]:
            point = tuple(_value(run.data.params[k]) for k in grid)
            numbers[point] = {k: run.data.metrics[MLFLOW_KEYS[k]] for k in KEYS} | {"engine": run.data.params["engine.kind"]}
    return wall, numbers, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                    help="a grid axis (repeatable; default method.mu=0.01,0.1 and method.lam=0.01,0.1)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a base field")
    ap.add_argument("--trial-engine", default="auto", choices=["auto", "local", "ray"])
    ap.add_argument("--repeats", type=int, default=1, help="loop+sweep pairs, alternating which goes first")
    ap.add_argument("--only", choices=["loop", "sweep"], help="time one side only")
    ap.add_argument("--quick", action="store_true", help="2 configs x 2 rounds")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.grid = 2, args.grid or ["method.mu=0.01,0.1"]
    grid = parse_grid(args.grid or ["method.mu=0.01,0.1", "method.lam=0.01,0.1"])
    points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    base = ["--config", str(Path(args.config).resolve()), "--set", f"train.rounds={args.rounds}",
            *[a for s in args.set for a in ("--set", s)]]
    load0 = os.getloadavg()[0]
    print(f"{len(points)} configs x {args.rounds} rounds of {args.config} on {os.cpu_count()} CPUs "
          f"(load average {load0:.2f}); grid {grid}; trial engine {args.trial_engine}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-vs-loop-") as tmp:
        for rep in range(args.repeats):
            work = Path(tmp) / f"rep{rep}"
            work.mkdir()
            sides = ["loop", "sweep"] if rep % 2 == 0 else ["sweep", "loop"]
            row: dict[str, Any] = {}
            for side in sides:
                if args.only and side != args.only:
                    continue
                if side == "loop":
                    row["loop_s"], row["loop"] = run_loop(base, points, work)
                else:
                    row["sweep_s"], row["sweep"], summary = run_sweep(base, grid, work, args.trial_engine, str(rep))
                    row["trial_engine"] = summary["trial_engine"]
                print(f"  repeat {rep}: {side:<5} {row[side + '_s']:7.1f} s", flush=True)
            if "loop" in row and "sweep" in row:
                row["ratio"] = row["sweep_s"] / row["loop_s"]
                same = all(row["sweep"].get(tuple(p.values()), {}).get(k) == row["loop"][tuple(p.values())][k]
                           for p in points for k in KEYS)
                row["equal"] = same
                print(f"  repeat {rep}: sweep/loop {row['ratio']:.3f}; per-trial {'/'.join(KEYS)} equal to "
                      f"lcfed run: {'yes' if same else 'NO'}", flush=True)
                if not same:
                    for p in points:
                        key = tuple(p.values())
                        print(f"    {p}: run {row['loop'][key]}  sweep {row['sweep'].get(key)}")
            rows.append(row)
    print(f"\n{'repeat':>6} {'loop s':>8} {'sweep s':>8} {'sweep/loop':>10}  trial engine")
    for i, r in enumerate(rows):
        print(f"{i:>6} {r.get('loop_s', float('nan')):8.1f} {r.get('sweep_s', float('nan')):8.1f} "
              f"{r.get('ratio', float('nan')):10.3f}  {r.get('trial_engine', '-')}")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        print(f"median sweep/loop over {len(ratios)} repeat(s): {statistics.median(ratios):.3f}")
    load1 = os.getloadavg()[0]
    print(f"load average at the end: {load1:.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"configs": len(points), "rounds": args.rounds, "grid": grid, "cpus": os.cpu_count(),
              "load_start": load0, "load_end": load1, "trial_engine": args.trial_engine,
              "rows": [{k: v for k, v in r.items() if k not in ("loop", "sweep")} for r in rows]}
    (RESULTS / "sweep_vs_loop.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(r.get("equal", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
