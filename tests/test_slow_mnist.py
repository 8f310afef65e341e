"""Full MNIST, the LCFed paper's setup (100 devices, K = 10, pathological n = 3): LCFed vs FedAvg vs
local-only training after the same rounds. Slow (tens of minutes on 2 cores): ``make test-slow``.

MNIST is taken from ``$LCFED_DATA_DIR`` (default ``~/.cache/lcfed``); if it is missing the test
fetches the IDX files with ``../shared/data/get-mnist.sh`` and imports them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from actors.ray_engine import run_ray
from lcfed.config import load_config
from lcfed.data import import_idx

pytestmark = [pytest.mark.slow]  # every test: `-m` leaves the file unimported

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "mnist_pathological.yaml"


def _mnist_dir(tmp_path_factory) -> Path:
    data_dir = Path(os.environ.get("LCFED_DATA_DIR", "~/.cache/lcfed")).expanduser()
    if (data_dir / "MNIST" / "raw" / "train-images-idx3-ubyte").exists():
        return data_dir
    script = ROOT.parent / "shared" / "data" / "get-mnist.sh"
    assert script.exists(), f"MNIST not in {data_dir} and {script} is missing: run `lcfed data import` first"
    raw = tmp_path_factory.mktemp("mnist-idx")
    subprocess.run(["bash", str(script), str(raw)], check=True)
    import_idx(data_dir, [("mnist", raw)])
    return data_dir


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_full_mnist_lcfed_vs_fedavg_vs_standalone(tmp_path_factory):
    data_dir = _mnist_dir(tmp_path_factory)
    results = {}
    for method in ("lcfed", "fedavg", "standalone"):
        cfg = load_config(CONFIG, [f"data.data_dir={data_dir}", f"method.name={method}", "engine.kind=ray",
                                   "tracking.enabled=false"])
        res = run_ray(cfg)
        last = [r for r in res.history if "acc_mean" in r][-3:]  # mean of the last evaluations
        results[method] = {
            "acc_mean": sum(r["acc_mean"] for r in last) / len(last),
            "acc_weighted": sum(r["acc_weighted"] for r in last) / len(last),
            "final_acc_mean": res.final["acc_mean"],
            "ari": res.final.get("ari"),
            "seconds_per_round": res.round_seconds,
            "rounds": cfg.train.rounds,
        }
        print(method, json.dumps(results[method]))
    out = ROOT / "outputs"
    out.mkdir(exist_ok=True)
    (out / "slow_mnist.json").write_text(json.dumps(results, indent=2) + "\n")
    assert results["lcfed"]["acc_mean"] > results["fedavg"]["acc_mean"]
