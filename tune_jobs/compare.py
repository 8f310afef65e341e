"""``lcfed compare``: methods tuned on one budget, then re-run on several seeds, with statistics.

Phase 1 tunes every method with a Ray Tune sweep over its own bundled space (``tune_jobs/spaces/compare``,
or ``--space-dir``), the same number of trials and rounds for each, choosing by **validation**
accuracy (``val_acc_mean``: each device's validation split, ``data.val_fraction``); test data decides
nothing. Phase 2 re-runs each method's chosen config on ``--seeds`` seeds (each seed: another partition
and initialization), as a second sweep (a grid over ``seed``), and reports test accuracy: per method
the mean with its 95 % Student-t interval over seeds, and the paired difference (same seeds) against
Standalone and against the best other method with a paired t-test and a Wilcoxon signed-rank test.

Every sweep is a nested MLflow run under one ``compare`` parent run (the parent of its trials' runs);
``compare.md`` / ``compare.csv`` / plots go to ``--out`` and onto the parent. A phase's result is
written to ``<out>/phase1|phase2/<method>.json`` when it ends and never redone, and an interrupted
sweep resumes from Tune's state: rerun the same command to continue.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lcfed import registry
from lcfed.config import ExperimentConfig, load_config, require, resolve, safe_name
from lcfed.output_paths import check_output_dir
from lcfed.tracking import check_registry, check_tracking_store, resolve_tracking_uri
from tune_jobs import sweep  # a lazy package: Tune loads when a comparison first uses it, not with lcfed's parser
from tune_jobs.compare_report import METRIC, write_report
from tune_jobs.options import config_options, examples, verbosity_options
from tune_jobs.outdir import open_recorded, read_state, write_json
from tune_jobs.parent_run import ParentRun
from tune_jobs.reproduce import parse_seeds, summarize

COMPARE_SPACES = Path(__file__).resolve().parent / "spaces" / "compare"
#: the validation share of each device's training samples when the base config has none
DEFAULT_VAL_FRACTION = 0.2


def method_space(method: str, space_dir: str | Path | None) -> Path:
    """``<space_dir>/<method>.yaml`` (default: the bundled compare spaces, then the space a plugin method
    ships as its strategy's ``compare_space``: a YAML file's path)."""
    where = Path(space_dir) if space_dir is not None else COMPARE_SPACES
    path = where / f"{method}.yaml"
    shipped = getattr(registry.method(method).strategy, "compare_space", None)
    if space_dir is None and not path.is_file() and shipped is not None:
        path = Path(shipped)
    bundled = sorted(p.stem for p in COMPARE_SPACES.glob("*.yaml"))
    require(path.is_file(), "--methods", method,
            f"has no search space {path} (bundled: {bundled}; write one there, or pass --space-dir)")
    return path


def method_config(base: ExperimentConfig, method: str, val_fraction: float) -> ExperimentConfig:
    """The base config for ``method`` (settings the method shares with the base method carried over)."""
    return base.replace(**{"method.name": method, "data.val_fraction": val_fraction})


def _seed_rows(grid: Any) -> dict[int, dict[str, Any]]:
    """Per seed: the summary of its run (test accuracy over the last evaluations) and its curve."""
    rows: dict[int, dict[str, Any]] = {}
    for r in grid:
        if r.error is not None:
            raise RuntimeError(f"a phase-2 run failed: {r.error}")
        df = r.metrics_dataframe
        prefix = "lcfed/metrics/"
        cols = [c for c in df.columns if c.startswith(prefix)]
        history = [{c[len(prefix):]: float(v) for c, v in row.items() if isinstance(v, (int, float)) and not
                    (isinstance(v, float) and math.isnan(v))} for row in df[cols].to_dict("records")]
        history = [h for h in history if "round" in h]
        curve = [[h["round"], h["acc_mean"], h.get("bytes_up_total", 0.0) + h.get("bytes_down_total", 0.0),
                  h.get("sim_seconds_total", math.nan)] for h in history if "acc_mean" in h]
        # the assignment against a testbed's true groups, each round a method clustered
        recovery = [[h["round"], h.get("ari", math.nan), h.get("nmi", math.nan), h["num_clusters"]]
                    for h in history if "num_clusters" in h]
        last = (r.metrics or {}).get("lcfed") or {}
        devices = json.loads(last.get("devices") or "{}")
        rows[int(r.config["seed"])] = {**summarize(history), "curve": curve, "recovery": recovery, "devices": devices,
                                       "provenance": last.get("provenance") or {},
                                       "val_acc_mean": float(history[-1].get("val_acc_mean", math.nan)),
                                       "acc_new_mean": float(history[-1].get("acc_new_mean", math.nan))}
    return rows


def run_compare(
    base: ExperimentConfig,
    methods: Sequence[str],
    out: str | Path,
    *,
    budget: int = 8,
    seeds: Sequence[int] = (0, 1, 2),
    space_dir: str | Path | None = None,
    search: str = "random",
    scheduler: str = "asha",
    max_concurrent: int = 0,
    gpus_per_trial: float = 0.0,
    storage: str | Path | None = None,
    target: float | None = None,
    name: str | None = None,
    keep_checkpoints: int = sweep.DEFAULT_KEEP_CHECKPOINTS,
    register: str | None = None,
) -> dict[str, Any]:
    """Both phases for every method (what is on disk already is kept), then the report. ``keep_checkpoints``:
    per trial, as ``lcfed sweep``; ``register``: the best method's best phase-2 trial's model is registered
    under that name (as ``lcfed sweep --register``)."""
    out = Path(out)
    name = name or (out.name or "compare")
    require(safe_name(name), "--name", name, "letters, digits, '-', '_' and '.'")
    require(len(methods) >= 2 and len(set(methods)) == len(methods), "--methods", ",".join(methods),
            "at least two distinct methods")
    for m in methods:
        resolve("method", "--methods", m)
    require(budget >= 1, "--budget", budget, "trials per method, >= 1")
    require(len(seeds) >= 1, "--seeds", list(seeds), ">= 1 seed")
    require(target is None or 0 < target <= 1, "--target", target, "an accuracy in (0, 1]")
    sweep.check_keep(keep_checkpoints)
    check_registry(register)
    val_fraction = base.data.val_fraction or DEFAULT_VAL_FRACTION
    configs = {m: method_config(base, m, val_fraction) for m in methods}
    spaces = {m: sweep.load_space(method_space(m, space_dir), configs[m]) for m in methods}  # validated before work
    for m in methods:
        sweep.check_search(search, spaces[m])
    sweep.resolve_objective(base.train.rounds, METRIC, None, scheduler)
    for s in seeds:
        base.replace(seed=s)
    storage = storage or str(out.resolve() / "tune")
    sweep.load_sources(configs[methods[0]], {})  # a missing dataset fails here, before any run or file exists
    params = {"methods": ",".join(methods), "budget": str(budget), "seeds": ",".join(map(str, seeds)),
              "search": search, "scheduler": scheduler, "metric": METRIC, "val_fraction": str(val_fraction),
              "rounds": str(base.train.rounds), "base_digest": base.digest(), "name": name}
    state = read_state(out, params, "a comparison")  # other settings are refused before Ray starts
    # a rerun of a finished comparison only writes the report again: no sweep, so no Ray to start
    finished = state is not None and all((out / phase / f"{m}.json").exists()
                                         for m in methods for phase in ("phase1", "phase2"))
    with ParentRun(base.engine, resolve_tracking_uri(base.tracking.uri), "; rerun the same command to resume",
                   ray=not finished) as parent:
        if not finished:  # a multi-node cluster needs a storage every node reaches
            sweep.check_storage(sweep.storage_location(storage))
        return _run_phases(parent, base, methods, out, configs, spaces, params, state, budget=budget, seeds=seeds,
                           search=search, scheduler=scheduler, max_concurrent=max_concurrent,
                           gpus_per_trial=gpus_per_trial, storage=storage, target=target, name=name, keep=keep_checkpoints,
                           register=register)


def _run_phases(parent: ParentRun, base: ExperimentConfig, methods: Sequence[str], out: Path,
                configs: dict[str, ExperimentConfig], spaces: dict[str, Any], params: dict[str, str],
                state: dict[str, Any] | None, *, budget: int, seeds: Sequence[int], search: str, scheduler: str,
                max_concurrent: int, gpus_per_trial: float, storage: str, target: float | None, name: str, keep: int,
                register: str | None) -> dict[str, Any]:
    """Under the comparison's parent run (``params``; ``state``: what ``<out>/state.json`` recorded), phase 1
    then phase 2 for every method not finished before, then the report, also on the parent run."""
    out.mkdir(parents=True, exist_ok=True)
    client = parent.connect(base.tracking.experiment)
    parent_id = open_recorded(parent, out, state, name, {"compare_parent": "true"}, params)
    tracked = {"tracking.uri": parent.uri, "tracking.enabled": True}
    t0 = time.perf_counter()
    phase1: dict[str, dict[str, Any]] = {}
    phase2: dict[str, dict[int, dict[str, Any]]] = {}
    for i, m in enumerate(methods, 1):
        done = out / "phase1" / f"{m}.json"
        if done.exists():
            phase1[m] = json.loads(done.read_text())
            continue
        print(f"lcfed compare: phase 1, {m} ({i}/{len(methods)}): {budget} trials on {METRIC}", file=sys.stderr)
        summary = sweep.run_sweep(configs[m].replace(**tracked), spaces[m], num_samples=budget, scheduler=scheduler,
                                  max_concurrent=max_concurrent, gpus_per_trial=gpus_per_trial,
                                  name=f"{name}-{m}-tune", storage=storage, resume=True, metric=METRIC,
                                  search=search, parent_run_id=parent_id, keep_checkpoints=keep,
                                  log_models=False)  # tuning trials: the models that matter are phase 2's
        phase1[m] = {"best_config": summary["best_config"], METRIC: summary[f"best_{METRIC}"],
                     "trials": summary["trials"], "errors": summary["errors"], "run_id": summary["parent_run_id"]}
        write_json(done, phase1[m])
    for i, m in enumerate(methods, 1):
        done = out / "phase2" / f"{m}.json"
        if done.exists():
            phase2[m] = {int(k): v for k, v in json.loads(done.read_text()).items()}
            continue
        print(f"lcfed compare: phase 2, {m} ({i}/{len(methods)}): seeds {list(seeds)}", file=sys.stderr)
        from ray import tune  # Tune when a phase runs: `lcfed` imports this module to build its parser
        chosen = configs[m].replace(**tracked, **phase1[m]["best_config"])
        summary = sweep.run_sweep(chosen, {"seed": tune.grid_search(list(seeds))}, num_samples=1, scheduler="fifo",
                                  max_concurrent=max_concurrent, gpus_per_trial=gpus_per_trial,
                                  name=f"{name}-{m}-seeds", storage=storage, resume=True, metric=METRIC,
                                  parent_run_id=parent_id, keep_checkpoints=keep, named=phase1[m]["best_config"])
        phase2[m] = _seed_rows(sweep.restore_results(summary["storage"]))
        write_json(done, phase2[m])
    report = write_report(out, methods, list(seeds), phase1, phase2, target, base)
    client.log_text(parent_id, report["md"], "compare.md")
    client.log_text(parent_id, report["csv"], "compare.csv")
    for png in report["plots"]:
        client.log_artifact(parent_id, png, "plots")
    top = max(report["rows"], key=lambda r: r["test_acc_mean"])["method"]  # the report's first row
    registered = sweep.register_sweep_best(client, parent.uri, parent.experiment_id, f"{name}-{top}-seeds",
                                           register) if register else None
    return {"table": report["md"], "out": str(out), "parent_run_id": parent_id, "tracking_uri": parent.uri,
            "wall_seconds": time.perf_counter() - t0, "results": report["rows"], "registered": registered}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare", help="tune methods on one budget (validation), re-run them on seeds, report mean ± CI and "
        "paired tests",
        description="Compare methods fairly: phase 1 tunes each method by a sweep of --budget trials on "
        "validation accuracy; phase 2 runs each chosen config on --seeds seeds; the report gives the test "
        "accuracy's mean ± 95 % CI and paired tests between methods (compare.md, compare.csv, compare.png).",
        epilog=examples(
            "lcfed compare --config configs/digits_dirichlet.yaml --methods lcfed,fedavg,standalone,ifca",
            "lcfed compare --methods lcfed,standalone --budget 4 --seeds 0,5,9 --out outputs/cmp"))
    config_options(p, "base config (data, budget, engine, tracking)", "override a base field")
    p.add_argument("--methods", required=True, help="comma-separated, e.g. lcfed,fedavg,standalone,ifca")
    p.add_argument("--budget", type=int, default=8, help="phase-1 trials per method (default %(default)s)")
    p.add_argument("--seeds", default="3", help="phase-2 seeds: a count or a list, e.g. 3 or 0,5,9 (default 3)")
    p.add_argument("--space-dir", help="per-method search spaces <dir>/<method>.yaml (default: the bundled ones, "
                   "tune_jobs/spaces/compare)")
    p.add_argument("--search", default="random", help="phase-1 search (as lcfed sweep --search; default random)")
    p.add_argument("--scheduler", default="asha", help="phase-1 scheduler (as lcfed sweep; default asha)")
    p.add_argument("--max-concurrent", type=int, default=0, help="trials at once (0 = as resources allow)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial")
    p.add_argument("--target", type=float, help="test accuracy for bytes / simulated time to target "
                   "(default: 90 %% of the weakest method's)")
    p.add_argument("--out", default="outputs/compare", help="output directory; rerun with the same one to resume")
    p.add_argument("--storage", help="Tune storage (default <out>/tune; a URI every node reaches on a cluster)")
    p.add_argument("--name", help="MLflow parent run and sweep names (default: the --out directory's name)")
    p.add_argument("--keep-checkpoints", type=int, default=sweep.DEFAULT_KEEP_CHECKPOINTS, metavar="N",
                   help="checkpoints each trial keeps in the storage, the latest (default %(default)s)")
    p.add_argument("--register", metavar="NAME", help="register the model of the best method's best phase-2 trial "
                   "in the MLflow Model Registry as a new version of NAME, linked to its run")
    verbosity_options(p, "no progress tables: errors and the report only")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    base = load_config(args.config, args.set)
    check_output_dir(args.out, "--out")
    check_tracking_store(base.tracking.uri)  # a comparison is always tracked
    if args.storage is not None:
        check_output_dir(args.storage, "--storage")
    require(args.max_concurrent >= 0, "--max-concurrent", args.max_concurrent, "must be >= 0")
    require(args.gpus_per_trial >= 0, "--gpus-per-trial", args.gpus_per_trial, "must be >= 0")
    sweep.check_keep(args.keep_checkpoints)
    check_registry(args.register)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    result = run_compare(base, methods, args.out, budget=args.budget, seeds=parse_seeds(args.seeds),
                         space_dir=args.space_dir, search=args.search, scheduler=args.scheduler,
                         max_concurrent=args.max_concurrent, gpus_per_trial=args.gpus_per_trial,
                         storage=args.storage, target=args.target, name=args.name,
                         keep_checkpoints=args.keep_checkpoints, register=args.register)
    print(result["table"])
    print(f"lcfed compare: {result['out']}/compare.md, compare.csv, compare.png; MLflow parent run "
          f"{result['parent_run_id']} ({result['wall_seconds']:.0f} s)")
    if result["registered"]:
        reg = result["registered"]
        print(f"lcfed compare: registered {reg['uri']} ({reg['model']} models of run {reg['run_id']})")
    return 0
