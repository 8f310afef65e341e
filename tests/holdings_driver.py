"""A driver for the multi-node tests: runs one federation on the Ray engine of the cluster in
``RAY_ADDRESS`` and prints, as one JSON line, what each of its processes holds after the last round.

    python -m tests.holdings_driver CONFIG [FIELD=VALUE ...]

Printed: ``holdings`` (:meth:`actors.ray_engine.RayEngine.holdings`), the devices that trained,
the bytes of one model, and the bytes of every torch tensor this driver process still references
while the federation is up (the loop's result included), counted through the garbage collector.
"""

from __future__ import annotations

import gc
import json
import sys

import numpy as np
import torch

from actors.ray_engine import RayEngine
from lcfed.config import load_config


def driver_tensor_bytes() -> int:
    gc.collect()
    return sum(o.numel() * o.element_size() for o in gc.get_objects() if isinstance(o, torch.Tensor))


def main(argv: list[str]) -> None:
    cfg = load_config(argv[0], argv[1:])
    engine = RayEngine(cfg)
    try:
        result = engine.run()
        held = engine.holdings()
        driver = driver_tensor_bytes()
        model = engine.setup.federation.spec.size * engine.setup.federation.init.element_size()
    finally:
        engine.close()
    assert result.trained is not None  # the last round evaluates
    print(json.dumps({"holdings": held, "trained": [int(d) for d in np.flatnonzero(result.trained)],
                      "model_bytes": model, "driver_tensor_bytes": driver, "num_devices": cfg.data.num_devices}))


if __name__ == "__main__":
    main(sys.argv[1:])
