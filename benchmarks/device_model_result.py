"""docs/devices.md's result: clustered FL on devices that come and go.

Rotated MNIST (IFCA's testbed: 100 devices in 4 groups, images turned by 0/90/180/270 degrees), MLP, 20
devices per round (or in flight). A fleet of slow, uneven phones: compute and links lognormal (log-sd 1)
around 0.05 GFLOP/s and 1 Mbit/s, 50 ms latency, 5 % dropouts, each device online half of a 15-minute
"day" (a day compressed so that a run spans several). Two availability patterns:

- ``groups``: a device's online window follows its rotation group (group g starts at g/4 of the day,
  jitter 0.05): at any time about two of the four groups are online;
- ``random``: each device's window starts at a phase of its own, independent of its group.

Methods: LCFed, IFCA and FedAvg synchronously with a 120 s deadline and 1.3x over-commitment (30 rounds),
and FedBuff-FedAvg (20 in flight, B = 10, 60 aggregations: the same 600 updates). Each run logs ARI (the
clustered ones) and accuracy against the simulated clock.

    python benchmarks/device_model_result.py --data-dir ~/.cache/lcfed --out .bench/devices [--seeds 0 1]

Writes ``results.json`` (every run's history), ``result.md`` (the table docs/devices.md quotes) and
``accuracy_vs_clock.png`` (accuracy and ARI against the clock, one column per availability pattern).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.config import from_dict, load_config, to_dict  # noqa: E402
from lcfed.engines.local import run_local  # noqa: E402

TARGET = 0.80

FLEET = {
    "simulate": True, "speed_sigma": 1.0, "bandwidth_sigma": 1.0, "latency_ms": 50, "availability": "diurnal",
    "online_fraction": 0.5, "period_hours": 0.25, "phase_jitter": 0.05, "dropout": 0.05, "target_acc": TARGET,
}
SYNC = {"deadline_seconds": 120, "overcommit": 0.3}
ASYNC = {"aggregation": "async", "async_buffer": 10}

#: label -> (method section, devices policy, rounds)
RUNS: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
    "LCFed": ({"name": "lcfed", "num_clusters": 4, "rank": 4}, SYNC, 30),
    # the first clustering waits until every training device was seen (method.coverage)
    "LCFed, coverage 1": ({"name": "lcfed", "num_clusters": 4, "rank": 4, "coverage": 1.0}, SYNC, 30),
    "LCFed, coverage 0.75": ({"name": "lcfed", "num_clusters": 4, "rank": 4, "coverage": 0.75}, SYNC, 30),
    "IFCA": ({"name": "ifca", "num_clusters": 4}, SYNC, 30),
    "FedAvg": ({"name": "fedavg"}, SYNC, 30),
    "FedBuff-FedAvg": ({"name": "fedavg"}, ASYNC, 60),
}


def config(data_dir: str, label: str, phase: str, seed: int) -> Any:
    base = load_config(str(ROOT / "configs" / "rotated_mnist.yaml"))
    method, policy, rounds = RUNS[label]
    raw = to_dict(base)
    raw.update(name=re.sub(r"[^A-Za-z0-9._-]+", "-", f"devices-{label}-{phase}"), seed=seed, method=method)
    raw["data"]["data_dir"] = data_dir
    raw["train"].update(rounds=rounds, eval_every=3 if rounds == 30 else 6)
    raw["network"] = {"bandwidth_mbps": 1.0, "device_gflops": 0.05}
    raw["devices"] = {**FLEET, **policy, "phase": phase}
    raw["tracking"] = {"enabled": False}
    return from_dict(raw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="~/.cache/lcfed")
    p.add_argument("--out", default=".bench/devices")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--labels", nargs="+", choices=list(RUNS), default=list(RUNS),
                   help="the runs to make (those already in results.json are kept)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.exists() else {}
    for seed in args.seeds:
        for phase in ("groups", "random"):
            for label in args.labels:
                key = f"{label}/{phase}/{seed}"
                if key in results:
                    continue
                t0 = time.perf_counter()
                result = run_local(config(args.data_dir, label, phase, seed))
                results[key] = {"history": result.history, "wall_seconds": time.perf_counter() - t0}
                results_file.write_text(json.dumps(results))
                last = result.history[-1]
                print(f"{key}: acc_mean {last.get('acc_mean', float('nan')):.4f}, ari {last.get('ari', float('nan')):.3f}, "
                      f"clock {last['sim_clock_seconds'] / 3600:.2f} h, wall {time.perf_counter() - t0:.0f} s",
                      flush=True)
    (out / "result.md").write_text(table(results, args.seeds) + "\n")
    figure(results, args.seeds[0], out / "accuracy_vs_clock.png")
    print((out / "result.md").read_text())


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


def _reached(hours: list[float]) -> str:
    """The mean over the seeds that reached the target, and how many did."""
    got = [h for h in hours if h == h]
    return f"{_mean(got):.2f} ({len(got)}/{len(hours)})" if got else f"not reached (0/{len(hours)})"


def table(results: dict[str, Any], seeds: list[int]) -> str:
    rows = ["| method | availability | final acc (%) | final ARI | sim. hours | hours to 80 % (seeds) | kept / selected | "
            "mean staleness |", "|---|---|---|---|---|---|---|---|"]
    for phase in ("groups", "random"):
        for label in [x for x in RUNS if all(f"{x}/{phase}/{s}" in results for s in seeds)]:
            hist = [results[f"{label}/{phase}/{s}"]["history"] for s in seeds]
            last = [h[-1] for h in hist]
            reach = [next((r["sim_seconds_to_target"] / 3600 for r in h if "sim_seconds_to_target" in r), float("nan"))
                     for h in hist]
            kept = sum(r["devices_kept"] for h in hist for r in h)
            selected = sum(r["devices_selected"] for h in hist for r in h)
            stale = _mean([r.get("staleness_mean", float("nan")) for h in hist for r in h])
            ari = _mean([r.get("ari", float("nan")) for r in last])
            rows.append(f"| {label} | {'follows the groups' if phase == 'groups' else 'independent'} | "
                        f"{100 * _mean([r['acc_mean'] for r in last]):.1f} | {'–' if ari != ari else f'{ari:.2f}'} | "
                        f"{_mean([r['sim_clock_seconds'] / 3600 for r in last]):.2f} | "
                        f"{_reached(reach)} | "
                        f"{kept / selected:.2f} | {'–' if stale != stale else f'{stale:.2f}'} |")
    return "\n".join(rows) + f"\n\nSeeds: {', '.join(map(str, seeds))}."


def figure(results: dict[str, Any], seed: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex="col", layout="constrained")
    for col, phase in enumerate(("groups", "random")):
        for label in [x for x in RUNS if f"{x}/{phase}/{seed}" in results]:
            rows = [r for r in results[f"{label}/{phase}/{seed}"]["history"] if "acc_mean" in r]
            x = [r["sim_clock_seconds"] / 3600 for r in rows]
            axes[0, col].plot(x, [r["acc_mean"] for r in rows], label=label)
            if any("ari" in r for r in rows):
                axes[1, col].plot(x, [r.get("ari", float("nan")) for r in rows], label=label)
        axes[0, col].axhline(TARGET, color="grey", lw=0.8, ls=":")
        axes[0, col].set_title(f"availability {'follows the groups' if phase == 'groups' else 'independent of them'}")
        axes[1, col].set_xlabel("simulated clock (hours)")
    axes[0, 0].set_ylabel("acc_mean")
    axes[1, 0].set_ylabel("ARI")
    axes[0, 0].legend(loc="lower right")
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
