"""Every registered method on a real GPU: in-process twice (same numbers?) and on Ray with fractional-GPU
device actors (same numbers as in-process?), plus the device model (synchronous deadline and FedBuff).

Workload: the generated ``synthetic`` dataset (no files), 20 devices, 4 rounds, 2 local steps, every
method with its defaults and K = 3 where it has clusters. Rows: method, seconds in-process, whether a
second in-process run gave identical metrics, the largest metric difference Ray vs in-process, the
final ``acc_mean``, and the error's last line where a run failed. JSON to ``$OUT/gpu_methods.json``.

    python benchmarks/gpu_methods.py                        # on the GPU machine (see benchmarks/README.md)
    python benchmarks/gpu_methods.py --device cpu --methods fedavg,lcfed   # smoke run here
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed import api  # noqa: E402
from lcfed.methods import METHODS  # noqa: E402

CLUSTERED = {"lcfed", "fedac", "ifca", "fesem", "cgpfl", "fedgroup", "clusterfl"}
SCENARIOS: dict[str, list[str]] = {
    "devices-sync": ["devices.simulate=true", "devices.speed_sigma=0.5", "devices.availability=iid",
                     "devices.online_fraction=0.7", "devices.dropout=0.1", "devices.overcommit=0.3"],
    "devices-fedbuff": ["devices.simulate=true", "devices.speed_sigma=0.5", "devices.aggregation=async",
                        "devices.async_buffer=4"],
}


def overrides(args: argparse.Namespace, method: str, extra: list[str], actors: int) -> list[str]:
    sets = [
        "data.dataset=synthetic", "data.partition=dirichlet", "data.alpha=0.5", f"data.num_devices={args.devices}",
        "data.samples_per_device=[200, 200]", f"method.name={method}", f"train.rounds={args.rounds}",
        f"train.participation={1.0 if method == 'dcpfl' else 0.5}", "train.local_steps=2", "train.batch_size=32", "train.lr=0.01",
        "train.eval_every=2", f"engine.device={args.device}", f"engine.num_actors={actors}",
        "engine.cpus_per_actor=1", "engine.torch_threads=1", "tracking.enabled=false",
    ]
    if method in CLUSTERED:
        sets.append("method.num_clusters=3")
    if method == "dcpfl":
        sets += ["method.t_start=1", "method.window=2", "method.t_obv=1", "method.t_sp=2"]
    return sets + extra


def metrics(res: Any) -> dict[str, float]:
    out = {}
    for i, row in enumerate(res.history):
        for k, v in row.items():
            if isinstance(v, (int, float)) and not k.endswith("seconds") and k not in ("wall", "clock_s"):
                out[f"{i}.{k}"] = float(v)
    out.update({f"final.{k}": float(v) for k, v in res.final.items()
                if isinstance(v, (int, float)) and not k.endswith("seconds")})
    return out


def diff(a: dict[str, float], b: dict[str, float]) -> float:
    keys = set(a) & set(b)
    if set(a) != set(b):
        return math.inf
    worst = 0.0
    for k in keys:
        x, y = a[k], b[k]
        if math.isnan(x) and math.isnan(y):
            continue
        worst = max(worst, abs(x - y))
    return worst


def one(args: argparse.Namespace, name: str, method: str, extra: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"run": name, "method": method}
    try:
        t0 = time.perf_counter()
        a = api.run(api.config(None, overrides(args, method, extra, 0)), engine="local")
        row["local_s"] = time.perf_counter() - t0
        row["placement"] = a.placement
        b = api.run(api.config(None, overrides(args, method, extra, 0)), engine="local")
        ma, mb = metrics(a), metrics(b)
        row["repeat_equal"] = ma == mb or diff(ma, mb) == 0.0
        row["repeat_diff"] = diff(ma, mb)
        row["acc_mean"] = a.final.get("acc_mean")
        if not args.no_ray:
            t0 = time.perf_counter()
            r = api.run(api.config(None, overrides(args, method, extra, args.actors)), engine="ray")
            row["ray_s"] = time.perf_counter() - t0
            row["ray_diff"] = diff(ma, metrics(r))
            row["ray_placement"] = r.placement
    except Exception as exc:  # a failing method is a finding, not the end of the sweep
        row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        row["traceback"] = traceback.format_exc()[-3000:]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--actors", type=int, default=2, help="device actors sharing the GPU on the Ray rows")
    ap.add_argument("--methods", default="", help="comma-separated; default every registered method")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch; run with --device cpu for a smoke run")
    methods = [m for m in args.methods.split(",") if m] or sorted(METHODS)
    cases: list[tuple[str, str, list[str]]] = [(m, m, []) for m in methods]
    cases += [(f"fedavg {s}", "fedavg", sets) for s, sets in SCENARIOS.items()]
    cases += [("lcfed devices-sync", "lcfed", SCENARIOS["devices-sync"])]
    if not args.no_ray:
        import ray

        ray.init(address="local", num_cpus=os.cpu_count(), num_gpus=1 if args.device == "cuda" else 0,
                 include_dashboard=False, log_to_driver=False,
                 object_store_memory=2 * 1024**3 if args.device == "cuda" else 512 * 1024**2)
    rows = []
    try:
        for name, method, extra in cases:
            row = one(args, name, method, extra)
            rows.append(row)
            print(f"{name:<22} local {row.get('local_s', math.nan):6.1f}s  repeat_equal={row.get('repeat_equal')}  "
                  f"ray_diff={row.get('ray_diff', math.nan):.1e}  acc={row.get('acc_mean')}  "
                  f"{row.get('error', '')}", flush=True)
    finally:
        if not args.no_ray:
            ray.shutdown()
    failed = [r["run"] for r in rows if "error" in r]
    print(f"\n{len(rows)} runs on {args.device} ({torch.cuda.get_device_name(0) if args.device == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}: {len(failed)} failed {failed}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_methods.json").write_text(json.dumps({"args": vars(args), "torch": torch.__version__, "rows": rows},
                                                     indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
