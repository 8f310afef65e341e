"""Cross-device scale: device state only for devices that trained (spilling to disk past a budget),
sampled evaluation rounds, and synthetic data of any size. Every case here is tiny; the figures at
m = 10^3..10^5 come from ``benchmarks/scale.py --sweep``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from lcfed.data.sources import synthetic_dataset
from lcfed.engines.device_states import DeviceStates
from lcfed.engines.hosted import HostedDevices
from lcfed.engines.local import LocalPool, LocalServer, run_local
from lcfed.errors import ConfigError
from lcfed.learning.local_update import EvalResult
from lcfed.learning.metrics import accuracy_metrics, sampled_mean_ci95
from lcfed.methods.base import PersonalModel
from lcfed.run.checkpoint import load
from lcfed.run.loop import run_rounds
from lcfed.run.rounds import FINAL_EVAL_AUTO, eval_sample, eval_size
from lcfed.run.setup import prepare
from tests.conftest import same_history, same_metrics, tiny_config


def test_never_trained_device_reads_the_initial_state_and_a_trained_one_its_own():
    init = torch.tensor([1.0, 2.0, 3.0])
    states = DeviceStates(lambda d: PersonalModel(init.clone()))
    assert len(states) == 0 and 5 not in states
    assert torch.equal(states.get(5).weights, init) and not states.get(5).trained
    states.put(5, PersonalModel(torch.tensor([4.0, 5.0, 6.0]), True))
    assert torch.equal(states.get(5).weights, torch.tensor([4.0, 5.0, 6.0])) and states.get(5).trained
    assert torch.equal(states.get(6).weights, init)  # the others still read the initial model
    assert list(states.stored()) == [5] and states.memory_bytes == 12


def test_states_past_the_budget_spill_to_disk_and_read_back_bit_for_bit():
    rng = np.random.default_rng(0)
    budget = 2 * 4 * 7  # two states of 7 float32 in memory
    states = DeviceStates(lambda d: PersonalModel(torch.zeros(7)), budget_bytes=budget)
    written = {}
    for _ in range(3):  # replaced states free their slots for the next ones
        for d in range(6):
            w = torch.from_numpy(rng.standard_normal(7).astype(np.float32))
            states.put(d, PersonalModel(w, True))
            written[d] = w.clone()
    assert states.memory_bytes <= budget and states.spilled == 4 and len(states) == 6
    for d, w in written.items():
        got = states.get(d)
        assert got.trained and got.weights.dtype == torch.float32 and torch.equal(got.weights, w)
    # four spilled devices over three rounds use five slots: a replaced state's slot is reused
    assert {ref.weights.slot for ref in states._disk.values()} <= set(range(5))
    got = states.get(3).weights
    got += 1  # a copy: writing into what was read changes nothing stored
    assert torch.equal(states.get(3).weights, written[3])
    assert not [f for f in os.listdir(states.spill_dir or "/tmp") if f.startswith("lcfed-states-")]
    states.clear()
    assert len(states) == 0 and torch.equal(states.get(3).weights, torch.zeros(7))


def test_hosted_devices_store_only_the_participants_states():
    cfg = tiny_config("train.participation=0.25", "method.num_clusters=2", "method.rank=2", "train.rounds=1")
    setup = prepare(cfg)
    hosted = HostedDevices(setup, range(8))
    try:
        server = LocalServer(setup.strategy())
        plan = server.configure(0)
        server.aggregate(plan, LocalPool(hosted).train(plan))
        states = hosted.get_states()
        assert sorted(states) == list(plan.devices) and len(plan.devices) == 2
        assert all(s.trained and not torch.equal(s.weights, setup.federation.init) for s in states.values())
        idle = next(d for d in range(8) if d not in plan.devices)
        assert torch.equal(hosted.states.get(idle).weights, setup.federation.init)
    finally:
        hosted.close()


def test_checkpoint_holds_the_devices_that_trained(tmp_path):
    cfg = tiny_config("train.participation=0.25", "method.num_clusters=2", "method.rank=2", "train.rounds=2", f"checkpoint.dir={tmp_path}")
    res = run_local(cfg)
    snap = load(tmp_path / "latest.pt")
    assert sorted(snap.device_states) == list(snap.trained) == list(np.flatnonzero(res.trained))
    assert 2 <= len(snap.device_states) <= 4 < cfg.data.num_devices


@pytest.mark.parametrize("method", ["lcfed", "fedper", "dcpfl"])
def test_spilling_on_a_tiny_budget_gives_the_same_numbers(method, tmp_path):
    # dcpfl trains every device every round (its discrepancy matrix needs them all)
    extra = ["train.rounds=5", "method.t_start=2"] if method == "dcpfl" else ["train.participation=0.5"]
    base = tiny_config(f"method.name={method}", *extra)
    spill = base.replace(**{"engine.state_memory_mb": 0.0001, "engine.spill_dir": str(tmp_path)})
    same_history(run_local(base).history, run_local(spill).history)
    assert not os.listdir(tmp_path)  # the spill files were unlinked once mapped


def test_spilled_states_survive_a_checkpoint_and_resume(tmp_path):
    cfg = tiny_config("train.participation=0.5", "train.rounds=4", "engine.state_memory_mb=0.0001",
                      f"checkpoint.dir={tmp_path}")
    whole = run_local(cfg.replace(**{"checkpoint.dir": None}))
    run_local(cfg.replace(**{"train.rounds": 2}))
    resumed = run_local(cfg, resume=load(tmp_path / "latest.pt"))
    same_history(whole.history, resumed.history)


def test_eval_sample_is_seeded_among_trained_devices_and_every_device_last():
    cfg = tiny_config("train.eval_devices=3", "train.rounds=5")
    trained = np.zeros(8, dtype=bool)
    trained[[1, 2, 4, 6, 7]] = True
    a = eval_sample(cfg, 1, trained)
    assert a == eval_sample(cfg, 1, trained) and len(a) == 3 and set(a) <= {1, 2, 4, 6, 7} and list(a) == sorted(a)
    assert eval_sample(cfg, 4, trained) is None  # the last round scores every device
    assert eval_sample(cfg.replace(**{"train.eval_devices": 0}), 1, trained) is None
    assert eval_sample(cfg.replace(**{"train.eval_devices": 8}), 1, trained) == (1, 2, 4, 6, 7)


def test_final_evaluation_scores_every_device_up_to_the_threshold_a_sample_above_or_as_told():
    cfg = tiny_config("train.eval_devices=3", "train.rounds=5")
    last = 4
    assert eval_size(cfg, 1, 10**6) == 3  # before the last round: train.eval_devices
    assert eval_size(cfg, last, FINAL_EVAL_AUTO) == 0  # auto: every device up to the threshold
    assert eval_size(cfg, last, FINAL_EVAL_AUTO + 1) == FINAL_EVAL_AUTO == 10_000  # a sample above it
    assert eval_size(cfg.replace(**{"train.final_eval_devices": 0}), last, 10**6) == 0  # every device, asked
    assert eval_size(cfg.replace(**{"train.final_eval_devices": 7}), last, 20) == 7
    trained = np.ones(12, dtype=bool)
    sample = eval_sample(cfg.replace(**{"train.final_eval_devices": 5}), last, trained)
    assert sample is not None and len(sample) == 5 and sample == eval_sample(cfg.replace(**{"train.final_eval_devices": 5}), last, trained)


def test_a_sampled_mean_carries_its_95_percent_interval():
    acc = np.array([0.5, 1.0, 0.0])  # s = 0.5 (n - 1 in the denominator)
    assert sampled_mean_ci95(acc, 10) == pytest.approx(1.959963984540054 * 0.5 / 3**0.5 * (7 / 9) ** 0.5, abs=1e-15)
    assert sampled_mean_ci95(acc, 3) == 0.0 and sampled_mean_ci95(acc[:1], 10) == 0.0  # the whole; one device
    results = {d: EvalResult(correct=c, total=4, loss_sum=1.0) for d, c in enumerate([2, 4, 0])}
    trained = np.zeros(10, dtype=bool)
    trained[:7] = True  # 3 of the 7 devices the metrics count were scored
    assert accuracy_metrics(results, trained)["acc_mean_ci95"] == pytest.approx(sampled_mean_ci95(acc, 7))
    assert "acc_mean_ci95" not in accuracy_metrics(results, np.ones(3, dtype=bool))  # every counted device scored


def test_sampled_evaluation_scores_the_sample_and_leaves_training_alone():
    cfg = tiny_config("train.participation=0.5", "train.rounds=4")
    full = run_local(cfg)
    sampled_cfg = cfg.replace(**{"train.eval_devices": 2, "train.final_eval_devices": 3})
    seen: list[int] = []

    class Counting(LocalPool):
        def evaluate(self, payload, devices=None):
            out = super().evaluate(payload, devices)
            seen.append(len(out))
            return out

    setup = prepare(sampled_cfg)
    hosted = HostedDevices(setup, range(8))
    try:
        sampled = run_rounds(sampled_cfg, setup.federation, LocalServer(setup.strategy()),
                             Counting(hosted))
    finally:
        hosted.close()
    assert seen == [2, 2, 2, 3]  # a sample of two trained devices, then three in the last round
    for a, b in zip(full.history, sampled.history, strict=True):
        assert a["train_loss"] == b["train_loss"] and a["bytes_up"] == b["bytes_up"]
    assert "acc_mean_ci95" not in full.final and sampled.final["acc_mean_ci95"] > 0
    assert set(sampled.evaluation) <= set(np.flatnonzero(sampled.trained)) and len(sampled.evaluation) == 3
    assert sampled_cfg.digest() == cfg.digest()  # it changes no trained number: checkpoints resume across it
    again = run_local(sampled_cfg)
    same_metrics([again.final], [sampled.final])  # seeded: the same sample, the same numbers
    assert set(again.evaluation) == set(sampled.evaluation)


def test_synthetic_data_of_any_size():
    small = synthetic_dataset(1000)
    again = synthetic_dataset(1000)
    assert small.x.shape == (1000, 1, 28, 28) and small.x.dtype == np.uint8 and len(np.unique(small.y)) == 10
    assert np.array_equal(small.x, again.x) and np.array_equal(small.y, again.y)
    default = synthetic_dataset()
    assert len(default.y) == 60_000
    # the same class templates: the per-class mean images of both sizes agree closely
    for c in range(3):
        diff = small.x[small.y == c].mean(0) - default.x[default.y == c].mean(0)
        assert np.abs(diff).mean() < 6
    cfg = tiny_config("data.dataset=synthetic", "data.synthetic_samples=4000", "data.num_devices=200",
                      "data.min_samples=4", "train.participation=0.1", "train.rounds=1",
                      "method.num_clusters=2", "method.rank=2")
    res = run_local(cfg)
    assert res.history[0]["coverage"] == 0.1 and np.isfinite(res.final["acc_mean"])


@pytest.mark.parametrize("override,field", [
    ("train.eval_devices=-1", "train.eval_devices"),
    ("train.final_eval_devices=-2", "train.final_eval_devices"),
    ("data.synthetic_samples=5000", "data.synthetic_samples"),  # the dataset is digits
    ("engine.state_memory_mb=-1", "engine.state_memory_mb"),
])
def test_bad_scale_fields_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        tiny_config(override)
