"""Vectorized local training: devices' SGD steps batched by vmap give the loop's numbers."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import pytest
import torch

from lcfed.engines.hosted import HostedDevices
from lcfed.engines.local import run_local
from lcfed.learning.local_update import DeviceData, LocalWork, batch_rng, local_update
from lcfed.learning.vectorized import BatchedNet, StepBatcher
from lcfed.run.setup import prepare
from tests.conftest import tiny_config


def _close(a: list[dict], b: list[dict], tol: float) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        for key in ra:
            if key != "round_seconds" and not (math.isnan(ra[key]) and math.isnan(rb[key])):
                assert ra[key] == pytest.approx(rb[key], rel=tol, abs=tol), (key, ra[key], rb[key])


@pytest.mark.parametrize("method", ["fedavg", "lcfed", "perfedavg", "ifca"])
def test_vectorized_training_matches_the_loop(method):
    two = ("train.rounds=2",)  # a round from the first one's state is what a third would add
    loop = run_local(tiny_config(f"method.name={method}", *two, "engine.vectorize=never"))
    vec = run_local(tiny_config(f"method.name={method}", *two, "engine.vectorize=always"))
    _close(loop.history, vec.history, 1e-5)
    assert loop.final["acc_mean"] == vec.final["acc_mean"]


def test_an_asynchronous_round_that_gives_a_device_two_jobs_trains_both():
    """FedBuff gives a fast device a second job in the same aggregation window: the batcher takes each of its
    jobs in a batch of its own (a device asking twice in one batch would be out of turn), as the loop does."""
    sets = ("devices.simulate=true", "devices.aggregation=async", "devices.async_buffer=2", "devices.speed_sigma=1.0",
            "method.num_clusters=2", "method.rank=2", "train.participation=0.5")
    loop = run_local(tiny_config(*sets, "engine.vectorize=never"))
    vec = run_local(tiny_config(*sets, "engine.vectorize=always"))
    _close(loop.history, vec.history, 1e-5)


def test_vectorized_training_is_reproducible_and_chunked():
    a = run_local(tiny_config("train.rounds=2", "engine.vectorize=always", "engine.vectorize_max=3"))
    b = run_local(tiny_config("train.rounds=2", "engine.vectorize=always", "engine.vectorize_max=3", "engine.workers=2"))
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]


def _setup():
    cfg = tiny_config()
    setup = prepare(cfg)
    net = setup.network(torch.device("cpu"))
    return setup, net


def _data(n: int, seed: int) -> DeviceData:
    g = torch.Generator().manual_seed(seed)
    return DeviceData(torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g), torch.zeros(0), torch.zeros(0))


def test_batcher_serves_each_members_own_gradient_in_lockstep():
    setup, net = _setup()
    w0 = setup.federation.init
    # member 2 has 20 samples (< batch 32): its batches have another shape, so a second call per tick
    data = {0: _data(50, 0), 1: _data(60, 1), 2: _data(20, 2)}
    steps = {0: 4, 1: 2, 2: 3}
    expect = {m: local_update(net, w0, data[m], LocalWork(0.05, 32, steps=steps[m]), batch_rng(0, m, 0)) for m in data}

    batcher = StepBatcher(net, data)
    got = {}

    def run(m: int) -> None:
        try:
            own = setup.network(torch.device("cpu"))
            got[m] = local_update(BatchedNet(lambda: own, batcher, m), w0, data[m], LocalWork(0.05, 32, steps=steps[m]), batch_rng(0, m, 0))
        finally:
            batcher.leave(m)

    threads = [threading.Thread(target=run, args=(m,)) for m in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for m in data:
        assert got[m].steps == steps[m]
        assert got[m].loss == pytest.approx(expect[m].loss, rel=1e-6)
        torch.testing.assert_close(got[m].weights, expect[m].weights, rtol=0, atol=1e-6)
    # 4 ticks (the longest member's steps); ticks 1-3 hold two shapes, tick 4 member 0 alone
    assert batcher.ticks == 4 and batcher.calls == 7


def test_batcher_failure_reaches_every_waiting_member():
    setup, net = _setup()
    batcher = StepBatcher(net, [0, 1])
    errors = []

    def run(m: int, y: torch.Tensor) -> None:
        try:
            batcher.loss_and_grad(m, setup.federation.init, torch.rand(4, 1, 28, 28), y)
        except RuntimeError as exc:
            errors.append((m, exc))
        finally:
            batcher.leave(m)

    good, bad = torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 0, 11])  # class 11 of 10: the call fails
    threads = [threading.Thread(target=run, args=(0, good)), threading.Thread(target=run, args=(1, bad))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(m for m, _ in errors) == [0, 1]
    assert all(e.__cause__ is errors[0][1].__cause__ for _, e in errors)  # one failure, seen by both
    with pytest.raises(RuntimeError, match="failed"):
        batcher.loss_and_grad(0, setup.federation.init, torch.rand(4, 1, 28, 28), good)


def test_batcher_refuses_a_stranger():
    _, net = _setup()
    with pytest.raises(RuntimeError, match="out of turn"):
        StepBatcher(net, [0]).loss_and_grad(5, torch.zeros(3), torch.zeros(1), torch.zeros(1))


def test_hosted_devices_vectorize_only_where_asked():
    cfg = tiny_config()
    setup = prepare(cfg)
    for mode, expect in (("auto", False), ("never", False), ("always", True)):  # auto: CPU here, so the loop
        hosted = HostedDevices(replace(setup, cfg=cfg.replace(**{"engine.vectorize": mode})), range(4))
        assert hosted.vectorize is expect
        hosted.close()
