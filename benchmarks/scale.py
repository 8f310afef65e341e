"""Scale: LCFed with m = 1,000 devices and K = 100 clusters on the Ray engine, on this machine.

Workload: MNIST (Fashion-MNIST when the data dir has no MNIST; digits is too small for 1,000
devices) split over 1,000 devices by Dirichlet(0.1), LeNet-5, LCFed with K = 100, D = 50 and S_d =
all participants, ``--participation`` of the devices per round (0.1 = 100, the least that K = 100
allows: the first k-means needs K participants) x 5 local steps x batch 32, ``--rounds`` rounds,
evaluation of all 1,000 devices after the last round. ``--actors`` device actors (one torch thread
each) plus the server actor, in a Ray started in this process and shut down at the end.

Reports seconds per round (round 0 includes LCFed's cold start: the first PCA fit and the k-means
of 100 clusters; the last round includes the evaluation), the start-up time (Ray, actors, data)
and the peak memory of the whole process tree (this driver + Ray's GCS, raylet and workers),
sampled every ``--sample-every`` s by a thread with psutil: the sum of RSS (shared pages counted
once per process, an upper bound) and the sum of PSS (shared pages split between their users).
Target: peak < 6 GB.

    python benchmarks/scale.py --data-dir ~/.cache/lcfed [--rounds 3] [--quick]

``--sweep``: cost against m = 10^3..10^5 at 100 participants per round, in-process, on synthetic data
(``benchmarks/scale_devices.py``, whose flags it takes).

``--cluster``: the same at m = 10^4, 10^5 on the Ray engine of a simulated multi-node cluster on this
machine (``benchmarks/scale_cluster.py``, whose flags it takes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sampling import BackgroundSampler  # noqa: E402  (this directory, as the script runs)

from lcfed.config import load_config  # noqa: E402
from lcfed.data.importer import IDX_FILES, RAW_DIRS  # noqa: E402

GB = 2**30


def pick_dataset(data_dir: Path, wanted: str | None) -> str:
    """MNIST if its IDX files are in the data dir, else Fashion-MNIST (what `lcfed data import` places)."""
    if wanted:
        return wanted
    for name in ("mnist", "fashion_mnist"):
        raw = data_dir / RAW_DIRS[name] / "raw"
        if all((raw / f).is_file() for f in IDX_FILES):
            return name
    sys.exit(f"scale: neither MNIST nor Fashion-MNIST in {data_dir}; see docs/data.md (`lcfed data import`)")


def _label(p: psutil.Process) -> str:
    """A short name: Ray workers carry their actor in their title (``ray::DeviceActor``)."""
    try:
        cmd = p.cmdline()
        return (" ".join(" ".join(cmd).split()) if cmd and cmd[0].startswith("ray::") else p.name())[:40]
    except psutil.Error:
        return "?"


class TreeMemory(BackgroundSampler):
    """Peak memory of a process and all its descendants, sampled in a background thread."""

    def __init__(self, root: psutil.Process, every: float, pss_every: int = 5) -> None:
        self.root, self.every, self.pss_every = root, every, pss_every
        self.peak_rss = self.peak_pss = 0.0
        self.peak_procs = 0
        self.samples = 0
        self.breakdown: list[tuple[str, float]] = []  # (process, RSS GB) at the peak RSS sample
        super().__init__()

    def _procs(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return [self.root]

    def sample(self) -> None:
        procs = self._procs()
        rss = pss = 0
        with_pss = self.samples % self.pss_every == 0  # PSS reads /proc/PID/smaps: slower, so less often
        each: list[tuple[psutil.Process, int]] = []
        for p in procs:
            try:
                if with_pss:
                    info = p.memory_full_info()
                    rss, pss = rss + info.rss, pss + info.pss
                else:
                    info = p.memory_info()
                    rss += info.rss
                each.append((p, info.rss))
            except psutil.Error:  # a worker that just exited
                pass
        self.samples += 1
        if rss / GB > self.peak_rss:
            self.breakdown = [(_label(p), r / GB) for p, r in sorted(each, key=lambda e: -e[1])]
        self.peak_rss = max(self.peak_rss, rss / GB)
        if with_pss:
            self.peak_pss = max(self.peak_pss, pss / GB)
        self.peak_procs = max(self.peak_procs, len(procs))



class RoundClock:
    """Observer: wall time of each round and when the first one starts (end of start-up)."""

    def __init__(self) -> None:
        self.t_start = 0.0
        self.rounds: list[dict[str, float]] = []

    def on_start(self, cfg: Any, fed: Any) -> None:
        self.t_start = time.perf_counter()

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        self.rounds.append({k: float(v) for k, v in metrics.items() if k in (
            "round", "round_seconds", "train_loss", "num_clusters", "bytes_up", "bytes_down", "acc_mean", "acc_weighted", "ari")})

    def on_end(self, result: Any) -> None: ...


def config(args: argparse.Namespace, dataset: str) -> Any:
    return load_config(None, [
        f"data.dataset={dataset}", f"data.data_dir={args.data_dir}", "data.partition=dirichlet", f"data.alpha={args.alpha}",
        f"data.num_devices={args.devices}", "data.min_samples=10",
        "method.name=lcfed", f"method.num_clusters={args.clusters}", f"method.rank={args.rank}", "method.sample_size=0",
        f"train.rounds={args.rounds}", f"train.participation={args.participation}", "train.local_steps=5",
        "train.batch_size=32", "train.lr=0.01", f"train.eval_every={args.rounds}",
        "engine.kind=ray", f"engine.num_actors={args.actors}", "engine.torch_threads=1", "tracking.enabled=false",
    ])


def main() -> None:
    if "--cluster" in sys.argv[1:]:  # cost against m on a simulated multi-node cluster: benchmarks/scale_cluster.py
        import scale_cluster

        scale_cluster.main(sys.argv[1:])
        return
    if "--sweep" in sys.argv[1:]:  # cost against m, in-process: benchmarks/scale_devices.py
        import scale_devices

        scale_devices.main(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="~/.cache/lcfed")
    ap.add_argument("--dataset", default=None, help="default: mnist if present, else fashion_mnist")
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=100)
    ap.add_argument("--rank", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--participation", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--object-store-mb", type=int, default=512)
    ap.add_argument("--sample-every", type=float, default=0.2, help="seconds between memory samples")
    ap.add_argument("--target-gb", type=float, default=6.0)
    ap.add_argument("--quick", action="store_true", help="100 devices, K=10, D=10, 20 per round, 2 rounds (smoke run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.devices, args.clusters, args.rank, args.rounds, args.participation = 100, 10, 10, 2, 0.2
    data_dir = Path(args.data_dir).expanduser()
    dataset = pick_dataset(data_dir, args.dataset)
    cfg = config(args, dataset)

    import ray

    from actors.ray_engine import RayEngine

    load0 = os.getloadavg()  # the machine may be shared: say how busy it was
    me = psutil.Process(os.getpid())
    clock = RoundClock()
    t0 = time.perf_counter()
    with TreeMemory(me, args.sample_every) as mem:
        ray.init(address="local", num_cpus=args.actors, include_dashboard=False, object_store_memory=args.object_store_mb * 2**20,
                 log_to_driver=False)
        try:
            engine = RayEngine(cfg)
            try:
                t_ready = time.perf_counter()
                res = engine.run([clock])
                layout = {"actors": len(engine.layout.blocks), "devices_per_actor": len(engine.layout.blocks[0])}
            finally:
                engine.close()
            mem.sample()
        finally:
            ray.shutdown()
    wall = time.perf_counter() - t0

    rounds = [r["round_seconds"] for r in clock.rounds]
    steady = rounds[1:-1] or rounds[1:] or rounds
    per_round = max(1, int(np.ceil(args.participation * args.devices - 1e-9)))
    row = {
        "dataset": dataset, "devices": args.devices, "clusters": args.clusters, "rank": args.rank,
        "participants_per_round": per_round, "rounds": args.rounds, **layout,
        "startup_s": t_ready - t0, "wall_s": wall, "round_s": rounds, "steady_round_s": float(np.mean(steady)),
        "peak_rss_gb": mem.peak_rss, "peak_pss_gb": mem.peak_pss, "peak_processes": mem.peak_procs,
        "memory_samples": mem.samples, "peak_rss_breakdown_gb": mem.breakdown, "driver_max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "acc_mean": res.final.get("acc_mean"), "num_clusters": clock.rounds[-1].get("num_clusters"),
        "history": clock.rounds,
    }

    print(f"Scale: LCFed on Ray, {args.devices} devices ({dataset}, Dirichlet {args.alpha}), K={args.clusters}, "
          f"D={args.rank}, {per_round} devices/round x 5 steps, {args.rounds} rounds, {layout['actors']} actors "
          f"x {layout['devices_per_actor']} devices")
    print(f"{'round':>5} {'s':>8}  note")
    for i, s in enumerate(rounds):
        note = "cold start: first PCA fit + k-means" if i == 0 else ""
        if i == len(rounds) - 1:
            note = (note + "; " if note else "") + f"evaluation of all {args.devices} devices"
        print(f"{i:>5} {s:>8.2f}  {note}")
    print(f"start-up (Ray, actors, data) {row['startup_s']:.1f} s; steady s/round {row['steady_round_s']:.2f}; total wall {wall:.1f} s")
    ok = mem.peak_rss < args.target_gb
    print(f"peak memory of the process tree ({mem.peak_procs} processes, {mem.samples} samples): RSS sum {mem.peak_rss:.2f} GB, "
          f"PSS sum {mem.peak_pss:.2f} GB  (target < {args.target_gb:g} GB)  {'OK' if ok else 'MISSED'}")
    print("  at the peak: " + ", ".join(f"{name} {gb:.2f}" for name, gb in mem.breakdown if gb >= 0.05) + " (GB RSS)")
    print(f"final acc_mean {row['acc_mean']}, clusters in use {row['num_clusters']}; "
          f"load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    row["target_met"] = ok

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
            "cpus": os.cpu_count(), "ram_gb": psutil.virtual_memory().total / GB, "loadavg_start": load0,
            "loadavg_end": os.getloadavg()}
    (out / "scale.json").write_text(json.dumps({"args": vars(args), "meta": meta, "result": row}, indent=2) + "\n")
    print(f"wrote {out / 'scale.json'}")


if __name__ == "__main__":
    main()
