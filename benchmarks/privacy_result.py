"""The privacy result of docs/privacy.md: accuracy and ARI against ε ∈ {1, 2, 4, 8, ∞} for FedAvg, IFCA and LCFed
on a rotated testbed with known groups (IFCA's rotated digits: 4 groups, each seeing its own quarter turn, i.i.d.
labels inside a group), under ``privacy.mode: central`` with σ solved for each ε (``privacy.target_epsilon``) and a
noise cohort (``privacy.noise_cohort``: the noise of a deployment of N′ devices per round; a simulation, not a
guarantee for the simulated devices). ε = ∞ is ``privacy.mode: off``.

Each point: the mean over ``--seeds`` of the average of the last 3 evaluations. Writes the table, the JSON
(benchmarks/results/privacy_result.json) and the figure (docs/privacy_vs_epsilon.png).

    python benchmarks/privacy_result.py [--seeds 0 1] [--jobs 2] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EPSILONS = (1.0, 2.0, 4.0, 8.0, math.inf)
METHODS = {"fedavg": [], "ifca": ["method.num_clusters=4"], "lcfed": ["method.num_clusters=4", "method.rank=4"]}
BASE = ["data.dataset=digits", "data.testbed=rotated", "data.testbed_groups=4", "data.partition=iid",
        "data.num_devices=40", "data.test_fraction=0.3", "model.name=mlp", "train.rounds=30", "train.lr=0.1",
        "train.batch_size=32", "train.local_steps=10", "train.participation=0.5", "train.eval_every=3",
        "tracking.enabled=false"]
PRIVATE = ["privacy.mode=central", "privacy.clip=1.0", "privacy.noise_cohort=10000"]


def one(method: str, eps: float, seed: int, extra: list[str]) -> dict:
    from lcfed.config import load_config
    from lcfed.engines.local import run_local

    private = [] if math.isinf(eps) else [*PRIVATE, f"privacy.target_epsilon={eps}"]
    cfg = load_config(None, [*BASE, f"seed={seed}", f"method.name={method}", *METHODS[method], *private, *extra])
    if method == "lcfed" and cfg.privacy.on:  # the codes' noise: twice the joint σ that ε needs (docs/privacy.md)
        from lcfed.learning.accounting import solve_multiplier
        from lcfed.methods.privacy import delta, planned_rate

        joint = solve_multiplier(eps, delta(cfg), planned_rate(cfg), cfg.train.rounds)
        cfg = cfg.replace(**{"privacy.code_noise": round(2 * joint, 4)})
    res = run_local(cfg)
    evaluated = [row for row in res.history if "acc_mean" in row][-3:]

    def last(key: str) -> float:
        vals = [row[key] for row in evaluated if key in row]
        return sum(vals) / len(vals) if vals else float("nan")

    return {"method": method, "epsilon": eps, "seed": seed, "acc_mean": last("acc_mean"), "ari": last("ari"),
            "dp_epsilon": res.history[-1].get("dp_epsilon", math.inf),
            "sigma": res.history[-1].get("dp_noise_multiplier", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE")
    ap.add_argument("--replot", action="store_true", help="the table and figure from the last run's JSON")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "results"
    if args.replot:
        rows = json.loads((out / "privacy_result.json").read_text(), parse_constant=float)["rows"]
        rows = [{**r, "epsilon": float(r["epsilon"])} for r in rows]
    else:
        jobs = [(m, e, s) for m in METHODS for e in EPSILONS for s in args.seeds]
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(one, *zip(*jobs, strict=True), [args.extra] * len(jobs)))
    table: dict[tuple[str, float], dict[str, float]] = {}
    for m in METHODS:
        for e in EPSILONS:
            pts = [r for r in rows if r["method"] == m and r["epsilon"] == e]
            table[m, e] = {k: sum(r[k] for r in pts) / len(pts) for k in ("acc_mean", "ari", "dp_epsilon", "sigma")}
    print("| method | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |")
    print("|---|" + "---|" * len(EPSILONS))
    for m in METHODS:
        cells = [f"{table[m, e]['acc_mean']:.3f}" + ("" if m == "fedavg" else f" / {table[m, e]['ari']:.2f}")
                 for e in EPSILONS]
        print(f"| {m} | " + " | ".join(cells) + " |")
    print("(accuracy / ARI; σ solved: " + ", ".join(f"{m} ε={e:g}: {table[m, e]['sigma']:.2f}" for m in METHODS
                                                  for e in EPSILONS if not math.isinf(e)) + ")")
    out.mkdir(exist_ok=True)
    if not args.replot:
        (out / "privacy_result.json").write_text(json.dumps({"rows": rows, "seeds": args.seeds, "base": BASE,
                                                             "private": PRIVATE, "extra": args.extra}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    xs = list(range(len(EPSILONS)))
    colours = {"fedavg": "tab:blue", "ifca": "tab:orange", "lcfed": "tab:green"}  # the same in both panels
    for m in METHODS:
        axes[0].plot(xs, [table[m, e]["acc_mean"] for e in EPSILONS], marker="o", label=m, color=colours[m])
        if m != "fedavg":
            axes[1].plot(xs, [table[m, e]["ari"] for e in EPSILONS], marker="o", label=m, color=colours[m])
    for ax, title in zip(axes, ("mean test accuracy", "ARI against the rotation groups"), strict=True):
        ax.set_xticks(xs, [f"{e:g}" if math.isfinite(e) else "∞" for e in EPSILONS])
        ax.set_xlabel("ε (δ = population^-1.1)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("rotated digits, 40 devices, 20 per round, 30 rounds, noise cohort 10,000", fontsize=9)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "privacy_vs_epsilon.png", dpi=110)


if __name__ == "__main__":
    main()
