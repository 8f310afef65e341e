"""The final evaluation at scale: every device against the seeded sample ``train.final_eval_devices: -1``
(auto) takes above 10,000 devices, paired, per m, on the in-process engine.

Workload: ``benchmarks/scale_devices.py``'s (synthetic images, LeNet-5, LCFed, 100 participants per round),
each m and each setting in a process of its own. Reports per m the final evaluation's seconds both ways
and their ratio, and the sample's ``acc_mean`` with its 95 % interval beside the full evaluation's
``acc_mean`` (the interval should hold it about 19 times in 20).

    python benchmarks/final_eval.py [--devices 20000 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(m: int, args: argparse.Namespace, final: int) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scale_devices.py"), "--one", str(m), "--rounds", str(args.rounds),
           "--participants", str(args.participants), "--set", f"train.final_eval_devices={final}"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--participants", type=int, default=100)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    print(f"{'m':>8} {'every device s':>14} {'sample s':>9} {'ratio':>6} {'scored':>7} "
          f"{'acc_mean (all)':>14} {'acc_mean (sample) ± 95 %':>25} {'held':>5}")
    for m in args.devices:
        full, sample = one(m, args, 0), one(m, args, -1)
        lo = sample["acc_mean"] - (sample["acc_mean_ci95"] or 0.0)
        hi = sample["acc_mean"] + (sample["acc_mean_ci95"] or 0.0)
        held = "yes" if lo <= full["acc_mean"] <= hi else "no"
        print(f"{m:>8,} {full['final_eval_s']:>14.1f} {sample['final_eval_s']:>9.1f} "
              f"{sample['final_eval_s'] / full['final_eval_s']:>6.2f} {sample['evaluated']:>7,} {full['acc_mean']:>14.4f} "
              f"{sample['acc_mean']:>14.4f} ± {sample['acc_mean_ci95'] or 0.0:.4f} {held:>5}", flush=True)
    print(f"load average at start {load0:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
