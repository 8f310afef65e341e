"""The device model's cost at scale: s/round and peak RSS at m = 10^5 devices with it on, against the same run
with it off (paired, same machine, each in a process of its own).

Workload: ``benchmarks/scale_devices.py``'s (synthetic 1x28x28 images, LeNet-5, LCFed K = 10, 100 participants
per round, 5 local steps, ``--rounds`` rounds, the last evaluating every device, a checkpoint at the end). The
device model: lognormal speeds and links (log-sd 1), 50 ms latency, diurnal availability (half the day online),
10 % dropouts; synchronously with a 600 s deadline and 1.3x over-commitment, and asynchronously (FedBuff, B = 50
of the 100 in flight).

    python benchmarks/devices_scale.py [--devices 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLEET = ["devices.simulate=true", "devices.speed_sigma=1.0", "devices.bandwidth_sigma=1.0", "devices.latency_ms=50",
         "devices.availability=diurnal", "devices.online_fraction=0.5", "devices.dropout=0.1"]
VARIANTS = {
    "off": [],
    "sync": [*FLEET, "devices.deadline_seconds=600", "devices.overcommit=0.3"],
    "async": [*FLEET, "devices.aggregation=async", "devices.async_buffer=50", "method.num_clusters=10"],
}


def run(m: int, rounds: int, extra: list[str]) -> dict:
    """One federation in a process of its own (``scale_devices.py --one``): its peak RSS is its own."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "scale_devices.py"), "--one", str(m), "--rounds", str(rounds),
           *[f"--set={e}" for e in extra]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--order", nargs="+", choices=list(VARIANTS), default=["sync", "off", "async"],
                    help="the runs, in this order (one process each)")
    args = ap.parse_args()
    rows = {}
    for name in args.order:
        rows[name] = r = run(args.devices, args.rounds, VARIANTS[name])
        print(f"{name:>5}: start-up {r['startup_s']:6.1f} s, {r['s_per_round']:5.2f} s/round "
              f"({', '.join(f'{t:.2f}' for t in r['round_s'])}), peak RSS {r['peak_rss_gb']:.2f} GB, "
              f"final evaluation {r['final_eval_s']:.1f} s", flush=True)
    off = rows["off"]
    print(f"\nm = {args.devices:,}: device model on / off")
    for name in ("sync", "async"):
        r = rows[name]
        print(f"  {name:>5}: s/round x{r['s_per_round'] / off['s_per_round']:.2f}, peak RSS x"
              f"{r['peak_rss_gb'] / off['peak_rss_gb']:.3f} (+{(r['peak_rss_gb'] - off['peak_rss_gb']) * 1024:.0f} MB), "
              f"start-up x{r['startup_s'] / off['startup_s']:.2f}")


if __name__ == "__main__":
    main()
