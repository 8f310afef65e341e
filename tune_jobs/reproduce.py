"""``lcfed reproduce table1``: every (dataset, partition, method) cell on one budget, as a table.

Each cell is one federation on the Ray engine with the same rounds, local steps, batch, lr and
seed; it is an MLflow child run under one parent run. Finished cells are written to
``<out>/cells/<cell>.json`` and never redone; an interrupted cell resumes from its own
checkpoint (``<out>/checkpoints/<cell>``) into the same MLflow run. ``table1.md`` and
``table1.csv`` go to ``<out>`` and onto the parent run.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lcfed import registry
from lcfed.config import ExperimentConfig, load_config
from lcfed.config.overrides import parse_override, resolve
from lcfed.errors import ConfigError, require
from lcfed.learning.stats import mean_ci
from lcfed.logs import progress_shown
from lcfed.run.checkpoint import CheckpointError
from lcfed.run.loop import load_resume
from lcfed.run.output_paths import check_output_dir
from lcfed.run.progress import ProgressBar
from lcfed.run.sources import check_against_data, load
from lcfed.run.stop import stop_on_signals
from lcfed.tracking import MLflowObserver, check_tracking_store, resolve_tracking_uri, run_name
from tune_jobs.options import add_actions, config_options, examples, verbosity_options
from tune_jobs.outdir import open_recorded, read_state, write_json
from tune_jobs.parent_run import ParentRun

#: evaluations averaged per cell (the unweighted mean jumps between evaluations on small devices)
LAST_EVALS = 3


@dataclass(frozen=True)
class Cell:
    dataset: str
    partition: str  # as given on the command line, e.g. "dirichlet:0.1"
    method: str
    seed: int | None = None  # --seeds: the config's seed for this run of the cell

    @property
    def key(self) -> str:
        seed = "" if self.seed is None else f"__s{self.seed}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.dataset}__{self.partition}__{self.method}{seed}")

    @property
    def column(self) -> tuple[str, str]:
        return self.dataset, self.partition


def parse_seeds(text: str) -> list[int]:
    """``3`` -> seeds 0, 1, 2; ``0,5,9`` -> those."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    require(bool(parts) and all(p.isdigit() for p in parts), "--seeds", text,
            "a count (e.g. 3: seeds 0, 1, 2) or distinct comma-separated seeds (e.g. 0,5,9)")
    if len(parts) == 1:
        n = int(parts[0])
        require(n >= 1, "--seeds", text, "must be >= 1")
        return list(range(n))
    seeds = [int(p) for p in parts]
    require(len(set(seeds)) == len(seeds), "--seeds", text, "seeds must be distinct")
    return seeds


def partition_overrides(spec: str) -> dict[str, Any]:
    """``dirichlet:0.1``, ``pathological:3``, ``primary_secondary``; any of them ``+q50-350`` for
    quantity skew (50 to 350 samples per device)."""
    base, _, qty = spec.partition("+q")
    name, _, arg = base.partition(":")
    out: dict[str, Any] = {"data.partition": name, "data.samples_per_device": []}
    try:
        if name == "dirichlet":
            out["data.alpha"] = float(arg)
        elif name == "pathological":
            out["data.classes_per_device"] = int(arg)
        elif name == "primary_secondary":
            require(arg == "", "--partitions", spec, "primary_secondary takes no argument")
        else:
            raise ValueError
        if qty:
            low, high = (int(v) for v in qty.split("-"))
            out["data.samples_per_device"] = [low, high]
    except ValueError:
        raise ConfigError("--partitions", spec, "entries like dirichlet:0.1, pathological:3, primary_secondary, "
                          "each optionally +q50-350 (quantity skew)") from None
    return out


def partition_label(spec: str) -> str:
    base, _, qty = spec.partition("+q")
    name, _, arg = base.partition(":")
    label = {"dirichlet": f"Dir({arg})", "pathological": f"n={arg}", "primary_secondary": "prim/sec"}.get(name, base)
    return f"{label}, {qty} samples" if qty else label


def cell_values(cell: Cell, method_sets: dict[str, Any]) -> dict[str, Any]:
    """The ``--method-set`` values the cell's method accepts, as config keys (``method.num_clusters``)."""
    accepted = {f.name for f in dataclasses.fields(registry.method(cell.method).params)}
    return {f"method.{k}": v for k, v in method_sets.items() if k in accepted}


def cell_config(base: ExperimentConfig, cell: Cell, method_sets: dict[str, Any], out: Path) -> ExperimentConfig:
    """The base config with the cell's dataset, partition and method (plus the method settings
    that method accepts), on Ray, checkpointed under ``out``."""
    overrides: dict[str, Any] = {"data.dataset": cell.dataset, **partition_overrides(cell.partition),
                                 "method.name": cell.method, "engine.kind": "ray",
                                 "checkpoint.dir": str(out / "checkpoints" / cell.key),
                                 "name": f"table1-{cell.key}"}
    if cell.seed is not None:
        overrides["seed"] = cell.seed
    overrides.update(cell_values(cell, method_sets))
    return base.replace(**overrides)


def summarize(history: list[dict[str, float]], last: int = LAST_EVALS) -> dict[str, float]:
    """Mean over the last ``last`` evaluations of the personalized accuracy (mean over devices),
    its std over devices and the sample-weighted mean; plus the final values and totals."""
    evals = [row for row in history if "acc_mean" in row][-last:]
    if not evals:
        return {}
    out = {key: float(np.mean([row[key] for row in evals])) for key in ("acc_mean", "acc_std", "acc_weighted")}
    final = history[-1]
    out.update({"final_acc_mean": float(evals[-1]["acc_mean"]), "evaluations": float(len(evals))})
    for key in ("bytes_up_total", "bytes_down_total", "sim_seconds_total"):
        out[key] = float(final.get(key, math.nan))
    return out


def last_evaluations(results: dict[str, dict[str, Any]]) -> str:
    """What the runs' accuracies average: ``last 3 evaluations``, or fewer where runs made fewer
    (``last evaluation``, ``last 2-3 evaluations``)."""
    counts = sorted({int(r["evaluations"]) for r in results.values() if "evaluations" in r}) or [LAST_EVALS]
    if counts == [1]:
        return "last evaluation"
    if len(counts) == 1:
        return f"last {counts[0]} evaluations"
    return f"last {counts[0]}-{counts[-1]} evaluations (as many as each run made, up to {LAST_EVALS})"


def write_tables(out: Path, cells: list[Cell], results: dict[str, dict[str, Any]], title: str) -> tuple[str, str]:
    """``table1.md`` (methods x dataset/partition, in %: accuracy ± its std over devices; with ``--seeds``
    the mean over seeds ± its 95 % confidence interval) and ``table1.csv`` (one row per run)."""
    columns = list(dict.fromkeys(c.column for c in cells))
    methods = list(dict.fromkeys(c.method for c in cells))
    seeded = any(c.seed is not None for c in cells)
    head = [f"{d} {partition_label(p)}" for d, p in columns]
    averaged = last_evaluations(results)
    what = (f"mean over seeds ± its 95 % confidence interval (Student t) of the mean personalized test accuracy "
            f"(%), each run averaged over its {averaged}" if seeded else
            f"Mean personalized test accuracy (%) ± its std over devices, averaged over the {averaged}")
    lines = [f"# {title}", "", f"{what[0].upper()}{what[1:]}; best per column in bold.", "",
             "| method | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    cell_text: dict[tuple[str, tuple[str, str]], tuple[float, str]] = {}
    for m in methods:
        for col in columns:
            runs = [results[c.key] for c in cells if c.method == m and c.column == col and c.key in results]
            if not runs:
                continue
            if seeded:
                ci = mean_ci([r["acc_mean"] for r in runs])
                n = sum(1 for c in cells if c.method == m and c.column == col)
                cell_text[m, col] = (ci.mean, ci.format(100) + ("" if len(runs) == n else f" ({len(runs)}/{n} seeds)"))
            else:
                r = runs[0]
                cell_text[m, col] = (r["acc_mean"], f"{100 * r['acc_mean']:.2f} ± {100 * r['acc_std']:.2f}")
    best = {col: max((v[0] for (m, c), v in cell_text.items() if c == col), default=None) for col in columns}
    for m in methods:
        row = []
        for col in columns:
            if (m, col) not in cell_text:
                row.append("—")
                continue
            value, text = cell_text[m, col]
            row.append(f"**{text}**" if value == best[col] else text)
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    walls = [r["wall_seconds"] for r in results.values()]
    rounds = sorted({int(r["rounds"]) for r in results.values()})
    lines += ["", f"Rounds: {', '.join(map(str, rounds))}; runs: {len(results)}/{len(cells)}; "
              f"wall time of the runs: {sum(walls) / 60:.1f} min."]
    md = "\n".join(lines) + "\n"
    fields = ["dataset", "partition", "method", *(["seed"] if seeded else []), "acc_mean", "acc_std", "acc_weighted",
              "final_acc_mean", "rounds", "wall_seconds", "seconds_per_round", "bytes_up_total", "bytes_down_total",
              "sim_seconds_total"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for c in cells:
        if c.key in results:
            writer.writerow({"dataset": c.dataset, "partition": c.partition, "method": c.method, "seed": c.seed,
                             **results[c.key]})
    (out / "table1.md").write_text(md)
    (out / "table1.csv").write_text(buf.getvalue())
    return md, buf.getvalue()


def reproduce_table1(
    base: ExperimentConfig,
    datasets: list[str],
    partitions: list[str],
    methods: list[str],
    out: Path,
    method_sets: dict[str, Any] | None = None,
    track: bool = True,
    quiet: bool = False,
    seeds: list[int] | None = None,
) -> dict[str, Any]:
    """Run (or finish) every cell; return the table and where it went."""
    method_sets = dict(method_sets or {})
    cells = [Cell(d, p, m, s) for d in datasets for p in partitions for m in methods for s in (seeds if seeds else [None])]
    configs = {c.key: cell_config(base, c, method_sets, out) for c in cells}  # every cell validated before work
    for d in datasets:  # and its data present and large enough
        cfg = next(configs[c.key] for c in cells if c.dataset == d)
        check_against_data(cfg, load(cfg))
    out.mkdir(parents=True, exist_ok=True)
    (out / "cells").mkdir(exist_ok=True)
    uri, params, state = None, {}, None
    if track:
        uri = resolve_tracking_uri(base.tracking.uri)
        params = {"datasets": ",".join(datasets), "partitions": ",".join(partitions), "methods": ",".join(methods),
                  "method_sets": json.dumps(method_sets, sort_keys=True), "base_digest": base.digest(),
                  "rounds": str(base.train.rounds), **({"seeds": ",".join(map(str, seeds))} if seeds else {})}
        state = read_state(out, params, "a reproduction")

    results: dict[str, dict[str, Any]] = {}
    with ParentRun(base.engine, uri, "; rerun the same command to resume") as parent:
        if track:
            parent.connect(base.tracking.experiment)
            open_recorded(parent, out, state, out.name or "table1", {"table1_parent": "true"}, params)
        t0 = time.perf_counter()
        for i, cell in enumerate(cells, 1):
            results[cell.key] = _cell_result(cell, configs[cell.key], out, parent, quiet, f"[{i}/{len(cells)}]",
                                             cell_values(cell, method_sets))
        title = f"Table I reproduction: {base.data.num_devices} devices, {base.train.rounds} rounds"
        md, table_csv = write_tables(out, cells, results, title)
        if parent.run_id is not None:
            parent.client.log_text(parent.run_id, md, "table1.md")
            parent.client.log_text(parent.run_id, table_csv, "table1.csv")
    return {"table": md, "out": str(out), "parent_run_id": parent.run_id, "tracking_uri": uri,
            "cells": len(cells), "wall_seconds": time.perf_counter() - t0, "results": results}


def _cell_result(cell: Cell, cfg: ExperimentConfig, out: Path, parent: ParentRun, quiet: bool,
                 counter: str, named: dict[str, Any]) -> dict[str, Any]:
    """A cell's summary: ``<out>/cells/<cell>.json`` if it was finished before (with this config), else a run
    on Ray (resumed from its checkpoint; an MLflow child run of ``parent``'s run, if any, named from the
    config and the ``named`` values), written there."""
    from actors.ray_engine import RayEngine  # Ray when a cell runs: `lcfed` imports this module to build its parser

    done = out / "cells" / f"{cell.key}.json"
    label = (f"{counter} {cell.dataset} {partition_label(cell.partition)} {cell.method}"
             f"{'' if cell.seed is None else f' seed {cell.seed}'}")
    if done.exists():
        prior = json.loads(done.read_text())
        if prior.get("digest") != cfg.digest() or prior.get("rounds") != cfg.train.rounds:
            raise CheckpointError(f"{done} was finished with another config; use another --out")
        print(f"{label}: finished before ({100 * prior['acc_mean']:.2f}%)", file=sys.stderr)
        return prior
    resume = load_resume(cfg)
    observers: list[Any] = [ProgressBar(disable=True if quiet or not progress_shown() else None)]
    if parent.run_id is not None:
        observers.append(MLflowObserver(parent.uri, parent_run_id=parent.run_id, tags={"table1_cell": cell.key},
                                        resume_run_id=resume.tracking.get("run_id") if resume else None,
                                        run_name=run_name(cfg, named)))
    engine = RayEngine(cfg)
    try:
        result = engine.run(observers, resume)
    finally:
        engine.close()
    row: dict[str, Any] = {**summarize(result.history), "rounds": cfg.train.rounds, "digest": cfg.digest(),
           "wall_seconds": result.wall_seconds, "seconds_per_round": result.round_seconds,
           "run_id": result.tracking.get("run_id", "")}
    write_json(done, row)  # a cell is finished only once its summary is whole on disk
    print(f"{label}: {100 * row['acc_mean']:.2f} ± {100 * row['acc_std']:.2f}  ({row['wall_seconds']:.0f} s)",
          file=sys.stderr)
    return row


def add_parser(sub: Any) -> None:
    rep = sub.add_parser("reproduce", help="reproduce a paper table (every cell on one budget, on Ray)",
                         description="Reproduce a paper table: every cell a run on one budget, on Ray, under one "
                         "MLflow parent run.",
                         epilog=examples("lcfed reproduce table1 --rounds 50 --out outputs/table1"))
    rep_sub = add_actions(rep, "table", "TABLE")
    t1 = rep_sub.add_parser(
        "table1", help="methods x (dataset, partition): mean personalized accuracy ± std",
        description="Table I: one run per method x (dataset, partition) cell, each averaged over its last "
        f"{LAST_EVALS} evaluations (all it made, if fewer); writes table1.md and table1.csv to --out (rerun "
        "with the same --out to resume: finished cells are kept).",
        epilog=examples(
            "lcfed reproduce table1 --datasets fashion_mnist,mnist --rounds 100",
            "lcfed reproduce table1 --methods lcfed,fedavg,ifca --partitions dirichlet:0.1 --seeds 3",
            "lcfed reproduce table1 --method-set num_clusters=10 --out outputs/k10 --no-track"))
    config_options(t1, "base config (budget, devices, engine, tracking)", "override a base config field (repeatable)")
    t1.add_argument("--datasets", default="fashion_mnist", help="comma-separated (default: %(default)s)")
    t1.add_argument("--partitions", default="dirichlet:0.1,pathological:2,pathological:3",
                    help="comma-separated: dirichlet:ALPHA, pathological:N, primary_secondary; "
                    "append +qLOW-HIGH for quantity skew (default: %(default)s)")
    t1.add_argument("--methods", default="all", help="comma-separated registry names, or 'all' (default)")
    t1.add_argument("--rounds", type=int, help="rounds per cell (overrides train.rounds)")
    t1.add_argument("--method-set", metavar="KEY=VALUE", action="append", default=[],
                    help="a method setting applied to every method that has it, e.g. num_clusters=10 (repeatable)")
    t1.add_argument("--seeds", help="run every cell on these seeds (a count, e.g. 3: seeds 0, 1, 2, or a list, "
                    "e.g. 0,5,9) and report the mean over seeds ± its 95%% confidence interval")
    t1.add_argument("--out", default="outputs/table1", help="output directory; rerun with the same one to resume")
    t1.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    verbosity_options(t1, "no per-round progress bars: errors, each cell's line and the table")
    t1.set_defaults(func=cmd_table1)


def cmd_table1(args: argparse.Namespace) -> int:
    require(args.rounds is None or args.rounds >= 1, "--rounds", args.rounds, "must be >= 1 (rounds per cell)")
    overrides = list(args.set) + ([f"train.rounds={args.rounds}"] if args.rounds is not None else [])
    base = load_config(args.config, overrides)
    check_output_dir(args.out, "--out")
    if base.tracking.enabled and not args.no_track:
        check_tracking_store(base.tracking.uri)
    methods = [e.name for e in registry.names("method") if e.origin == "built-in"] if args.methods == "all" \
        else [m.strip() for m in args.methods.split(",") if m.strip()]
    specs = {m: resolve("method", "--methods", m) for m in methods}
    require(bool(methods), "--methods", args.methods, "at least one method: comma-separated names, or 'all'")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    partitions = [p.strip() for p in args.partitions.split(",") if p.strip()]
    require(bool(datasets), "--datasets", args.datasets, "at least one dataset")
    for d in datasets:
        resolve("dataset", "--datasets", d)
    require(bool(partitions), "--partitions", args.partitions, "at least one partition")
    for spec in partitions:
        partition_overrides(spec)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    for s in args.method_set:
        require("=" in s and bool(s.partition("=")[0].strip()), "--method-set", s, "must look like KEY=VALUE, e.g. mu=0.1")
    sets = dict(parse_override(s, "--method-set") for s in args.method_set)
    for key in sets:
        require(any(key in {f.name for f in dataclasses.fields(spec.params)} for spec in specs.values()),
                "--method-set", key, "a setting of at least one chosen method (see `lcfed methods`)")
    with stop_on_signals():  # SIGTERM/SIGHUP/Ctrl-C: the running cell stops at a round boundary, checkpointed
        summary = reproduce_table1(base, datasets, partitions, methods, Path(args.out), sets,
                                   track=base.tracking.enabled and not args.no_track, quiet=args.quiet,
                                   seeds=seeds)
    print(summary["table"])
    print(f"written: {Path(args.out) / 'table1.md'}, {Path(args.out) / 'table1.csv'}  "
          f"({summary['wall_seconds'] / 60:.1f} min this invocation)")
    if summary["parent_run_id"]:
        print(f"MLflow parent run {summary['parent_run_id']} in {summary['tracking_uri']}")
    return 0
