"""Can the final evaluation batch the devices that share a model without changing a bit?

Scoring every device evaluates each device's test samples on its own (one forward pass per device). Devices
that share a model (FedAvg's global model, a cluster's) could be scored together in one larger batch. This
script checks whether that keeps the numbers: the same rows through the same weights, evaluated in one batch
of 4,096 and in the smaller batches a device's test set makes, under the portable numerics profile, on the
MLP (``leaf_synthetic``) and LeNet-5. It prints how many of the small batches give other bits for any row, and
the time of both ways.

Here (Intel Xeon, AVX2 kernels) every batch below 32 rows gives other bits than the same rows inside a larger
batch (the kernels take another path and sum in another order for small batches), and a device's test set is
that small (3-14 samples in ``scale_devices.py``'s workload). So batching devices would change the numbers; the
final evaluation scores each device on its own, and above 10,000 devices a seeded sample of them
(``train.final_eval_devices``).

    python benchmarks/eval_batching.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed import numerics  # noqa: E402

numerics.activate("portable")

import torch  # noqa: E402

from lcfed.config import load_config  # noqa: E402
from lcfed.run.sources import network  # noqa: E402

ROWS = 4096
SIZES = (1, 3, 7, 10, 17, 32, 64, 100, 256, 1000)


def main() -> None:
    torch.set_num_threads(1)
    print(f"one batch of {ROWS} rows against the same rows in batches of {', '.join(map(str, SIZES))} "
          f"(portable numerics, 1 thread)")
    for model, shape in (("mlp", (60,)), ("lenet5", (1, 28, 28))):
        cfg = load_config(None, [f"model.name={model}", "tracking.enabled=false"])
        net, init = network(cfg, shape, 10)
        x = torch.randn(ROWS, *shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            t = time.perf_counter()
            whole = net(init, x)
            whole_s = time.perf_counter() - t
            for size in SIZES:
                t = time.perf_counter()
                parts = [net(init, x[s:s + size]) for s in range(0, ROWS, size)]
                parts_s = time.perf_counter() - t
                differ = sum(not torch.equal(p, whole[i * size:i * size + len(p)]) for i, p in enumerate(parts))
                print(f"{model:<7} batch {size:>5}: {differ:>5} of {len(parts):>5} batches give other bits; "
                      f"{parts_s * 1e3:8.1f} ms against {whole_s * 1e3:6.1f} ms in one batch ({parts_s / whole_s:5.1f}x)")


if __name__ == "__main__":
    main()
