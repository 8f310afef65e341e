"""The node read path against the driver's on one node, paired: W1's Ray run (``benchmarks/overhead.py``'s
:func:`w1`: 100 devices from a 5,000-sample subset of MNIST, 2 device actors on a private Ray) with
``engine.data_reads=auto`` (the actors read their rows of the cached file) and ``driver`` (the driver reads and
sends them), alternated, each in a fresh process. Prints, per run, the engine's start phases (its ``timings``),
round 0 and the start plus round 0 (where a read's cost lands), and the medians per mode.

    python benchmarks/node_reads.py --data-dir ~/.cache/lcfed [--pairs 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("auto", "driver")


def one(data_dir: str, mode: str, rounds: int) -> dict[str, object]:
    """One Ray run of W1 in this process: its start phases and round times."""
    from overhead import w1  # benchmarks/, this script's directory (it puts the project on the path)

    from actors.ray_engine import RayEngine

    cfg = w1(argparse.Namespace(dataset="mnist", data_dir=data_dir, subset=5000, rounds=rounds, actors=2,
                                set=[f"engine.data_reads={mode}"]), "ray")

    class Rounds:
        def __init__(self) -> None:
            self.t, self.seconds = 0.0, []

        def on_start(self, cfg, fed) -> None:
            self.t = time.perf_counter()

        def on_round(self, rnd, metrics, stats) -> None:
            now = time.perf_counter()
            self.seconds.append(now - self.t)
            self.t = now

        def on_end(self, result) -> None:
            pass

    t0 = time.perf_counter()
    engine = RayEngine(cfg)
    start = time.perf_counter() - t0
    seen = Rounds()
    try:
        engine.run([seen])
    finally:
        engine.close()
    phases = {k: v for k, v in engine.timings.items() if k not in ("close", "ray_shutdown")}
    after_ray = start - phases.get("ray_start", phases.get("ray_attach", 0.0))
    return {"mode": mode, "data_reads": engine.data_reads, "phases": phases, "round0": seen.seconds[0],
            "later": statistics.mean(seen.seconds[1:]) if len(seen.seconds) > 1 else float("nan"),
            "start_and_round0": after_ray + seen.seconds[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="~/.cache/lcfed")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child: one run, its JSON on stdout
    args = ap.parse_args()
    data_dir = os.path.expanduser(args.data_dir)
    if args.one:
        print(json.dumps(one(data_dir, args.one, args.rounds)))
        return 0
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(args.pairs):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--data-dir", data_dir, "--rounds", str(args.rounds),
                                  "--one", mode], capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[mode].append(r)
            phases = "  ".join(f"{k} {v:.2f}" for k, v in r["phases"].items() if not k.startswith("ray_"))
            print(f"pair {i + 1} {mode:6s} ({r['data_reads']}): {phases}  round0 {r['round0']:.2f}  "
                  f"later {r['later']:.2f}  start+round0 {r['start_and_round0']:.2f} s", flush=True)
    print("\nmedians (s): engine start after Ray, plus round 0; later rounds")
    for mode in MODES:
        both = statistics.median(r["start_and_round0"] for r in runs[mode])
        later = statistics.median(r["later"] for r in runs[mode])
        print(f"  {mode:6s} {both:6.2f}  {later:6.2f}")
    ratio = (statistics.median(r["start_and_round0"] for r in runs["auto"])
             / statistics.median(r["start_and_round0"] for r in runs["driver"]))
    print(f"  auto / driver: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
