"""A sweep on a simulated cluster shaped like ``cluster.yaml``, submitted through the Jobs API.

On this machine: a CPU-only head (the MLflow server on its loopback, the dataset in its ``~/data``)
and ``--workers`` GPU workers (1 CPU, 1 logical GPU each; their ``~/data`` is empty and importing
``mlflow`` fails there), an S3-compatible store (moto on 127.0.0.1) as Tune storage. ``lcfed
submit`` sends ``lcfed sweep`` to the head's job server; the script prints where trials and device
actors ran, the best config, and the wall time.

    .venv/bin/python benchmarks/cluster_sweep.py --mnist DIR   # DIR: MNIST IDX files (get-mnist.sh)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.data import import_idx  # noqa: E402
from tests.raycluster import BIN, LocalCluster, free_port  # noqa: E402
from tests.s3server import S3Server  # noqa: E402
from tune_jobs.mlflow_server import start_mlflow_server, stop  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mnist", required=True, help="directory holding the MNIST IDX files (copied to the head only)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--subset", type=int, default=6000, help="samples of MNIST used (0 = all)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="lcfed-cluster-sweep-"))
    blocker = tmp / "no-mlflow" / "mlflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('mlflow imported on a worker node')\n")
    t0 = time.monotonic()
    with S3Server() as s3:
        server, url = start_mlflow_server("127.0.0.1", free_port(), tmp / "mlflow")
        cluster = LocalCluster.start(2, [(1, 1)] * args.workers, env=s3.env,
                                     worker_env={"PYTHONPATH": str(blocker.parent)})
        try:
            assert cluster.head is not None
            home = cluster.head.home
            import_idx(home / "data", [Path(args.mnist)])
            print(f"cluster up in {time.monotonic() - t0:.0f} s: head {cluster.gcs} (2 CPUs, no GPU), "
                  f"{args.workers} GPU workers; MNIST in {home / 'data'} only; MLflow {url}; storage {s3.uri('sweeps')}")
            config = {
                "name": "cluster-sweep",
                "data": {"dataset": "mnist", "data_dir": "~/data", "partition": "dirichlet", "alpha": 0.1,
                         "num_devices": args.devices, "subset": args.subset},
                "train": {"rounds": args.rounds, "local_steps": 5, "lr": 0.05},
                "method": {"name": "lcfed"},
                "engine": {"kind": "ray", "cpus_per_actor": 0.5, "torch_threads": 1},
                "checkpoint": {"every": 1},
                "tracking": {"enabled": True, "uri": url, "experiment": "cluster-sweep"},
            }
            (home / "cluster-sweep.yaml").write_text(yaml.safe_dump(config))
            summary_path = home / "summary.json"
            env = cluster.client_env(home, RAY_AUTH_TOKEN_PATH=str(cluster.token))
            cmd = [str(BIN / "lcfed"), "submit", "--address", cluster.dashboard, "--working-dir", str(ROOT), "--",
                   "lcfed", "sweep", "--config", str(home / "cluster-sweep.yaml"), "--space", "mu_lambda_rank_k.yaml",
                   "--num-samples", str(args.trials), "--gpus-per-trial", "0.5", "--storage", s3.uri("sweeps"),
                   "--name", "mlrk", "--json", str(summary_path)]
            print("$", " ".join(cmd))
            t1 = time.monotonic()
            proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
            wall = time.monotonic() - t1
            (tmp / "job.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                print(proc.stdout[-5000:], proc.stderr[-3000:])
                return 1
            summary = json.loads(summary_path.read_text())
            report(summary, url, cluster, wall)
            keys = s3.list("sweeps/mlrk/")
            print(f"S3 storage: {len(keys)} objects under {s3.uri('sweeps/mlrk')}, "
                  f"{sum('/checkpoint_' in k for k in keys)} of them checkpoint files")
            print(f"job log: {tmp / 'job.log'}")
        finally:
            cluster.stop()
            stop(server)
    return 0


def report(summary: dict, url: str, cluster: LocalCluster, wall: float) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("cluster-sweep")
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    names = cluster.node_names()
    print(f"\n{len(children)} trial runs in MLflow (logged by the driver on the head):")
    print(f"{'trial':<16} {'status':<9} {'rounds':>6} {'acc_mean':>8}  trial node -> device-actor nodes")
    for run in sorted(children, key=lambda r: r.data.tags.get("tune_trial_id", "")):
        tags = run.data.tags
        trial = names.get(tags.get("placement.trial_node", "?"), "?")
        devs = ",".join(names.get(n, "?") for n in tags.get("placement.device_nodes", "").split(","))
        steps = len(client.get_metric_history(run.info.run_id, "loss/train_loss"))
        early = " (stopped early)" if tags.get("stopped_early") else ""
        print(f"{tags.get('tune_trial_id', '?'):<16} {run.info.status:<9} {steps:>6} "
              f"{run.data.metrics.get('accuracy/acc_mean', float('nan')):>8.4f}  {trial} -> {devs}{early}")
    print(f"\nbest acc_mean {summary['best_acc_mean']:.4f} with {summary['best_config']}")
    print(f"trials {summary['trials']}, errors {summary['errors']}; sweep job wall time {wall:.0f} s")
    print("nodes: head = CPU-only head (driver, MLflow, data); w0.. = GPU workers")


if __name__ == "__main__":
    sys.exit(main())
