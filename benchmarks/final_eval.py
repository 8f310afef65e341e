"""The final evaluation at scale: scoring every device against scoring the seeded sample of 10,000 that
``train.final_eval_devices: -1`` (auto) takes above 10,000 devices, paired on the same federation.

Workload: ``benchmarks/scale_devices.py``'s (synthetic images, LeNet-5, LCFed with K = 10, 100 participants a
round), ``--rounds`` rounds, in-process, each m in a process of its own. Then, on the trained federation, the
evaluation the last round makes is timed both ways: every one of the m devices, and a seeded sample of
:data:`lcfed.run.rounds.FINAL_EVAL_AUTO` of them (the sample drawn as the loop draws it, here from all m devices:
a short run has only a few hundred trained ones, and the cost is the number scored). Reports the seconds of
each and their ratio, and the sample's mean accuracy with its 95 % interval beside the mean over every
device (the interval should hold it about 19 times in 20).

    python benchmarks/final_eval.py [--devices 20000 100000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def one(m: int, args: argparse.Namespace) -> dict:
    """One federation of ``m`` devices in this process: train, then evaluate every device and the sample."""
    from scale_devices import config

    from lcfed import numerics
    from lcfed.engines.local import LocalEngine, LocalPool, LocalServer
    from lcfed.learning.metrics import sampled_mean_ci95
    from lcfed.run.loop import run_rounds
    from lcfed.run.rounds import _EVAL_STREAM, FINAL_EVAL_AUTO
    from lcfed.run.sources import load

    with tempfile.TemporaryDirectory(prefix="lcfed-final-eval-") as ckpt:
        cfg = config(m, argparse.Namespace(samples_per_device=10, rounds=args.rounds, participants=100), ckpt,
                     ["checkpoint.dir=null", "train.final_eval_devices=100"])
        numerics.activate(cfg.engine.numerics)
        engine = LocalEngine(cfg, load(cfg), len(os.sched_getaffinity(0)))
        try:
            server = LocalServer(engine.setup.strategy())
            pool = LocalPool(engine.hosted)
            run_rounds(cfg, engine.setup.federation, server, pool)
            payload = server.eval_payload()
            t = time.perf_counter()
            every = pool.evaluate(payload)
            every_s = time.perf_counter() - t
            rng = np.random.default_rng([cfg.seed, cfg.train.rounds - 1, _EVAL_STREAM])
            sample = tuple(sorted(int(d) for d in rng.choice(m, size=min(FINAL_EVAL_AUTO, m // 2), replace=False)))
            t = time.perf_counter()
            sampled = pool.evaluate(payload, sample)
            sample_s = time.perf_counter() - t
        finally:
            engine.close()
    acc_all = np.array([r.correct / r.total for r in every.values() if r.total])
    acc_sample = np.array([r.correct / r.total for r in sampled.values() if r.total])
    assert all(sampled[d] == every[d] for d in sample)  # the sample's scores are the full evaluation's
    return {"devices": m, "every_s": every_s, "sample_s": sample_s, "scored": len(sample),
            "acc_all": float(acc_all.mean()), "acc_sample": float(acc_sample.mean()),
            "ci95": sampled_mean_ci95(acc_sample, len(acc_all))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args)))
        return
    load0 = os.getloadavg()[0]
    print(f"{'m':>8} {'every device s':>14} {'sample s':>9} {'ratio':>6} {'scored':>7} "
          f"{'acc_mean (all)':>14} {'acc_mean (sample) ± 95 %':>25} {'held':>5}", flush=True)
    for m in args.devices:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(m), "--rounds", str(args.rounds)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        held = "yes" if abs(r["acc_sample"] - r["acc_all"]) <= r["ci95"] else "no"
        print(f"{m:>8,} {r['every_s']:>14.1f} {r['sample_s']:>9.1f} {r['sample_s'] / r['every_s']:>6.2f} "
              f"{r['scored']:>7,} {r['acc_all']:>14.4f} {r['acc_sample']:>14.4f} ± {r['ci95']:.4f} {held:>5}", flush=True)
    print(f"load average at start {load0:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
