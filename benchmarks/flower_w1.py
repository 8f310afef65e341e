"""Workload W1 as a Flower app, run by Flower's simulation engine (``flwr.simulation.run_simulation``).

Runs inside its own venv (``benchmarks/.flower-venv``, made by ``flower_overhead.py``: Flower pins
its own Ray) with the repository on ``PYTHONPATH``, so the ClientApp does exactly our devices' local
work: the same LeNet-5 (``lcfed.learning.models``), the same ``lcfed.learning.local_update.local_update`` (SGD, 5 steps x
batch 32, batches from ``batch_rng(seed, device, round)``), on the same partition. Everything the
run needs comes from the spec file that ``flower_overhead.py`` writes with our code: the samples
(already float), each device's train/test indices, the initial weights and each round's selected
devices. The server sends device d's work to the d-th node, so both frameworks train the same
devices in the same rounds; evaluation (global model on every device's test set) runs after the
last round only, as ours does. FedAvg weights by the number of training samples, as ours does.

    LCFED_FLOWER_SPEC=spec.npz LCFED_FLOWER_OUT=out.json PYTHONPATH=. \\
        benchmarks/.flower-venv/bin/python benchmarks/flower_w1.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

T0 = time.perf_counter()  # after torch/numpy, before Flower: what ours is timed from

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from lcfed.learning.local_update import DeviceData, LocalWork, batch_rng, evaluate, local_update  # noqa: E402
from lcfed.learning.models import Network, build_network  # noqa: E402

_CACHE: dict[str, Any] = {}


def spec() -> dict[str, Any]:
    """The spec file, read once per process (the driver and each Ray actor)."""
    if not _CACHE:
        z = np.load(os.environ["LCFED_FLOWER_SPEC"])
        _CACHE.update({k: z[k] for k in z.files})
    return _CACHE


def host() -> tuple[Network, dict[int, DeviceData], LocalWork, int]:
    """The network and every device's tensors, built once per ClientApp process (as our actors do)."""
    if "net" not in _CACHE:
        s = spec()
        torch.set_num_threads(int(s["torch_threads"]))
        net, _ = build_network(str(s["model"]), tuple(int(v) for v in s["input_shape"]), int(s["num_classes"]), int(s["seed"]))
        x, y = torch.from_numpy(s["x"]), torch.from_numpy(s["y"])
        data = {}
        for d in range(int(s["num_devices"])):
            tr = s["train_idx"][s["train_off"][d] : s["train_off"][d + 1]]
            te = s["test_idx"][s["test_off"][d] : s["test_off"][d + 1]]
            data[d] = DeviceData(x[tr], y[tr], x[te], y[te])
        work = LocalWork(lr=float(s["lr"]), batch_size=int(s["batch_size"]), steps=int(s["local_steps"]))
        _CACHE.update(net=net, data=data, work=work)
    return _CACHE["net"], _CACHE["data"], _CACHE["work"], int(spec()["seed"])


# --- ClientApp ---------------------------------------------------------------------------------

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    net, data, work, seed = host()
    dev, rnd = int(msg.content["config"]["device"]), int(msg.content["config"]["round"])
    w0 = torch.from_numpy(msg.content["arrays"].to_numpy_ndarrays()[0])
    res = local_update(net, w0, data[dev], work, batch_rng(seed, dev, rnd))
    metrics = MetricRecord({"num-examples": data[dev].num_train, "train_loss": float(res.loss)})
    return Message(RecordDict({"arrays": ArrayRecord([res.weights.numpy()]), "metrics": metrics}), reply_to=msg)


@client_app.evaluate()
def evaluate_global(msg: Message, context: Context) -> Message:
    net, data, _, _ = host()
    dev = int(msg.content["config"]["device"])
    w = torch.from_numpy(msg.content["arrays"].to_numpy_ndarrays()[0])
    r = evaluate(net, w, data[dev].x_test, data[dev].y_test)
    metrics = MetricRecord({"num-examples": r.total, "correct": r.correct, "total": r.total, "loss_sum": r.loss_sum})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


# --- ServerApp ---------------------------------------------------------------------------------


class W1FedAvg(FedAvg):
    """Flower's FedAvg, with our round's devices instead of its own sampling, and evaluation at the end."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=1.0)
        self.s = s
        self.rounds = int(s["rounds"])
        self.started: list[float] = []
        self.ended: list[float] = []
        self.final: dict[str, float] = {}

    def _nodes(self, grid: Grid) -> list[int]:
        need = int(self.s["num_devices"])
        while len(nodes := sorted(grid.get_node_ids())) < need:
            time.sleep(0.05)
        return nodes

    def _messages(self, grid: Grid, devices: Iterable[int], rnd: int, arrays: ArrayRecord, kind: str) -> list[Message]:
        nodes = self._nodes(grid)
        return [
            Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"device": int(d), "round": rnd})}),
                    dst_node_id=nodes[int(d)], message_type=kind)
            for d in devices
        ]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self.started.append(time.perf_counter())
        rnd = server_round - 1  # ours count rounds from 0
        return self._messages(grid, self.s["selections"][rnd], rnd, arrays, MessageType.TRAIN)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if server_round < self.rounds:
            return []
        return self._messages(grid, range(int(self.s["num_devices"])), server_round - 1, arrays, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = [r for r in replies if not r.has_error()]
        if replies:
            rows = [r.content["metrics"] for r in replies]
            acc = np.array([m["correct"] / m["total"] for m in rows if m["total"] > 0])
            total = sum(m["total"] for m in rows)
            self.final = {"acc_mean": float(acc.mean()), "acc_weighted": sum(m["correct"] for m in rows) / total,
                          "evaluated": len(rows)}
        self.ended.append(time.perf_counter())
        return None


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    s = spec()
    strategy = W1FedAvg(s)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([s["init"]]), num_rounds=strategy.rounds)
    rounds = [e - b for b, e in zip(strategy.started, strategy.ended, strict=True)]
    final = result.arrays.to_numpy_ndarrays()[0] if result.arrays is not None else None
    losses = [float(result.train_metrics_clientapp[r]["train_loss"]) for r in sorted(result.train_metrics_clientapp)]
    _CACHE["result"] = {"round_s": rounds, "first_round_start_abs": strategy.started[0], **strategy.final, "train_loss": losses,
                        "final_weights_norm": float(np.linalg.norm(final)) if final is not None else None}


if __name__ == "__main__":
    import flwr
    import ray
    from flwr.simulation import run_simulation

    # the apps are imported from this file as a module, so Ray workers import them by name
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flower_w1 as app

    s = app.spec()
    run_simulation(
        server_app=app.server_app,
        client_app=app.client_app,
        num_supernodes=int(s["num_devices"]),
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": int(s["actors"]), "include_dashboard": False, "log_to_driver": False,
                          "object_store_memory": 256 * 2**20},
        },
    )
    wall = time.perf_counter() - T0
    res = dict(app._CACHE.get("result", {}))
    if "first_round_start_abs" in res:
        res["startup_s"] = res.pop("first_round_start_abs") - T0  # imports, Ray, actors: until round 0 is configured
    out = {"wall_s": wall, "flwr": flwr.__version__, "ray": ray.__version__, "torch": torch.__version__, **res}
    with open(os.environ["LCFED_FLOWER_OUT"], "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out))
