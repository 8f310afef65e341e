"""Cost against the number of devices m on a simulated multi-node Ray cluster (``scale.py --cluster``).

The cluster is the tests' (``tests/raycluster.py``): a head with no CPU for actors (the driver and the
ServerActor run there) and ``--workers`` worker nodes of 1 CPU, each node a ``ray start`` in its own
process group on this machine, stopped by process group at the end (never ``ray stop``). One cluster
serves every m; each m's driver is a process of its own, attached through ``RAY_ADDRESS``.

Workload as ``scale_devices.py`` (synthetic data, 10 samples per device, LeNet-5, LCFed K = 10, D = 10,
100 participants per round x 5 steps; ``--data leaf``: ``leaf_synthetic`` and the MLP), on the Ray engine
with one device actor per worker.
``--rounds`` rounds without evaluation, then the run is stopped at the round boundary (which writes
the checkpoint) instead of evaluating every device; then one evaluation of ``--eval-devices`` sampled
devices is timed, from which the final evaluation of all m is extrapolated.

Reports per m: start-up (data, partition, shards, actors), s/round over the rounds after the first,
peak RSS of each node's process tree (sampled with psutil; the node's Ray processes and its actors)
and of the driver, the checkpoint's size, and the states each device actor holds.

    python benchmarks/scale.py --cluster [--devices 10000 100000] [--rounds 3] [--workers 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import scale_devices  # noqa: E402  (this directory, as the script runs)
from sampling import BackgroundSampler  # noqa: E402

GB = 2**30


def config(m: int, args: argparse.Namespace, ckpt: str) -> Any:
    """scale_devices.py's workload on the Ray engine, one round more than measured, never reached: the run
    stops before it (no evaluation of all m)."""
    return scale_devices.config(m, args, ckpt, [
        f"train.rounds={args.rounds + 1}", f"train.eval_every={args.rounds + 1}", "engine.kind=ray",
        "engine.cpus_per_actor=1"])


class StopAfter:
    """Observer: round times; asks the loop to stop after ``rounds`` rounds."""

    def __init__(self, rounds: int) -> None:
        self.rounds, self.seconds = rounds, []  # type: ignore[var-annotated]

    def on_start(self, cfg: Any, fed: Any) -> None: ...

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        from lcfed.stop import STOP

        self.seconds.append(float(metrics["round_seconds"]))
        if rnd + 1 >= self.rounds:
            STOP.request("benchmark")

    def on_end(self, result: Any) -> None: ...


def driver(m: int, args: argparse.Namespace) -> dict[str, Any]:
    """One federation of ``m`` devices on the cluster in ``RAY_ADDRESS`` (this process is its driver)."""
    import resource

    from actors.ray_engine import RayEngine, RayPool, RayServer
    from lcfed.stop import Stopped

    with tempfile.TemporaryDirectory(prefix="lcfed-scale-") as ckpt:
        cfg = config(m, args, ckpt)
        t0 = time.perf_counter()
        engine = RayEngine(cfg)
        startup = time.perf_counter() - t0
        try:
            clock = StopAfter(args.rounds)
            try:
                engine.run([clock])
            except Stopped:
                pass
            assert engine.hosts is not None
            held = engine.holdings()
            rng = np.random.default_rng(0)
            sample = tuple(sorted(int(d) for d in rng.choice(m, size=min(args.eval_devices, m), replace=False)))
            t = time.perf_counter()
            RayPool(engine.hosts).evaluate(RayServer(engine.hosts).eval_payload(), sample)
            eval_s = time.perf_counter() - t
        finally:
            engine.close()
        ckpt_mb = sum(f.stat().st_size for f in Path(ckpt).glob("latest*.pt")) / 2**20  # with its state parts
    actors = held["device_actors"]
    return {
        "devices": m, "participants": args.participants, "samples": args.samples_per_device * m, "startup_s": startup,
        "round_s": clock.seconds, "s_per_round": float(np.mean(clock.seconds[1:] or clock.seconds)),
        "eval_devices": len(sample), "eval_s": eval_s, "final_eval_estimate_s": eval_s * m / len(sample),
        "checkpoint_mb": ckpt_mb, "driver_max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "actors": [{"node_id": a["node_id"], "devices": len(a["devices"]), "states": len(a["state_devices"]),
                    "data_rows": a["data_rows"], "data_mb": a["data_bytes"] / 2**20,
                    "state_mb": a["state_memory_bytes"] / 2**20} for a in actors],
        "server_state_mb": held["server"]["state_bytes"] / 2**20,
    }


class NodeMemory(BackgroundSampler):
    """Peak RSS sum of each node's process tree (its ``ray start`` and descendants) and of the driver."""

    def __init__(self, roots: dict[str, int], every: float = 0.5) -> None:
        self.roots, self.every = roots, every
        self.peak: dict[str, float] = dict.fromkeys(roots, 0.0)
        super().__init__()

    @staticmethod
    def tree_rss(pid: int) -> float:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total / GB

    def sample(self) -> None:
        for name, pid in self.roots.items():
            self.peak[name] = max(self.peak[name], self.tree_rss(pid))



def run_one(cluster: Any, m: int, args: argparse.Namespace) -> dict[str, Any]:
    assert cluster.head is not None
    nodes = {n.name: n.proc.pid for n in [cluster.head, *cluster.workers]}
    idle = {name: NodeMemory.tree_rss(pid) for name, pid in nodes.items()}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", str(m), "--participants", str(args.participants),
           "--samples-per-device", str(args.samples_per_device), "--rounds", str(args.rounds),
           "--eval-devices", str(args.eval_devices), "--data", args.data]
    env = cluster.client_env(cluster.head.home, RAY_ADDRESS=cluster.gcs)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with NodeMemory({**nodes, "driver": proc.pid}) as mem:
        out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"m={m}: the driver failed ({proc.returncode}):\n{err[-4000:]}")
    row = json.loads(out.strip().splitlines()[-1])
    names = cluster.node_names()
    for a in row["actors"]:
        a["node"] = names.get(a.pop("node_id"), "?")
    row["peak_rss_gb"] = mem.peak
    row["idle_rss_gb"] = idle
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--participants", type=int, default=100)
    ap.add_argument("--samples-per-device", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--eval-devices", type=int, default=1000, help="devices of the one timed evaluation")
    ap.add_argument("--workers", type=int, default=3, help="worker nodes of 1 CPU, one device actor each")
    ap.add_argument("--data", choices=["images", "leaf"], default="images",
                    help="synthetic images and LeNet-5, or leaf_synthetic and the MLP (240 bytes a sample: 10^6 devices)")
    ap.add_argument("--object-store-mb", type=int, default=512, help="each node's object store")
    ap.add_argument("--driver", type=int, default=0, help=argparse.SUPPRESS)  # the driver process's m
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if args.driver:
        print(json.dumps(driver(args.driver, args)))
        return
    from tests.raycluster import LocalCluster

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops its cluster
    load0 = os.getloadavg()
    rows = []
    cluster = LocalCluster.start(0, [(1, 0)] * args.workers, dashboard=False, object_store_mb=args.object_store_mb)
    try:
        for m in args.devices:
            rows.append(run_one(cluster, m, args))
            r = rows[-1]
            peaks = ", ".join(f"{k} {v:.2f}" for k, v in r["peak_rss_gb"].items())
            held = ", ".join(f"{a['node']}: {a['devices']} devices, {a['states']} states, {a['data_mb']:.0f} MB data"
                             for a in r["actors"])
            print(f"m={m:>8,}: start-up {r['startup_s']:.1f} s, {r['s_per_round']:.2f} s/round, evaluation of "
                  f"{r['eval_devices']} devices {r['eval_s']:.1f} s (all m: ~{r['final_eval_estimate_s']:.0f} s), "
                  f"checkpoint {r['checkpoint_mb']:.1f} MB; peak RSS GB {peaks}; {held}", flush=True)
    finally:
        left = cluster.stop()
        if left:
            print(f"SIGKILLed {len(left)} straggler(s) of the cluster")
    print(f"load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "scale_cluster.json"
    path.write_text(json.dumps({"args": vars(args), "loadavg": [load0[0], os.getloadavg()[0]], "rows": rows}, indent=2)
                    + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
