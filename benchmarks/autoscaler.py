"""cluster.yaml's autoscaler on this machine: a GPU sweep submitted to a head with no worker, GPU workers that come and go.

Ray's fake multi-node provider with the node types of ``cluster.yaml`` (``actors/fake_autoscaler.py`` derives its
config; ``--idle-minutes`` replaces the 10 minutes of ``idle_timeout_minutes``): a CPU head ``{CPU: 6, GPU: 0}``
alone, then ``lcfed sweep --gpus-per-trial 0.5`` of ``--trials`` configs of the tiny digits federation as a driver
on the head (attached as a submitted job is). Printed: the seconds from the sweep's start until the first worker
joins and the first trial is placed (Ray's own start and end times of the worker nodes; the rest sampled every
``--every`` seconds through the head's state API), trials in flight (placement groups placed / pending) against workers over
time, and the seconds from the last trial's end until the last worker is gone. No assertion; the test is
``tests/test_autoscaler.py``.

    .venv/bin/python benchmarks/autoscaler.py            # 4 trials: 2 gpu_worker nodes
    .venv/bin/python benchmarks/autoscaler.py --quick    # 2 trials: 1 gpu_worker
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.config import to_dict  # noqa: E402
from tests import autoscaling  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus-per-trial", type=float, default=0.5)
    ap.add_argument("--idle-minutes", type=float, default=0.25, help="the derived config's idle_timeout_minutes")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--quick", action="store_true", help="2 trials of 2 rounds")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.rounds = 2, 2

    tmp = Path(tempfile.mkdtemp(prefix="lcfed-autoscaler-"))
    base = tiny_config(f"train.rounds={args.rounds}", "engine.num_actors=1")
    config = autoscaling.write(tmp / "tiny.yaml", {**to_dict(base), "tracking": {"enabled": False}})
    mus = [round(0.1 * i, 3) for i in range(args.trials)]
    space = autoscaling.write(tmp / "space.yaml", {"method.mu": {"grid": mus}})
    load0 = os.getloadavg()[0]
    t_head = time.monotonic()
    cluster = autoscaling.start(args.idle_minutes)
    head_s = time.monotonic() - t_head
    try:
        assert cluster.head is not None
        timeline = autoscaling.Timeline(cluster, every=args.every).begin()
        wall0 = time.time()
        env = cluster.client_env(cluster.head.home, RAY_ADDRESS=cluster.gcs)
        out = tmp / "sweep.json"
        proc = subprocess.run(
            [sys.executable, "-m", "tune_jobs", "sweep", "--config", str(config), "--space", str(space), "-q",
             "--scheduler", "fifo", "--gpus-per-trial", f"{args.gpus_per_trial:g}", "--name", "bench",
             "--json", str(out), "--storage", f"file://{cluster.base / 'sweeps'}"],
            env=env, cwd=cluster.head.home, capture_output=True, text=True)
        sweep_s = time.time() - wall0
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-5000:], file=sys.stderr)
            return 1
        autoscaling.wait_for_workers(cluster, 0, timeout=600)
        time.sleep(args.every)
        timeline.end()
        times = autoscaling.worker_times(cluster)
        log = autoscaling.monitor_log(cluster)
        # each trial's last report (Tune's result.json lines carry the wall-clock timestamp)
        reports = [json.loads(line)["timestamp"] for f in (cluster.base / "sweeps" / "bench").glob("*/result.json")
                   for line in f.read_text().splitlines() if line.strip()]
    finally:
        cluster.stop()
    summary = json.loads(out.read_text())
    demand = timeline.first(lambda w, p, q: p + q > 0)
    placed = timeline.first(lambda w, p, q: p > 0)
    joined = sorted(start - wall0 for start, _ in times.values())
    ends = [end - wall0 for _, end in times.values() if end is not None]
    last_report = max(reports) - wall0 if reports else None
    print(f"head up in {head_s:.1f} s; sweep of {summary['trials']} trials ({summary['trial_engine']} trial engine, "
          f"--gpus-per-trial {args.gpus_per_trial:g}, {args.rounds} rounds) took {sweep_s:.1f} s; "
          f"idle_timeout_minutes {args.idle_minutes:g}; load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"workers added: {len(times)} ({', '.join(sorted(n[-5:] for n in times))}), "
          f"each {next(iter(timeline.seen.values()), {})}")
    if demand is not None and joined:
        print(f"trials first asked for a node by {demand:.1f} s (sampled); workers joined at "
              + ", ".join(f"{t:.1f}" for t in joined) + f" s (Ray's node start times): the first {joined[0] - demand:.1f} s "
              f"after the ask; first trial placed by {placed:.1f} s (sampled)")
    if last_report is not None and len(ends) == len(times) and ends:
        print(f"last trial's last report at {last_report:.0f} s (Tune's timestamp, whole seconds); workers gone at "
              + ", ".join(f"{t:.1f}" for t in sorted(ends)) + f" s: the last {max(ends) - last_report:.1f} s after it")
    print("\n   t (s)  workers  trials placed  pending")
    previous = None
    for t, w, p, q in timeline.samples:
        if (w, p, q) != previous:
            print(f"{t:8.1f}  {w:7d}  {p:13d}  {q:7d}")
            previous = (w, p, q)
    print("\nthe autoscaler's launches and terminations (monitor.log):")
    for line in log.splitlines():
        if any(k in line for k in ("Launching ", "Got ", "Terminating the node", "Queue ")):
            print("  " + line.replace("f" * 51, "f..."))
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "autoscaler.json").write_text(json.dumps({
        "args": vars(args), "head_s": head_s, "sweep_s": sweep_s, "first_ask_s": demand, "workers_joined_s": joined,
        "first_trial_placed_s": placed, "last_report_s": last_report, "workers_gone_s": sorted(ends),
        "workers": timeline.seen, "samples": timeline.samples, "load": [load0, os.getloadavg()[0]]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
