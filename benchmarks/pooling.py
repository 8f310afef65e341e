"""Max-pooling where no gradient is taken (evaluation): ATen's ``torch.max_pool2d(x, 2)`` against lcfed's
``max_pool2`` (element-wise maxima of the four corners, ``lcfed/learning/pooling.py``), paired in one process.

1. Each of LeNet-5's two poolings on batches of 32 and 256 digits images (the in-process engine's local step and
   an evaluation chunk): milliseconds per call, the minimum over ``--repeat`` alternating rounds of 20 calls.
2. A whole run that evaluates every round: IFCA on 6 devices for 3 rounds (each device evaluates every cluster
   model each round), with ``max_pool2`` as it is and with ATen's kernel put back; the two runs' numbers are
   checked equal.

    python benchmarks/pooling.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import lcfed  # noqa: F401  (the portable numerics profile)
from lcfed import conformance
from lcfed.learning import models, pooling


def per_call_ms(f: Callable[[], Any], calls: int = 20) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t) / calls * 1e3


def kernels(repeat: int) -> None:
    print("pooling, no gradient       ATen ms   lcfed ms   ratio")
    for batch in (32, 256):
        for layer, shape in (("conv1", (batch, 6, 28, 28)), ("conv2", (batch, 16, 10, 10))):
            x = torch.relu(torch.randn(*shape))
            aten: list[float] = []
            ours: list[float] = []
            with torch.no_grad():
                assert torch.equal(torch.max_pool2d(x, 2), pooling.max_pool2(x))
                for _ in range(repeat):
                    aten.append(per_call_ms(lambda x=x: torch.max_pool2d(x, 2)))
                    ours.append(per_call_ms(lambda x=x: pooling.max_pool2(x)))
            print(f"{layer} x {batch:<3} {tuple(shape[1:])!s:<14} {min(aten):8.2f} {min(ours):10.2f} {min(aten) / min(ours):7.1f}x")


def run_seconds(aten: bool) -> tuple[float, Any]:
    models.max_pool2 = (lambda x: torch.max_pool2d(x, 2)) if aten else pooling.max_pool2  # type: ignore[attr-defined]
    t = time.perf_counter()
    r = conformance._run(conformance.small_config("ifca", **{"train.rounds": 3}))
    return time.perf_counter() - t, [{k: v for k, v in h.items() if "seconds" not in k} for h in r.history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    kernels(args.repeat)
    run_seconds(False)  # warm: data, imports
    times: dict[bool, list[float]] = {True: [], False: []}
    seen = {}
    for _ in range(args.repeat):
        for aten in (True, False):
            s, hist = run_seconds(aten)
            times[aten].append(s)
            seen[aten] = hist
    assert seen[True] == seen[False], "the two runs' numbers differ"
    a, o = min(times[True]), min(times[False])
    print(f"IFCA, 6 devices, 3 rounds (min of {args.repeat}): ATen {a:.2f} s, lcfed {o:.2f} s, ratio {a / o:.2f}; "
          "the same numbers")


if __name__ == "__main__":
    main()
