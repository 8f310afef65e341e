"""GPU throughput: 100 devices per round, in-process and with 1, 4 and 8 device actors sharing one GPU.

Workload (the anchors' in ``../shared/device/README.md``): FedAvg, LeNet-5, 100 devices all
taking part every round, 5 local steps x batch 32, lr 0.01; data = the generated ``synthetic``
dataset (MNIST-shaped, no files needed), Dirichlet(0.5) over 100 devices, ~500 samples each.
Every device's data lives on the GPU of the process that hosts it. Rows:

- ``local loop``: the in-process runner, devices one after another (``engine.vectorize=never``);
- ``local vmap``: the in-process runner, each step of all 100 devices one ``vmap`` call;
- ``ray N vmap`` / ``ray N loop``: the Ray engine with N device actors of ``num_gpus = 1/N`` each
  (fractional GPUs), plus the server actor.

s/round = mean over the timed rounds (after ``--warmup`` rounds; the last round, which also
evaluates every device, is left out). Printed next to the anchors measured on the same H100 with a
hand-written loop (plain 1.1 s, vmap 48 ms, vmap + torch.compile 21 ms, 8-actor Ray pool with
vmap 70-110 ms) and the targets (in-process <= 30 ms, Ray <= 60 ms). Each run's per-round
training losses are compared with the in-process loop's (vmap changes the last bits only).

    python benchmarks/gpu.py                       # on the GPU machine (see benchmarks/README.md)
    python benchmarks/gpu.py --device cpu --quick  # smoke run of the same code path on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.config import ExperimentConfig, load_config  # noqa: E402

ANCHORS_S = {"plain loop": 1.1, "vmap": 0.048, "vmap + compile": 0.021, "ray 8 actors + vmap": 0.09}
TARGETS_S = {"local": 0.030, "ray": 0.060}


def workload(args: argparse.Namespace, engine: str, vectorize: str, actors: int = 0) -> ExperimentConfig:
    rounds = args.warmup + args.rounds + 1
    return load_config(None, [
        "data.dataset=synthetic", "data.partition=dirichlet", "data.alpha=0.5", f"data.num_devices={args.devices}",
        "data.samples_per_device=[500, 500]", "method.name=fedavg", f"train.rounds={rounds}",
        "train.participation=1.0", "train.local_steps=5", "train.batch_size=32", "train.lr=0.01",
        f"train.eval_every={rounds}", f"engine.kind={engine}", f"engine.device={args.device}",
        f"engine.vectorize={vectorize}", "engine.workers=1", "engine.torch_threads=1",
        f"engine.num_actors={actors}", f"engine.cpus_per_actor={args.cpus_per_actor}", "tracking.enabled=false",
    ])


def summarize(name: str, res: Any, start_s: float, args: argparse.Namespace) -> dict[str, Any]:
    timed = [r["round_seconds"] for r in res.history[args.warmup : -1]]
    s = float(np.mean(timed))
    return {
        "run": name,
        "s_round": s,
        "s_round_std": float(np.std(timed)),
        "devices_per_s": args.devices / s,
        "startup_s": start_s,
        "first_round_s": res.history[0]["round_seconds"],
        "train_loss": [r["train_loss"] for r in res.history],
        "acc_mean": res.final.get("acc_mean"),
    }


def run_local(args: argparse.Namespace, vectorize: str) -> dict[str, Any]:
    from lcfed.engines.local import run_local as run

    cfg = workload(args, "local", vectorize)
    t0 = time.perf_counter()
    res = run(cfg)
    total = time.perf_counter() - t0
    return summarize(f"local {'vmap' if vectorize == 'always' else 'loop'}", res, total - sum(r["round_seconds"] for r in res.history), args)


def profile_local(args: argparse.Namespace) -> str:
    """The in-process vmapped run under torch's profiler: where a round's time goes (ops by self CPU time and
    by GPU time, and the GPU's busy share of the wall time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lcfed.engines.local import run_local as run

    cfg = workload(args, "local", "always").replace(**{"train.rounds": 3, "train.eval_every": 3})
    from lcfed.learning import vectorized

    inside = [0.0]
    plain = vectorized.StepBatcher._run_if_complete

    def timed(self: Any) -> None:  # the batched ticks' own time, synchronized, against the round's wall
        t, ticks = time.perf_counter(), self.ticks
        plain(self)
        if self.ticks != ticks:  # only calls that ran a tick (most calls just queue a request)
            if args.device == "cuda":
                torch.cuda.synchronize()
            inside[0] += time.perf_counter() - t

    vectorized.StepBatcher._run_if_complete = timed  # type: ignore[method-assign]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        res = run(cfg)
        if args.device == "cuda":
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    vectorized.StepBatcher._run_if_complete = plain  # type: ignore[method-assign]
    avg = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in avg) if args.device == "cuda" else 0.0
    rounds_s = [r["round_seconds"] for r in res.history]
    text = [f"profiled: 3 rounds in-process vmap, wall {wall:.2f} s (rounds {', '.join(f'{s:.3f}' for s in rounds_s)}); "
            f"GPU busy {gpu_us / 1e6:.3f} s = {100 * gpu_us / 1e6 / wall:.1f} % of the wall; inside the batcher's ticks "
            f"(synchronized) {inside[0]:.3f} s = {100 * inside[0] / wall:.1f} %"]
    text.append(avg.table(sort_by="self_cpu_time_total", row_limit=30))
    if args.device == "cuda":
        text.append(avg.table(sort_by="self_cuda_time_total", row_limit=20))
    return "\n".join(text)


def run_ray(args: argparse.Namespace, actors: int, vectorize: str) -> dict[str, Any]:
    from actors.ray_engine import RayEngine

    cfg = workload(args, "ray", vectorize, actors)
    t0 = time.perf_counter()
    engine = RayEngine(cfg)
    start = time.perf_counter() - t0
    try:
        res = engine.run()
        info = engine.actor_info
    finally:
        engine.close()
    row = summarize(f"ray {actors} {'vmap' if vectorize == 'always' else 'loop'}", res, start, args)
    row["actors"] = [{k: i[k] for k in ("devices", "torch_device", "gpu_ids")} for i in info]
    row["gpus_per_actor"] = engine.layout.gpus_per_actor
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--devices", type=int, default=100, help="devices, all of them in every round")
    ap.add_argument("--rounds", type=int, default=10, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--actors", default="1,4,8", help="device actor counts for the Ray rows")
    ap.add_argument("--ray-loop", action="store_true", help="also the Ray rows with the loop inside the actors")
    ap.add_argument("--cpus-per-actor", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true", help="also profile the in-process vmapped run (profile.txt)")
    ap.add_argument("--only-local", action="store_true", help="only the in-process rows")
    ap.add_argument("--quick", action="store_true", help="20 devices, 2 timed rounds, actors 1,2")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.devices, args.rounds, args.warmup, args.actors = 20, 2, 1, "1,2"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch; run with --device cpu for a smoke run")
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none"

    rows = [run_local(args, "never"), run_local(args, "always")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        report = profile_local(args)
        print(report)
        (out / "profile.txt").write_text(report + "\n")
    if args.only_local:
        args.actors = ""
    import ray

    if args.actors:
        ray.init(address="local", num_cpus=os.cpu_count(), num_gpus=1 if args.device == "cuda" else 0,
                 include_dashboard=False, log_to_driver=False,
                 object_store_memory=2 * 1024**3 if args.device == "cuda" else 512 * 1024**2)
    try:
        for n in [int(a) for a in args.actors.split(",") if a]:
            rows.append(run_ray(args, n, "always"))
            if args.ray_loop:
                rows.append(run_ray(args, n, "never"))
    finally:
        ray.shutdown()

    ref = rows[0]
    print(f"\n{args.devices} devices/round, LeNet-5, 5 steps x batch 32, FedAvg; device {args.device} ({gpu}); "
          f"{args.rounds} timed rounds after {args.warmup}")
    print(f"{'run':<14} {'ms/round':>9} {'+-':>6} {'devices/s':>10} {'vs loop':>8} {'target ms':>10} {'start s':>8} "
          f"{'loss diff':>10}")
    for r in rows:
        kind = "local" if r["run"].startswith("local") else "ray"
        r["target_s"] = TARGETS_S[kind]
        r["met"] = r["s_round"] <= TARGETS_S[kind]
        r["max_loss_diff_vs_loop"] = float(np.max(np.abs(np.subtract(r["train_loss"], ref["train_loss"]))))
        print(f"{r['run']:<14} {1e3 * r['s_round']:>9.1f} {1e3 * r['s_round_std']:>6.1f} {r['devices_per_s']:>10.0f} "
              f"{ref['s_round'] / r['s_round']:>7.1f}x {1e3 * r['target_s']:>10.0f} {r['startup_s']:>8.1f} "
              f"{r['max_loss_diff_vs_loop']:>10.1e}")
    print("anchors (hand-written, same H100): " + ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in ANCHORS_S.items()))
    meta = {"device": args.device, "gpu": gpu, "torch": torch.__version__, "ray": ray.__version__,
            "python": platform.python_version(), "cpus": os.cpu_count(), "args": vars(args), "anchors_s": ANCHORS_S}
    (out / "gpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out / 'gpu.json'}")


if __name__ == "__main__":
    main()
