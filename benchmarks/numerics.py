"""Cost of the portable numerics profile: portable (ATen and oneDNN pinned at AVX2, MKL on its COMPATIBLE
branch, OpenBLAS on Haswell, numpy at x86-64-v3) against native (the kernels this CPU picks), paired in one run.

Workloads: the demo (``configs/demo.yaml``: LCFed, 20 devices, 25 rounds) and W1 (``overhead.py``'s:
100 devices from a 5,000-sample MNIST subset, FedAvg, 25 devices per round x 5 steps). A profile is
fixed at a process's first tensor op, so every run is its own ``lcfed run`` process; the two profiles
alternate for ``--pairs`` pairs (which one goes first alternates too). Figure: seconds per round (the
run's own ``seconds_per_round``), the ratio portable / native per pair and its median, the kernels
each ran, their kernel fingerprints and whether their numbers are equal. Each run's process gets its
profile from its start (``$LCFED_NUMERICS``), so numpy's kernels are the profile's too.

    python benchmarks/numerics.py [--pairs 2] [--workloads demo,w1] [--data-dir ~/.cache/lcfed]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from overhead import add_w1_arguments, w1  # noqa: E402

from lcfed.config import load_config, to_dict  # noqa: E402


def workload_config(name: str, args: argparse.Namespace, work: Path) -> Path:
    cfg = load_config(ROOT / "configs" / "demo.yaml", ["tracking.enabled=false"]) if name == "demo" else w1(args, "local")
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return path


def run(config: Path, profile: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "tune_jobs.cli", "run", "-c", str(config), "--no-track", "-q", "--json", str(out),
           "--set", f"engine.numerics={profile}"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "LCFED_NUMERICS": profile})
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_w1_arguments(ap)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--workloads", default="demo,w1")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lcfed-numerics-") as tmp:
        work = Path(tmp)
        for name in args.workloads.split(","):
            config = workload_config(name, args, work)
            pairs = []
            for i in range(args.pairs):
                order = ("portable", "native") if i % 2 == 0 else ("native", "portable")
                got = {p: run(config, p, work / f"{name}-{p}-{i}.json") for p in order}
                pairs.append(got)
                print(f"{name} pair {i + 1}: portable {got['portable']['seconds_per_round']:.3f} s/round, "
                      f"native {got['native']['seconds_per_round']:.3f}", file=sys.stderr)
            ratios = [p["portable"]["seconds_per_round"] / p["native"]["seconds_per_round"] for p in pairs]
            first = pairs[0]
            rows.append({
                "workload": name,
                "portable_s_per_round": [p["portable"]["seconds_per_round"] for p in pairs],
                "native_s_per_round": [p["native"]["seconds_per_round"] for p in pairs],
                "ratio_median": statistics.median(ratios),
                "kernels": {k: first[k]["provenance"]["kernels"] for k in ("portable", "native")},
                "fingerprint": {k: first[k]["provenance"]["fingerprint"] for k in ("portable", "native")},
                "acc_mean": {k: first[k]["last_evals"]["acc_mean"] for k in ("portable", "native")},
                "cpu": first["portable"]["provenance"]["cpu"], "cpu_isa": first["portable"]["provenance"]["cpu_isa"],
            })
    print(f"\ncpu: {rows[0]['cpu']} ({rows[0]['cpu_isa']}); {args.pairs} alternating pairs per workload")
    print(f"{'workload':<9} {'portable s/round':>18} {'native s/round':>16} {'ratio':>6}  {'kernels':<14} numbers")
    for r in rows:
        p = "/".join(f"{v:.3f}" for v in r["portable_s_per_round"])
        n = "/".join(f"{v:.3f}" for v in r["native_s_per_round"])
        kernels = f"{r['kernels']['portable']} / {r['kernels']['native']}"
        same = "equal" if r["acc_mean"]["portable"] == r["acc_mean"]["native"] else \
            f"differ ({r['acc_mean']['portable']:.4f} vs {r['acc_mean']['native']:.4f})"
        print(f"{r['workload']:<9} {p:>18} {n:>16} {r['ratio_median']:>6.2f}  {kernels:<14} {same}; fingerprints "
              f"{r['fingerprint']['portable']} / {r['fingerprint']['native']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "numerics.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
