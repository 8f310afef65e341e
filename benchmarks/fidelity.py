"""Fidelity check: the paper-setup runs of issue 14 against an independent implementation's figures.

Full MNIST, m = 100 devices, K = 10, D = 50, LeNet-5, SGD lr 0.01, batch 32, 50 minibatch steps per
round, every device every round, mu = lambda = 0.1; the unweighted mean over devices of
personalized test accuracy (``acc_mean``) at round 20 (and 100 for the long runs).

Each run's history is appended to ``--out`` (JSON lines) as soon as it ends, so an interrupted
check resumes where it stopped; ``--only`` picks runs, so several processes can share the list::

    python benchmarks/fidelity.py --data-dir ~/.cache/lcfed --only lcfed-dir100 fedavg-dir
    python benchmarks/fidelity.py --data-dir ~/.cache/lcfed --report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.config import load_config  # noqa: E402
from lcfed.engines.local import run_local  # noqa: E402
from lcfed.run.progress import ProgressBar  # noqa: E402

COMMON = ["train.local_steps=50", "train.eval_every=5", "train.participation=1.0"]  # mu = lambda = 0.1 in the configs
DIR, PATH = "configs/mnist_dirichlet.yaml", "configs/mnist_pathological.yaml"

#: name -> (config, method, rounds)
RUNS: dict[str, tuple[str, str, int]] = {
    "lcfed-dir100": (DIR, "lcfed", 100),
    "standalone-dir100": (DIR, "standalone", 100),
    "standalone-dir": (DIR, "standalone", 20),
    "fedavg-dir": (DIR, "fedavg", 20),
    "lcfed-path": (PATH, "lcfed", 20),
    "standalone-path": (PATH, "standalone", 20),
    "fedavg-path": (PATH, "fedavg", 20),
}

#: (config, method, round) -> the independent implementation's figure (issue 14)
REFERENCE: dict[tuple[str, str, int], float] = {
    (DIR, "lcfed", 20): 96.8,
    (DIR, "standalone", 20): 96.7,
    (DIR, "fedavg", 20): 82.4,
    (PATH, "lcfed", 20): 97.3,
    (PATH, "standalone", 20): 97.6,
    (DIR, "lcfed", 100): 98.1,
    (DIR, "standalone", 100): 96.8,
}


class EvalLog:
    """Appends each evaluation to ``<out>.evals`` as it happens, so long runs show their round-20
    figure (and an interrupted one its last) before they end."""

    def __init__(self, name: str, out: Path) -> None:
        self.name, self.path = name, out.with_suffix(".evals")

    def on_start(self, cfg: object, fed: object) -> None:
        pass

    def on_round(self, rnd: int, metrics: dict[str, float], stats: object) -> None:
        if "acc_mean" in metrics:
            with self.path.open("a") as f:
                f.write(json.dumps({"name": self.name, "round": rnd + 1, "acc_mean": metrics["acc_mean"]}) + "\n")

    def on_end(self, result: object) -> None:
        pass


def run(name: str, data_dir: str, out: Path, extra: list[str]) -> None:
    path, method, rounds = RUNS[name]
    cfg = load_config(ROOT / path, [*COMMON, f"method.name={method}", f"train.rounds={rounds}",
                                    f"data.data_dir={data_dir}", *extra])
    t0 = time.perf_counter()
    print(f"{name}: {path} method={method} rounds={rounds}", flush=True)
    result = run_local(cfg, [ProgressBar(), EvalLog(name, out)])
    row = {"name": name, "config": path, "method": method, "rounds": rounds, "overrides": extra,
           "seconds": round(time.perf_counter() - t0, 1),
           "acc_mean": {int(r["round"]) + 1: r["acc_mean"] for r in result.history if "acc_mean" in r}}
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{name}: {row['seconds']} s, acc_mean {row['acc_mean']}", flush=True)


def report(out: Path) -> None:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    evals = out.with_suffix(".evals")
    for line in evals.read_text().splitlines() if evals.exists() else []:
        e = json.loads(line)
        path, method, _ = RUNS[e["name"]]
        rows.append({"config": path, "method": method, "acc_mean": {str(e["round"]): e["acc_mean"]}})
    print("| data, partition | method | round | this project | independent | diff |")
    print("|---|---|---|---|---|---|")
    for (path, method, rnd), ref in REFERENCE.items():
        found = [r for r in rows if r["config"] == path and r["method"] == method and str(rnd) in r["acc_mean"]]
        label = "MNIST, Dirichlet 0.1" if path == DIR else "MNIST, pathological n=3"
        if not found:
            print(f"| {label} | {method} | {rnd} | (not run) | {ref:.1f} | |")
            continue
        acc = 100 * found[-1]["acc_mean"][str(rnd)]
        print(f"| {label} | {method} | {rnd} | {acc:.1f} | {ref:.1f} | {acc - ref:+.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="~/.cache/lcfed")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fidelity.jsonl")
    ap.add_argument("--only", nargs="+", choices=sorted(RUNS), help="these runs (default: all not yet in --out)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    ap.add_argument("--report", action="store_true", help="print the table from --out and stop")
    args = ap.parse_args()
    if args.report:
        report(args.out)
        return
    done = set()
    if args.out.exists():
        done = {json.loads(line)["name"] for line in args.out.read_text().splitlines() if line.strip()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.only or sorted(RUNS):
        if name in done and not args.only:
            continue
        run(name, args.data_dir, args.out, args.set)
    report(args.out)


if __name__ == "__main__":
    main()
