"""Cost against the number of devices m on a simulated multi-node Ray cluster (``scale.py --cluster``).

The cluster is the tests' (``tests/raycluster.py``): a head with no CPU for actors (the driver and the
ServerActor run there) and ``--workers`` worker nodes of 1 CPU, each node a ``ray start`` in its own
process group on this machine, stopped by process group at the end (never ``ray stop``). One cluster
serves every m; each m's driver is a process of its own, attached through ``RAY_ADDRESS``.

Workload as ``scale_devices.py`` (synthetic data, 10 samples per device, LeNet-5, LCFed K = 10, D = 10,
100 participants per round x 5 steps; ``--data leaf``: ``leaf_synthetic`` and the MLP), on the Ray engine
with one device actor per worker.
``--rounds`` rounds, the last ending in the final evaluation as by default (``train.final_eval_devices``
-1: the trained devices up to 10,000, a seeded sample of 10,000 above, with its 95 % interval), which is timed;
then one more evaluation of ``--eval-devices`` devices drawn from all m is timed, from which scoring every
device (``train.final_eval_devices: 0``, the behaviour before the sample) is extrapolated.
With ``--data leaf`` the device actors generate their own devices' samples on their nodes; ``--driver-data``
runs each m first as before that (the driver generates every sample and ships the shards), paired. ``--data file``:
the synthetic images saved once as an .npz file dataset (in ``--file-dir``, its cache filled before any timing),
which each device actor reads its rows of on its node (``engine.data_reads: auto``); with ``--driver-data``
each m first runs with ``engine.data_reads=driver`` (the driver reads them and ships the shards), paired.

Reports per m: start-up (data, partition, shards, actors) and the driver's peak RSS by then, s/round over the
rounds after the first (the last excepted),
peak RSS of each node's process tree (sampled with psutil; the node's Ray processes and its actors)
and of the driver, the checkpoint's size, and the states each device actor holds.

    python benchmarks/scale.py --cluster [--devices 10000 100000] [--rounds 3] [--workers 3] [--data leaf --driver-data]
    python benchmarks/scale.py --cluster --devices 100000 --data file --driver-data
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    """scale_devices.py's workload on the Ray engine: ``--rounds`` rounds, the last ending in the final evaluation
    (``train.final_eval_devices`` as by default: a sample of 10,000 devices above 10,000)."""
    reads = ["engine.data_reads=driver"] if args.data == "file" and args.driver_data else []
    return scale_devices.config(m, args, ckpt, ["engine.kind=ray", "engine.cpus_per_actor=1", *reads])


def write_file_dataset(m: int, args: argparse.Namespace) -> None:
    """The synthetic images of ``m`` devices as an .npz under ``--file-dir``, decoded once into the cache (as a
    first ``lcfed run`` would), so that no timed run decodes it."""
    from lcfed.data.sources import synthetic_dataset
    from lcfed.run.sources import load

    path = Path(args.file_dir) / f"images-{args.samples_per_device * m}.npz"
    if not path.exists():
        ds = synthetic_dataset(args.samples_per_device * m)
        np.savez(path, x=ds.x, y=ds.y)
        del ds
    assert load(config(m, args, "")).x_file is not None  # cached: the actors can read it


class RoundClock:
    """Observer: each round's time."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_start(self, cfg: Any, fed: Any) -> None: ...

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        self.seconds.append(float(metrics["round_seconds"]))

    def on_end(self, result: Any) -> None: ...


class TimedEvaluations:
    """Times every evaluation the pool is asked for (the last one is the final evaluation)."""

    def __init__(self) -> None:
        from actors.handles import RayPool

        self.seconds: list[float] = []
        self.devices: list[int] = []
        plain = RayPool.evaluate

        def timed(pool: Any, payload: Any, devices: Any = None) -> Any:
            t = time.perf_counter()
            out = plain(pool, payload, devices)
            self.seconds.append(time.perf_counter() - t)
            self.devices.append(len(out))
            return out

        RayPool.evaluate = timed  # type: ignore[method-assign]


def driver(m: int, args: argparse.Namespace) -> dict[str, Any]:
    """One federation of ``m`` devices on the cluster in ``RAY_ADDRESS`` (this process is its driver), run to its
    end with the default final evaluation. ``--driver-data``: the driver generates the data and ships the shards
    (as before node-local data)."""
    import resource

    from actors.handles import RayPool, RayServer
    from actors.ray_engine import RayEngine
    from lcfed.run.sources import load

    evals = TimedEvaluations()
    with tempfile.TemporaryDirectory(prefix="lcfed-scale-") as ckpt:
        cfg = config(m, args, ckpt)
        t0 = time.perf_counter()
        engine = RayEngine(cfg, dataset=load(cfg) if args.driver_data and args.data == "leaf" else None)
        startup = time.perf_counter() - t0
        startup_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        try:
            clock = RoundClock()
            engine.run([clock])
            run_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # before this script's own calls
            final_devices, final_s = evals.devices[-1], evals.seconds[-1]
            held = engine.holdings()
            assert engine.hosts is not None
            rng = np.random.default_rng(0)
            sample = tuple(sorted(int(d) for d in rng.choice(m, size=min(args.eval_devices, m), replace=False)))
            t = time.perf_counter()
            RayPool(engine.hosts).evaluate(RayServer(engine.hosts).eval_payload(), sample)
            sample_s = time.perf_counter() - t
        finally:
            engine.close()
        ckpt_mb = sum(f.stat().st_size for f in Path(ckpt).glob("latest*.pt")) / 2**20  # with its state parts
    actors = held["device_actors"]
    rounds = clock.seconds[:-1]  # the last round's time holds the final evaluation
    return {
        "devices": m, "participants": args.participants, "samples": args.samples_per_device * m, "startup_s": startup,
        "node_local": engine.node_local, "data_reads": engine.data_reads, "round_s": rounds, "s_per_round": float(np.mean(rounds[1:] or rounds)),
        "eval_devices": final_devices, "eval_s": final_s, "timings": engine.timings,
        "sample_devices": len(sample), "sample_eval_s": sample_s, "every_device_estimate_s": sample_s * m / len(sample),
        "checkpoint_mb": ckpt_mb, "driver_max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "driver_startup_rss_gb": startup_rss, "driver_run_rss_gb": run_rss,
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



def run_one(cluster: Any, m: int, args: argparse.Namespace, driver_data: bool = False) -> dict[str, Any]:
    assert cluster.head is not None
    nodes = {n.name: n.proc.pid for n in [cluster.head, *cluster.workers]}
    idle = {name: NodeMemory.tree_rss(pid) for name, pid in nodes.items()}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", str(m), "--participants", str(args.participants),
           "--samples-per-device", str(args.samples_per_device), "--rounds", str(args.rounds), "--data", args.data,
           "--eval-devices", str(args.eval_devices), "--file-dir", args.file_dir,
           *(["--driver-data"] if driver_data else [])]
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
    ap.add_argument("--eval-devices", type=int, default=10_000,
                    help="devices drawn from all m for one more timed evaluation after the run, from which scoring every "
                         "device (train.final_eval_devices: 0) is extrapolated")
    ap.add_argument("--driver-data", action="store_true",
                    help="also run each m as before node-local data (the driver generates and ships the shards), paired")
    ap.add_argument("--workers", type=int, default=3, help="worker nodes of 1 CPU, one device actor each")
    ap.add_argument("--data", choices=["images", "leaf", "file"], default="images",
                    help="synthetic images and LeNet-5, or leaf_synthetic and the MLP (240 bytes a sample: 10^6 devices), "
                         "or the synthetic images as a file dataset")
    ap.add_argument("--file-dir", default="", help="where --data file writes its .npz (default: a temporary folder)")
    ap.add_argument("--object-store-mb", type=int, default=512, help="each node's object store")
    ap.add_argument("--driver", type=int, default=0, help=argparse.SUPPRESS)  # the driver process's m
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if args.driver:
        print(json.dumps(driver(args.driver, args)))
        return
    from tests.raycluster import LocalCluster

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops its cluster
    made = args.data == "file" and not args.file_dir
    if made:
        args.file_dir = tempfile.mkdtemp(prefix="lcfed-scale-file-")
    if args.data == "file":
        for m in args.devices:
            write_file_dataset(m, args)
    load0 = os.getloadavg()
    rows = []
    cluster = LocalCluster.start(0, [(1, 0)] * args.workers, dashboard=False, object_store_mb=args.object_store_mb)
    try:
        # the kernel fingerprint cached in each node's HOME, as on any machine lcfed ran on before: else the first
        # driver and actors compute it (~4 s each, and ~0.5 GB more of the driver's peak RSS)
        for node in [cluster.head, *cluster.workers]:
            subprocess.run([sys.executable, "-c", "from lcfed import fingerprint; fingerprint.for_process(1)"],
                           check=True, env=cluster.client_env(node.home), cwd=ROOT)
        for m in args.devices:
            for before in ([True, False] if args.driver_data else [False]):
                if before and args.data == "images":
                    continue  # images generated in memory are always the driver's
                rows.append(run_one(cluster, m, args, driver_data=before))
                r = rows[-1]
                peaks = ", ".join(f"{k} {v:.2f}" for k, v in r["peak_rss_gb"].items())
                held = ", ".join(f"{a['node']}: {a['devices']} devices, {a['states']} states, {a['data_mb']:.0f} MB data"
                                 for a in r["actors"])
                how = "node-local data" if r["data_reads"] == "nodes" else "driver's data"
                phases = ", ".join(f"{k} {v:.1f}" for k, v in r["timings"].items())
                print(f"m={m:>9,} ({how}): start-up {r['startup_s']:.1f} s (driver peak RSS "
                      f"{r['driver_startup_rss_gb']:.2f} GB by then, {r['driver_run_rss_gb']:.2f} GB by the run's end), "
                      f"{r['s_per_round']:.2f} s/round, final evaluation "
                      f"of {r['eval_devices']:,} devices {r['eval_s']:.1f} s (every device: ~{r['every_device_estimate_s']:.0f} s "
                      f"from {r['sample_devices']:,} in {r['sample_eval_s']:.1f} s), checkpoint {r['checkpoint_mb']:.1f} MB; "
                      f"peak RSS GB {peaks}; {held}; phases s: {phases}", flush=True)
    finally:
        left = cluster.stop()
        if left:
            print(f"SIGKILLed {len(left)} straggler(s) of the cluster")
        if made:
            shutil.rmtree(args.file_dir, ignore_errors=True)
    print(f"load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "scale_cluster.json"
    path.write_text(json.dumps({"args": vars(args), "loadavg": [load0[0], os.getloadavg()[0]], "rows": rows}, indent=2)
                    + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
