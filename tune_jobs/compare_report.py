"""``lcfed compare``'s report: ``compare.md``, ``compare.csv`` and ``compare.png`` from both phases' results.

Accuracy is the test accuracy of each method's chosen config over seeds, with paired tests; with known
clusters (a ``data.testbed``, or ``leaf_synthetic``'s ``data.synthetic_clusters``) a second table scores each clustered method's final assignment
against the true groups (ARI, NMI) and the number of clusters it ended with against the true number.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lcfed.config import ExperimentConfig
from lcfed.learning.stats import mean_ci, paired_test
from lcfed.numerics import provenance
from tune_jobs.reproduce import last_evaluations

METRIC = "val_acc_mean"
#: the report's reference method (local training only)
REFERENCE = "standalone"


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
    private = any(not math.isnan(v) for r in rows for v in r["epsilon"])  # privacy.mode: central: an ε column
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
        "sim. s to target |" + (" newcomers' acc (%) |" if newcomers else "") + (" ε (δ) |" if private else "")
        + " chosen config |",
        "|---|---:|---|---|---:|---:|---:|" + ("---:|" if newcomers else "") + ("---:|" if private else "") + "---|",
    ]
    pairs = [(m, s) for m in methods for s in seeds]
    groups = provenance.fingerprint_groups([phase2[m][s].get("provenance") or {} for m, s in pairs],
                                         [f"{m} seed {s}" for m, s in pairs])
    if groups:  # before the table: its rows came from machines whose kernels give other bits
        lines[2:2] = ["**Warning:** these runs come from machines whose kernels differ (kernel fingerprints "
                      f"{groups}), so equal configs need not give equal numbers (`lcfed numerics`).", ""]
    for r in sorted(rows, key=lambda r: -r["test_acc_mean"]):
        cfg = ", ".join(f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                        for k, v in r["config"].items())
        mb = f"{r['bytes_to_target'] / 1e6:.1f}" if r["reached"] else "–"
        secs = f"{r['sim_seconds_to_target']:.0f}" if r["reached"] else "–"
        reached = "" if r["reached"] == len(seeds) else f" ({r['reached']}/{len(seeds)} seeds)"
        lines.append(f"| {r['method']} | {mean_ci(r['per_seed']).format(100)} | {diff(r['vs_standalone'])} | "
                     f"{diff(r['vs_best_other'])} vs {r['best_other']} | {100 * r['val_acc_mean']:.2f} | "
                     f"{mb}{reached} | {secs}{reached} | "
                     + (f"{mean_ci(r['acc_new']).format(100)} | " if newcomers else "")
                     + (f"{_epsilon_cell(r)} | " if private else "") + f"{cfg} |")
    lines += _device_pairs(methods, seeds, phase2, {r["method"]: r["best_other"] for r in rows})
    truth, source = known_groups(base)
    if truth:
        lines += _recovery_table(rows, truth, source)
    differ = provenance.differences([phase2[m][s].get("provenance") or {} for m in methods for s in seeds])
    if differ:
        lines += ["", "**Note:** the runs compared were produced under different numerics (torch's kernels, "
                  "profile or versions), so part of a difference may come from there: " + "; ".join(differ) + "."]
    md = "\n".join(lines) + "\n"
    table_csv = _report_csv(rows, seeds, newcomers, bool(truth))
    (out / "compare.md").write_text(md)
    (out / "compare.csv").write_text(table_csv)
    plots = _plots(out, methods, seeds, phase2, truth)
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
            "epsilon": [phase2[m][s].get("dp_epsilon", math.nan) for s in seeds],
            "delta": [phase2[m][s].get("dp_delta", math.nan) for s in seeds],
            **_final_recovery([phase2[m][s].get("recovery") or [] for s in seeds]),
        })
    return rows, target


def _epsilon_cell(row: dict[str, Any]) -> str:
    """The largest ε over the seeds (the guarantee every seed's run keeps) at its δ; ∞ for a run without privacy."""
    eps = [e for e in row["epsilon"] if not math.isnan(e)]
    if not eps:
        return "∞"
    return f"{max(eps):.2f} ({max(d for d in row['delta'] if not math.isnan(d)):.2g})"


def _final_recovery(per_seed: list[list[list[float]]]) -> dict[str, list[float]]:
    """Per seed, the last round's ARI, NMI and number of clusters (nan where a method never clustered)."""
    last = [rec[-1] if rec else [math.nan] * 4 for rec in per_seed]
    return {"ari": [r[1] for r in last], "nmi": [r[2] for r in last], "clusters": [r[3] for r in last]}


def known_groups(cfg: ExperimentConfig) -> tuple[int, str]:
    """How many true clusters the devices of ``cfg`` fall in and what makes them (0 where none are known):
    a testbed's groups, or ``leaf_synthetic``'s generated clusters."""
    d = cfg.data
    if d.testbed != "none":
        return d.testbed_groups, f"`{d.testbed}` testbed"
    if d.dataset == "leaf_synthetic" and d.synthetic_clusters:  # (lcfed.data.generated.GENERATED: not imported for it)
        return d.synthetic_clusters, "`leaf_synthetic` generator"
    return 0, ""


def _recovery_table(rows: list[dict[str, Any]], truth: int, source: str) -> list[str]:
    """Each clustered method's final assignment against the true groups, over seeds."""
    lines = ["", f"Cluster recovery against the {truth} true groups of the {source} (final round; "
             "ARI and NMI: mean ± 95 % CI over seeds; 1 = the true groups exactly).", "",
             f"| method | ARI | NMI | clusters found (true: {truth}) |", "|---|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: -(_nanmean(r["ari"]) or -1.0)):
        if all(math.isnan(v) for v in r["clusters"]):
            lines.append(f"| {r['method']} | – | – | – (no clusters) |")
            continue
        ari = [v for v in r["ari"] if not math.isnan(v)]
        nmi = [v for v in r["nmi"] if not math.isnan(v)]
        found = ", ".join("–" if math.isnan(k) else str(int(k)) for k in r["clusters"])
        lines.append(f"| {r['method']} | {mean_ci(ari).format(1, 3) if ari else '–'} | "
                     f"{mean_ci(nmi).format(1, 3) if nmi else '–'} | {found} |")
    return lines


def _report_csv(rows: list[dict[str, Any]], seeds: list[int], newcomers: bool, recovery: bool = False) -> str:
    """``compare.csv``: a line per method, every number of its row."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method", "test_acc_mean", "ci95", *[f"seed_{s}" for s in seeds], "diff_vs_standalone",
                "p_t_vs_standalone", "p_wilcoxon_vs_standalone", "best_other", "diff_vs_best_other",
                "p_t_vs_best_other", "p_wilcoxon_vs_best_other", "val_acc_mean", "bytes_to_target",
                "sim_seconds_to_target", "seeds_reaching_target", "acc_new_mean", "epsilon_max", "config",
                *(["ari_final", "nmi_final", "clusters_found"] if recovery else [])])
    for r in rows:
        ref, best = r["vs_standalone"], r["vs_best_other"]
        w.writerow([r["method"], r["test_acc_mean"], r["ci95"], *r["per_seed"],
                    ref.diff.mean if ref else "", ref.t_p if ref else "", ref.wilcoxon_p if ref else "",
                    r["best_other"], best.diff.mean, best.t_p, best.wilcoxon_p, r["val_acc_mean"],
                    r["bytes_to_target"], r["sim_seconds_to_target"], r["reached"],
                    float(np.mean(r["acc_new"])) if newcomers else "",
                    max((e for e in r["epsilon"] if not math.isnan(e)), default=""), json.dumps(r["config"]),
                    *([_nanmean(r["ari"]), _nanmean(r["nmi"]), ";".join("" if math.isnan(k) else str(int(k)) for k in r["clusters"])] if recovery else [])])
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


def _nanmean(values: list[float]) -> float | Literal[""]:
    """The mean of the values that are numbers; '' where none is (a method that never clustered)."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else ""


def _plots(out: Path, methods: Sequence[str], seeds: list[int], phase2: dict[str, Any], truth: int = 0) -> list[Path]:
    """Test accuracy vs round (mean over seeds, min–max band) and vs cumulative bytes; on a testbed, the
    ARI of each clustered method's assignment against the true groups vs round."""
    import matplotlib  # when the report is drawn: `lcfed` imports this module to build its parser

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # (the same)

    paths = []
    recovered = [m for m in methods if truth and all(phase2[m][s].get("recovery") for s in seeds)]
    fig, axes = plt.subplots(1, 3 if recovered else 2, figsize=(16.5 if recovered else 11, 4))
    ax1, ax2 = axes[0], axes[1]
    colours = {}
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
        colours[m] = line.get_color()
    if recovered:
        _plot_recovery(axes[2], recovered, seeds, phase2, colours, truth)
    ax1.set(xlabel="round (MLflow step)", ylabel="test accuracy (%)", title=f"mean over seeds {seeds}, min–max band")
    ax2.set(xlabel="bytes up + down (MB)", ylabel="test accuracy (%)", title="accuracy vs communication")
    for ax in axes:
        ax.grid(alpha=0.3)
    ax2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = out / "compare.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths




def _plot_recovery(ax: Any, methods: Sequence[str], seeds: list[int], phase2: dict[str, Any],
                   colours: dict[str, Any], truth: int) -> None:
    """ARI vs round, mean over seeds with a min–max band."""
    for m in methods:
        curves = [np.asarray(phase2[m][s]["recovery"], dtype=np.float64) for s in seeds]
        n = min(len(c) for c in curves)
        stack = np.stack([c[:n] for c in curves])
        rounds, ari = stack[0, :, 0], stack[:, :, 1]
        ax.plot(rounds, np.nanmean(ari, axis=0), label=m, color=colours.get(m))
        ax.fill_between(rounds, np.nanmin(ari, axis=0), np.nanmax(ari, axis=0), color=colours.get(m), alpha=0.2)
    ax.set(xlabel="round (MLflow step)", ylabel="ARI vs true groups", ylim=(-0.05, 1.05),
           title=f"cluster recovery ({truth} true groups)")
    ax.legend(loc="lower right", fontsize=8)
