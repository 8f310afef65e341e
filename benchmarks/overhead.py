"""Engine overhead on workload W1: in-process runner vs the Ray engine, same federation, same run.

W1: 100 devices from a 5,000-sample subset of MNIST, Dirichlet(0.1), LeNet-5, FedAvg with 25
devices per round x 5 local steps x batch 32, 30 rounds, 1 torch thread per worker. Engines:
``local-1`` = the in-process runner on one thread (the plain loop), ``local`` = in-process with
its default worker threads (one per CPU), ``ray`` = ``--actors`` device actors. Prints a
table (round time = mean over rounds after the first; total wall includes start-up) and writes
JSON. Needs MNIST in ``--data-dir`` (see docs/data.md, `lcfed data import`); ``--dataset digits`` runs
the same shape of workload without files.

    python benchmarks/overhead.py --data-dir ~/.cache/lcfed [--rounds 30] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.config import load_config  # noqa: E402


def w1(args: argparse.Namespace, engine: str) -> object:
    return load_config(None, [
        f"data.dataset={args.dataset}", f"data.data_dir={args.data_dir}", "data.partition=dirichlet",
        "data.alpha=0.1", "data.num_devices=100", f"data.subset={args.subset}", "data.min_samples=10",
        "method.name=fedavg", f"train.rounds={args.rounds}", "train.participation=0.25", "train.local_steps=5",
        "train.batch_size=32", "train.lr=0.01", f"train.eval_every={args.rounds}", "engine.torch_threads=1",
        f"engine.kind={'local' if engine.startswith('local') else 'ray'}", f"engine.num_actors={args.actors}",
        "tracking.enabled=false", *(["engine.workers=1"] if engine == "local-1" else []), *getattr(args, "set", []),
    ])


def tree_rss_mb(proc: psutil.Process) -> float:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


class PeakRSS:
    """Samples the RSS of a process tree at every round (observer)."""

    def __init__(self, root: psutil.Process) -> None:
        self.root, self.peak = root, 0.0

    def on_start(self, cfg, fed) -> None:
        self.peak = max(self.peak, tree_rss_mb(self.root))

    def on_round(self, rnd, metrics, stats) -> None:
        self.peak = max(self.peak, tree_rss_mb(self.root))

    def on_end(self, result) -> None: ...


def measure(args: argparse.Namespace, engine: str) -> dict:
    cfg = w1(args, engine)
    me = psutil.Process(os.getpid())
    rss = PeakRSS(me)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    if engine.startswith("local"):
        from lcfed.engines.local import run_local

        res = run_local(cfg, [rss])
    else:
        from actors.ray_engine import RayEngine

        # "ray": the private Ray lcfed starts itself (as `lcfed run --engine ray --private-ray`); "ray-head": an
        # attach to the running cluster in $RAY_ADDRESS (as `lcfed run --engine ray` beside `lcfed head`)
        sets = {"engine.num_cpus": args.actors, "engine.object_store_mb": 256} if engine == "ray" else {}
        deployed = RayEngine(cfg.replace(**sets))
        try:
            res = deployed.run([rss])
        finally:
            deployed.close()
        timings = deployed.timings
    wall = time.perf_counter() - t0
    rounds = [r["round_seconds"] for r in res.history[1:]]
    return {"engine": engine, "round_s": float(np.mean(rounds)), "round_s_std": float(np.std(rounds)),
            "wall_s": wall, "peak_rss_mb": rss.peak, "acc_mean": res.final.get("acc_mean"), "timings": timings,
            "rounds_s": float(sum(r["round_seconds"] for r in res.history))}


def add_w1_arguments(ap: argparse.ArgumentParser) -> None:
    """The options that shape workload W1 (shared with ``flower_overhead.py``)."""
    ap.add_argument("--data-dir", default="~/.cache/lcfed")
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--subset", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_w1_arguments(ap)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for both engines")
    args = ap.parse_args()
    rows = [measure(args, "local-1"), measure(args, "local"), measure(args, "ray")]
    base = rows[0]
    print(f"W1 ({args.dataset}, 100 devices, 25/round x 5 steps, {args.rounds} rounds, {args.actors} actors)")
    print(f"{'engine':<8} {'s/round':>9} {'ratio':>7} {'wall s':>8} {'ratio':>7} {'peak RSS MB':>12} {'acc':>7}")
    for r in rows:
        print(f"{r['engine']:<8} {r['round_s']:>9.4f} {r['round_s'] / base['round_s']:>7.2f} {r['wall_s']:>8.1f} "
              f"{r['wall_s'] / base['wall_s']:>7.2f} {r['peak_rss_mb']:>12.0f} {r['acc_mean']:>7.4f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps({"args": vars(args), "rows": rows,
                                                    "max_rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
                                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
