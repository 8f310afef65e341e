"""The baselines a clustered-FL paper is compared with, side by side: each method on rotated digits (4 rotation
groups, known, so the ARI of the clustered ones) and on digits Dirichlet 0.1; 20 devices, 20 rounds of 10 local
steps at lr 0.1 (``--lr``), in-process, seed 0. Prints a Markdown table (accuracy: the last evaluation's ``acc_mean``; ARI
where the method clusters; MB per round, up and down) and each run's CPU seconds.

    python benchmarks/baselines_table.py [--methods fedavg,lcfed,...] [--rounds 20] [--lr 0.1]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from lcfed.config import from_dict
from lcfed.engines.local import run_local
from lcfed.errors import DivergenceError

BASE = {
    "data": {"dataset": "digits", "num_devices": 20},
    "train": {"local_steps": 10, "lr": 0.1, "eval_every": 5},
    "engine": {"torch_threads": 1},
    "tracking": {"enabled": False},
}
DATA = {
    "rotated": {"testbed": "rotated", "testbed_groups": 4, "partition": "iid"},
    "dirichlet 0.1": {"partition": "dirichlet", "alpha": 0.1},
}
#: each method with the settings that give it the testbed's four groups where it takes a K
METHODS = {
    "fedavg": {}, "lcfed": {"num_clusters": 4, "rank": 4}, "ifca": {"num_clusters": 4},
    "cfl": {}, "fedem": {}, "fedsoft": {"num_clusters": 4}, "pacfl": {},
    "ditto": {}, "apfl": {}, "fedrep": {}, "fedprox": {}, "scaffold": {},
}


def run(method: str, data: str, rounds: int, lr: float) -> dict[str, float | str]:
    raw = {**BASE, "data": {**BASE["data"], **DATA[data]}, "train": {**BASE["train"], "rounds": rounds, "lr": lr},
           "method": {"name": method, **METHODS[method]}}
    t = time.process_time()
    try:
        result = run_local(from_dict(raw))
    except DivergenceError as e:  # a method's own instability at this lr is a result too
        return {"acc": math.nan, "ari": math.nan, "mb": math.nan, "cpu": time.process_time() - t, "error": str(e)}
    rows = result.history
    return {"acc": float(result.final["acc_mean"]), "ari": float(result.final.get("ari", math.nan)),
            "mb": float(np.mean([r["bytes_up"] + r["bytes_down"] for r in rows])) / 1e6,
            "cpu": time.process_time() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    table = {}
    for method in args.methods.split(","):
        table[method] = {data: run(method, data, args.rounds, args.lr) for data in DATA}
        print(json.dumps({method: table[method]}), flush=True)
    print("\n| method | rotated: acc | rotated: ARI | Dirichlet 0.1: acc | MB per round (rotated) |")
    print("|---|---|---|---|---|")
    for method, res in table.items():
        rot, dir_ = res["rotated"], res["dirichlet 0.1"]
        ari = "–" if math.isnan(rot["ari"]) else f"{rot['ari']:.2f}"
        print(f"| {method} | {rot['acc']:.3f} | {ari} | {dir_['acc']:.3f} | {rot['mb']:.1f} |"
              + "".join(f" {data}: {r['error']}" for data, r in res.items() if "error" in r))


if __name__ == "__main__":
    main()
