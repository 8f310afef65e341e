"""What client-level DP costs per round: the same federation with ``privacy.mode: central`` and without, paired
(alternating, each run in a process of its own, on the same machine).

Workload: ``benchmarks/scale_devices.py``'s (synthetic 1x28x28 images, LeNet-5, LCFed K = 10, D = 10, 100
participants per round, 5 local steps, ``--rounds`` rounds, the last evaluating every device). Privacy on: C = 1,
σ = 1, a noise cohort of 10,000; per round the server clips 100 updates twice (cluster model and embedding), draws
K + 1 noise vectors of LeNet-5's 61,706 numbers and the accountant composes the rounds so far; each device adds its
code's noise. Reports s/round (rounds after the first; the last without its full evaluation) and the ratio.

    python benchmarks/privacy_cost.py [--devices 100000] [--rounds 5] [--pairs 1] [--method lcfed]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from devices_scale import run  # noqa: E402  (one federation in a process of its own)

PRIVATE = ["privacy.mode=central", "privacy.noise_multiplier=1.0", "privacy.clip=1.0", "privacy.noise_cohort=10000"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--method", default="lcfed", choices=["lcfed", "ifca", "fedavg"])
    args = ap.parse_args()
    method = [f"method.name={args.method}"] + (["method.num_clusters=10"] if args.method == "ifca" else [])
    if args.method == "fedavg":
        method = ["method.name=fedavg"]
    load = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    rows: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(args.pairs):
        for name in (("off", "on") if i % 2 == 0 else ("on", "off")):
            r = run(args.devices, args.rounds, method + (PRIVATE if name == "on" else []))
            rows[name].append(r)
            print(f"{name:>3}: {r['s_per_round']:6.3f} s/round ({', '.join(f'{t:.2f}' for t in r['round_s'])}), "
                  f"start-up {r['startup_s']:.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB", flush=True)
    on = sum(r["s_per_round"] for r in rows["on"]) / args.pairs
    off = sum(r["s_per_round"] for r in rows["off"]) / args.pairs
    print(f"\nm = {args.devices:,}, {args.method}, {args.pairs} pair(s): privacy on {on:.3f} s/round, off {off:.3f} "
          f"s/round, x{on / off:.3f} (+{(on - off) * 1000:.0f} ms); load average {load} at the start, "
          f"{[float(x) for x in Path('/proc/loadavg').read_text().split()[:3]]} at the end")
    out = ROOT / "benchmarks" / "results" / "privacy_cost.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"devices": args.devices, "method": args.method, "rows": rows, "on_s": on, "off_s": off},
                              indent=1))


if __name__ == "__main__":
    main()
