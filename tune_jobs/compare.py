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
import csv
import io
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lcfed import numerics, registry
from lcfed.config import (
    ExperimentConfig,
    check_output_dir,
    load_config,
    require,
    resolve,
    safe_name,
)
from lcfed.stats import mean_ci, paired_test
from lcfed.tracking import check_tracking_store, resolve_tracking_uri
from tune_jobs import sweep  # a lazy package: Tune loads when a comparison first uses it, not with lcfed's parser
from tune_jobs.options import config_options, examples, verbosity_options
from tune_jobs.outdir import open_recorded, read_state, write_json
from tune_jobs.parent_run import ParentRun
from tune_jobs.reproduce import last_evaluations, parse_seeds, summarize

COMPARE_SPACES = Path(__file__).resolve().parent / "spaces" / "compare"
#: the validation share of each device's training samples when the base config has none
DEFAULT_VAL_FRACTION = 0.2
METRIC = "val_acc_mean"
#: the report's reference method (local training only)
REFERENCE = "standalone"


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
        last = (r.metrics or {}).get("lcfed") or {}
        devices = json.loads(last.get("devices") or "{}")
        rows[int(r.config["seed"])] = {**summarize(history), "curve": curve, "devices": devices,
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
) -> dict[str, Any]:
    """Both phases for every method (what is on disk already is kept), then the report."""
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
    with ParentRun(base.engine, resolve_tracking_uri(base.tracking.uri), "; rerun the same command to resume") as parent:
        sweep.check_storage(sweep.storage_location(storage))  # a multi-node cluster needs a storage every node reaches
        return _run_phases(parent, base, methods, out, configs, spaces, budget=budget, seeds=seeds, search=search,
                           scheduler=scheduler, max_concurrent=max_concurrent, gpus_per_trial=gpus_per_trial,
                           storage=storage, target=target, name=name, val_fraction=val_fraction)


def _run_phases(parent: ParentRun, base: ExperimentConfig, methods: Sequence[str], out: Path,
                configs: dict[str, ExperimentConfig], spaces: dict[str, Any], *, budget: int, seeds: Sequence[int],
                search: str, scheduler: str, max_concurrent: int, gpus_per_trial: float, storage: str,
                target: float | None, name: str, val_fraction: float) -> dict[str, Any]:
    """Under the comparison's parent run (recorded in ``<out>/state.json``), phase 1 then phase 2 for every
    method not finished before, then the report, also on the parent run."""
    from ray import tune  # Tune when a comparison runs: `lcfed` imports this module to build its parser

    params = {"methods": ",".join(methods), "budget": str(budget), "seeds": ",".join(map(str, seeds)),
              "search": search, "scheduler": scheduler, "metric": METRIC, "val_fraction": str(val_fraction),
              "rounds": str(base.train.rounds), "base_digest": base.digest(), "name": name}
    state = read_state(out, params, "a comparison")
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
                                  search=search, parent_run_id=parent_id)
        phase1[m] = {"best_config": summary["best_config"], METRIC: summary[f"best_{METRIC}"],
                     "trials": summary["trials"], "errors": summary["errors"], "run_id": summary["parent_run_id"]}
        write_json(done, phase1[m])
    for i, m in enumerate(methods, 1):
        done = out / "phase2" / f"{m}.json"
        if done.exists():
            phase2[m] = {int(k): v for k, v in json.loads(done.read_text()).items()}
            continue
        print(f"lcfed compare: phase 2, {m} ({i}/{len(methods)}): seeds {list(seeds)}", file=sys.stderr)
        chosen = configs[m].replace(**tracked, **phase1[m]["best_config"])
        summary = sweep.run_sweep(chosen, {"seed": tune.grid_search(list(seeds))}, num_samples=1, scheduler="fifo",
                                  max_concurrent=max_concurrent, gpus_per_trial=gpus_per_trial,
                                  name=f"{name}-{m}-seeds", storage=storage, resume=True, metric=METRIC,
                                  parent_run_id=parent_id, named=phase1[m]["best_config"])
        phase2[m] = _seed_rows(sweep.restore_results(summary["storage"]))
        write_json(done, phase2[m])
    report = write_report(out, methods, list(seeds), phase1, phase2, target, base)
    client.log_text(parent_id, report["md"], "compare.md")
    client.log_text(parent_id, report["csv"], "compare.csv")
    for png in report["plots"]:
        client.log_artifact(parent_id, png, "plots")
    return {"table": report["md"], "out": str(out), "parent_run_id": parent_id, "tracking_uri": parent.uri,
            "wall_seconds": time.perf_counter() - t0, "results": report["rows"]}


def _first_reaching(curve: list[list[float]], target: float) -> tuple[float, float] | None:
    """(bytes, simulated seconds) at the first evaluation with accuracy >= target."""
    for _, acc, nbytes, secs in curve:
        if acc >= target:
            return nbytes, secs
    return None


def write_report(out: Path, methods: Sequence[str], seeds: list[int], phase1: dict[str, Any],
                 phase2: dict[str, dict[int, dict[str, Any]]], target: float | None,
                 base: ExperimentConfig) -> dict[str, Any]:
    """``compare.md``, ``compare.csv`` and the plots; returns them and the rows. With held-out devices
    (``data.holdout_fraction``) the newcomers' test accuracy gets its own column."""
    rows, target = _report_rows(methods, seeds, phase1, phase2, target)
    # devices held out of training (data.holdout_fraction): their accuracy after joining, a column of its own
    newcomers = any(not math.isnan(v) for r in rows for v in r["acc_new"])
    averaged = last_evaluations({f"{m}/{seed}": row for m in methods for seed, row in phase2[m].items()})

    def diff(t: Any) -> str:
        if t is None:
            return "–"
        return f"{100 * t.diff.mean:+.2f} ± {100 * t.diff.half:.2f} (p = {t.t_p:.3g}, W p = {t.wilcoxon_p:.3g})" \
            if not math.isnan(t.diff.half) else f"{100 * t.diff.mean:+.2f}"

    lines = [
        f"# Comparison: {base.data.dataset}, {base.data.num_devices} devices, {base.train.rounds} rounds", "",
        f"Phase 1: each method tuned by {phase1[methods[0]]['trials']} trials on validation accuracy "
        f"(`{METRIC}`). Phase 2: its chosen config on seeds {seeds}. Test accuracy (%) = mean over devices, "
        f"averaged over the {averaged}; mean ± 95 % CI over seeds. Differences are paired by "
        "seed: mean ± 95 % CI, paired t-test p and Wilcoxon signed-rank p (W p). "
        f"Target for bytes / simulated time: {100 * target:.1f} % test accuracy.", "",
        "| method | test acc (%) | vs standalone | vs best other | val acc (phase 1) | MB to target | "
        "sim. s to target |" + (" newcomers' acc (%) |" if newcomers else "") + " chosen config |",
        "|---|---:|---|---|---:|---:|---:|" + ("---:|" if newcomers else "") + "---|",
    ]
    for r in sorted(rows, key=lambda r: -r["test_acc_mean"]):
        cfg = ", ".join(f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                        for k, v in r["config"].items())
        mb = f"{r['bytes_to_target'] / 1e6:.1f}" if r["reached"] else "–"
        secs = f"{r['sim_seconds_to_target']:.0f}" if r["reached"] else "–"
        reached = "" if r["reached"] == len(seeds) else f" ({r['reached']}/{len(seeds)} seeds)"
        lines.append(f"| {r['method']} | {mean_ci(r['per_seed']).format(100)} | {diff(r['vs_standalone'])} | "
                     f"{diff(r['vs_best_other'])} vs {r['best_other']} | {100 * r['val_acc_mean']:.2f} | "
                     f"{mb}{reached} | {secs}{reached} | "
                     + (f"{mean_ci(r['acc_new']).format(100)} | " if newcomers else "") + f"{cfg} |")
    lines += _device_pairs(methods, seeds, phase2, {r["method"]: r["best_other"] for r in rows})
    differ = numerics.differences([phase2[m][s].get("provenance") or {} for m in methods for s in seeds])
    if differ:
        lines += ["", "**Note:** the runs compared were produced under different numerics (torch's kernels, "
                  "profile or versions), so part of a difference may come from there: " + "; ".join(differ) + "."]
    md = "\n".join(lines) + "\n"
    table_csv = _report_csv(rows, seeds, newcomers)
    (out / "compare.md").write_text(md)
    (out / "compare.csv").write_text(table_csv)
    plots = _plots(out, methods, seeds, phase2)
    return {"md": md, "csv": table_csv, "plots": plots, "rows": rows}


def _report_rows(methods: Sequence[str], seeds: list[int], phase1: dict[str, Any],
                 phase2: dict[str, dict[int, dict[str, Any]]], target: float | None) -> tuple[list[dict[str, Any]], float]:
    """A row per method: its test accuracy over seeds, the paired tests against Standalone and the best other
    method, what it took to reach ``target``; and the target (default: 90 % of the weakest method's mean)."""
    acc = {m: [phase2[m][s]["acc_mean"] for s in seeds] for m in methods}
    cis = {m: mean_ci(acc[m]) for m in methods}
    if target is None:  # reached by every method on average: 90 % of the weakest method's accuracy
        target = 0.9 * min(ci.mean for ci in cis.values())
    rows = []
    for m in methods:
        others = [o for o in methods if o != m]
        best_other = max(others, key=lambda o: cis[o].mean)
        vs_ref = paired_test(acc[m], acc[REFERENCE]) if REFERENCE in methods and m != REFERENCE else None
        vs_best = paired_test(acc[m], acc[best_other])
        reached = [r for r in (_first_reaching(phase2[m][s]["curve"], target) for s in seeds) if r is not None]
        nbytes = phase2[m][seeds[0]]["bytes_up_total"] + phase2[m][seeds[0]]["bytes_down_total"]
        rows.append({
            "method": m, "config": phase1[m]["best_config"], "val_acc_mean": phase1[m][METRIC],
            "test_acc_mean": cis[m].mean, "ci95": cis[m].half, "per_seed": acc[m],
            "vs_standalone": vs_ref, "best_other": best_other, "vs_best_other": vs_best,
            "reached": len(reached), "bytes_to_target": float(np.mean([r[0] for r in reached])) if reached else math.nan,
            "sim_seconds_to_target": float(np.mean([r[1] for r in reached])) if reached else math.nan,
            "bytes_total": nbytes,
            "acc_new": [phase2[m][s].get("acc_new_mean", math.nan) for s in seeds],
        })
    return rows, target


def _report_csv(rows: list[dict[str, Any]], seeds: list[int], newcomers: bool) -> str:
    """``compare.csv``: a line per method, every number of its row."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method", "test_acc_mean", "ci95", *[f"seed_{s}" for s in seeds], "diff_vs_standalone",
                "p_t_vs_standalone", "p_wilcoxon_vs_standalone", "best_other", "diff_vs_best_other",
                "p_t_vs_best_other", "p_wilcoxon_vs_best_other", "val_acc_mean", "bytes_to_target",
                "sim_seconds_to_target", "seeds_reaching_target", "acc_new_mean", "config"])
    for r in rows:
        ref, best = r["vs_standalone"], r["vs_best_other"]
        w.writerow([r["method"], r["test_acc_mean"], r["ci95"], *r["per_seed"],
                    ref.diff.mean if ref else "", ref.t_p if ref else "", ref.wilcoxon_p if ref else "",
                    r["best_other"], best.diff.mean, best.t_p, best.wilcoxon_p, r["val_acc_mean"],
                    r["bytes_to_target"], r["sim_seconds_to_target"], r["reached"],
                    float(np.mean(r["acc_new"])) if newcomers else "", json.dumps(r["config"])])
    return buf.getvalue()


def _device_pairs(methods: Sequence[str], seeds: list[int], phase2: dict[str, Any],
                  best_other: dict[str, str]) -> list[str]:
    """Within each seed the methods saw the same devices: each method against Standalone (or, without it,
    the best other method) device by device, per seed (the last evaluation's accuracy)."""
    ref = REFERENCE if REFERENCE in methods else None
    head = [f"seed {s}" for s in seeds]
    lines = ["", f"Paired over devices within each seed (last evaluation, the devices both counted): difference (%) "
             f"against {ref or 'the best other method'}, paired t-test p.", "",
             "| method | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    rows = 0
    for m in methods:
        other = ref or best_other[m]
        if m == other:
            continue
        cells = []
        for s in seeds:
            a, b = phase2[m][s].get("devices") or {}, phase2[other][s].get("devices") or {}
            common = sorted(set(a) & set(b), key=int)
            if len(common) < 2:
                cells.append("–")
                continue
            t = paired_test([a[d] for d in common], [b[d] for d in common])
            cells.append(f"{100 * t.diff.mean:+.2f} (p = {t.t_p:.2g}, n = {t.n})")
        rows += 1
        lines.append(f"| {m} vs {other} | " + " | ".join(cells) + " |")
    return lines if rows else []


def _plots(out: Path, methods: Sequence[str], seeds: list[int], phase2: dict[str, Any]) -> list[Path]:
    """Test accuracy vs round (mean over seeds, min–max band) and vs cumulative bytes."""
    import matplotlib  # when the report is drawn: `lcfed` imports this module to build its parser

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # (the same)

    paths = []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for m in methods:
        curves = [np.asarray(phase2[m][s]["curve"], dtype=np.float64) for s in seeds]
        n = min(len(c) for c in curves)
        if n == 0:
            continue
        stack = np.stack([c[:n] for c in curves])
        rounds, accs, nbytes = stack[0, :, 0], 100 * stack[:, :, 1], stack[:, :, 2].mean(axis=0) / 1e6
        (line,) = ax1.plot(rounds, accs.mean(axis=0), label=m)
        ax1.fill_between(rounds, accs.min(axis=0), accs.max(axis=0), color=line.get_color(), alpha=0.2)
        ax2.plot(nbytes, accs.mean(axis=0), label=m, color=line.get_color())
    ax1.set(xlabel="round (MLflow step)", ylabel="test accuracy (%)", title=f"mean over seeds {seeds}, min–max band")
    ax2.set(xlabel="bytes up + down (MB)", ylabel="test accuracy (%)", title="accuracy vs communication")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = out / "compare.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


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
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    result = run_compare(base, methods, args.out, budget=args.budget, seeds=parse_seeds(args.seeds),
                         space_dir=args.space_dir, search=args.search, scheduler=args.scheduler,
                         max_concurrent=args.max_concurrent, gpus_per_trial=args.gpus_per_trial,
                         storage=args.storage, target=args.target, name=args.name)
    print(result["table"])
    print(f"lcfed compare: {result['out']}/compare.md, compare.csv, compare.png; MLflow parent run "
          f"{result['parent_run_id']} ({result['wall_seconds']:.0f} s)")
    return 0
