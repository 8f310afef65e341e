"""Cost against the number of devices m at a fixed number of participants per round (in-process engine).

Workload: synthetic 1x28x28 data, ``--samples-per-device`` x m samples (``data.synthetic_samples``) split
pathologically (2 classes per device, a third of each device's samples for its test set), LeNet-5
(``--data leaf``: ``leaf_synthetic``'s 60 features, a natural partition and the MLP instead),
LCFed with K = 10 and D = 10, ``--participants`` devices per round x 5 local steps x batch 32,
``--rounds`` rounds, the last of which evaluates every device (streamed in chunks); a checkpoint after
the last round. Each m runs in a process of its own, so its peak RSS (``ru_maxrss``; the in-process
engine is one process, the whole tree) is its own.

Reports per m: start-up (data generation, partition, hosts), s/round over the rounds after the first
(the first includes LCFed's cold start: PCA fit and k-means) with the last round's full evaluation
taken out and shown on its own, peak RSS, checkpoint size and the devices whose state exists.

    python benchmarks/scale.py --sweep [--devices 1000 10000 100000] [--rounds 5] [--state-mb 0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GB = 2**30


def config(m: int, args: argparse.Namespace, ckpt: str, extra: list[str] | None = None) -> Any:
    """The workload for m devices; ``extra`` overrides come last and win."""
    from lcfed.config import load_config

    kind = getattr(args, "data", "images")
    images = ["data.partition=pathological", "data.classes_per_device=2", "model.name=lenet5"]
    data = {"images": ["data.dataset=synthetic", f"data.synthetic_samples={args.samples_per_device * m}", *images],
            "leaf": ["data.dataset=leaf_synthetic", f"data.synthetic_samples={args.samples_per_device * m}",
                     "data.partition=natural", "model.name=mlp"],
            # the synthetic images, saved as a file dataset (scale_cluster.py writes it)
            "file": ["data.dataset=file", f"data.path=images-{args.samples_per_device * m}.npz",
                     f"data.data_dir={getattr(args, 'file_dir', '')}", *images]}[kind]
    return load_config(None, [
        *data, f"data.num_devices={m}",
        "data.min_samples=4", "data.test_fraction=0.34", "data.min_test_samples=1",
        "method.name=lcfed", "method.num_clusters=10", "method.rank=10", "method.mu=1.0", "method.lam=0.1",
        f"train.rounds={args.rounds}", f"train.participation={args.participants / m}", "train.local_steps=5",
        "train.batch_size=32", "train.lr=0.05", f"train.eval_every={args.rounds}",
        f"engine.state_memory_mb={getattr(args, 'state_mb', 0)}", "engine.torch_threads=1", "tracking.enabled=false",
        f"checkpoint.dir={ckpt}", *(extra or []),
    ])


def one(m: int, args: argparse.Namespace) -> dict[str, Any]:
    """One federation of ``m`` devices, in this process."""
    from lcfed import numerics
    from lcfed.engines.local import LocalEngine, LocalPool
    from lcfed.run.loop import run_rounds
    from lcfed.run.sources import load

    eval_s: list[float] = []

    class TimedPool(LocalPool):
        def evaluate(self, payload: Any, devices: Any = None) -> Any:
            t = time.perf_counter()
            out = super().evaluate(payload, devices)
            eval_s.append(time.perf_counter() - t)
            return out

    with tempfile.TemporaryDirectory(prefix="lcfed-scale-") as ckpt:
        cfg = config(m, args, ckpt, list(getattr(args, "extra", None) or []))
        numerics.activate(cfg.engine.numerics)
        t0 = time.perf_counter()
        engine = LocalEngine(cfg, load(cfg), cfg.engine.num_cpus or len(os.sched_getaffinity(0)))
        startup = time.perf_counter() - t0
        try:
            server = engine_server(engine)
            res = run_rounds(cfg, engine.setup.federation, server, TimedPool(engine.hosted))
            stored, spilled = len(engine.hosted.states), engine.hosted.states.spilled
        finally:
            engine.close()
        ckpt_mb = sum(f.stat().st_size for f in Path(ckpt).glob("latest*.pt")) / 2**20  # with its state parts
    rounds = [float(r["round_seconds"]) for r in res.history]
    rounds[-1] -= eval_s[-1]  # the last round without its evaluation of every device
    return {
        "devices": m, "participants": args.participants, "samples": args.samples_per_device * m, "startup_s": startup,
        "round_s": rounds, "s_per_round": float(np.mean(rounds[1:])), "final_eval_s": eval_s[-1],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "checkpoint_mb": ckpt_mb,
        "states_stored": stored, "states_spilled": spilled, "acc_mean": res.final.get("acc_mean"),
        "acc_mean_ci95": res.final.get("acc_mean_ci95"), "evaluated": len(res.evaluation),
        "coverage": res.history[-1]["coverage"],
    }


def engine_server(engine: Any) -> Any:
    from lcfed.engines.local import LocalServer

    return LocalServer(engine.setup.strategy())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--participants", type=int, default=100)
    ap.add_argument("--samples-per-device", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--state-mb", type=float, default=0.0, help="engine.state_memory_mb (0 = no limit)")
    ap.add_argument("--data", choices=["images", "leaf"], default="images",
                    help="synthetic images and LeNet-5, or leaf_synthetic and the MLP")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)  # the child process's m
    ap.add_argument("--set", action="append", default=[], dest="extra", metavar="KEY=VALUE",
                    help="a config override on top of the workload (e.g. the device model's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args)))
        return
    rows = []
    load0 = os.getloadavg()
    for m in args.devices:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(m), "--participants", str(args.participants),
               "--samples-per-device", str(args.samples_per_device), "--rounds", str(args.rounds),
               "--state-mb", str(args.state_mb), "--data", args.data, *[f"--set={e}" for e in args.extra]]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"m={m:>7,}: start-up {r['startup_s']:6.1f} s, {r['s_per_round']:5.2f} s/round, final evaluation "
              f"{r['final_eval_s']:6.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB, checkpoint {r['checkpoint_mb']:.1f} MB, "
              f"states {r['states_stored']} ({r['states_spilled']} spilled), acc_mean {r['acc_mean']:.3f}", flush=True)
    base = rows[0]["s_per_round"]
    print(f"\n{'m':>8} {'s/round':>8} {'x m0':>6} {'final eval s':>12} {'peak RSS GB':>11} {'ckpt MB':>8} {'states':>7}")
    for r in rows:
        print(f"{r['devices']:>8,} {r['s_per_round']:>8.2f} {r['s_per_round'] / base:>6.2f} {r['final_eval_s']:>12.1f} "
              f"{r['peak_rss_gb']:>11.2f} {r['checkpoint_mb']:>8.1f} {r['states_stored']:>7}")
    print(f"load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "scale_devices.json"
    path.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
