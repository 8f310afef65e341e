"""The conformance check (lcfed/conformance.py, `lcfed check`): every built-in keeps the contract, and a
deliberately broken strategy fails on the property it breaks, named in the report."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from lcfed import conformance
from lcfed.errors import ConfigError
from lcfed.methods import METHODS
from lcfed.methods.fedavg import FedAvg, FedAvgParams, FedAvgState
from tests.conftest import start_test_ray, tiny_config
from tune_jobs.cli import main


class Mutating(FedAvg):
    """Writes the new global model into the old state's tensor."""


    def aggregate(self, state, plan, msgs):
        new, stats = super().aggregate(state, plan, msgs)
        state.weights.copy_(new.weights)
        return FedAvgState(state.weights), stats


class Unseeded(FedAvg):
    """Jitters the local models with noise from an unseeded generator."""

    def local(self, ctx, dev, payload, instruction):
        noise = torch.from_numpy(np.random.default_rng().standard_normal(payload.numel()).astype(np.float32))
        return super().local(ctx, dev, payload + 1e-3 * noise, instruction)


class RayOnly(FedAvg):
    """Trains less inside a Ray actor than in the driver: numbers depend on where a device lives."""

    def local(self, ctx, dev, payload, instruction):
        in_actor = ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
        return super().local(ctx, dev, payload * (0.5 if in_actor else 1.0), instruction)


class NeedsTwoClusters(FedAvg):
    """Refuses its config in ``__init__``, as a plugin checking a combination of its params would."""

    def __init__(self, cfg, fed):
        super().__init__(cfg, fed)
        raise ConfigError("method.name", cfg.method.name, "needs data.num_devices >= 100")


class OnAnMLP(FedAvg):
    """States the model it runs with, and the only one."""

    model = "mlp"
    models = ("mlp",)


for broken in (Mutating, Unseeded, RayOnly, NeedsTwoClusters, OnAnMLP):
    broken.Params = FedAvgParams  # type: ignore[attr-defined]


def failed(findings):
    return {f.prop: f.detail for f in findings if not f.ok}


@pytest.mark.parametrize("name", list(METHODS))
def test_every_builtin_keeps_the_contract(name):
    # fedrep's head trains head_factor times the local steps (10 by default): the same code at 2, a fifth of the cost
    cfg = conformance.small_config(name, **{"method.head_factor": 2}) if name == "fedrep" else None
    findings = conformance.check(name, cfg=cfg)
    assert [f.prop for f in findings] == ["seeded", "pure", "priced", "resumable"]
    assert failed(findings) == {}, conformance.report(name, findings)


class Forgetful(FedAvg):
    """Counts its aggregations on itself, not in its state: a resumed run starts the count again."""

    def aggregate(self, state, plan, msgs):
        new, stats = super().aggregate(state, plan, msgs)
        self.__dict__["n"] = self.__dict__.get("n", 0) + 1
        return FedAvgState(new.weights * (1.0 + 0.01 * (self.__dict__["n"] % 2))), stats


Forgetful.Params = FedAvgParams  # type: ignore[attr-defined]


def test_broken_strategies_fail_on_the_property_they_break(capsys):
    unseeded = failed(conformance.check(f"{__name__}:Unseeded"))
    assert "seeded" in unseeded and "round 1" in unseeded["seeded"]
    assert failed(conformance.check(f"{__name__}:Forgetful")).keys() == {"resumable"}
    assert main(["check", f"{__name__}:Mutating"]) == 1  # one check of it, its report read
    out = capsys.readouterr().out
    assert "  pure       FAILED  aggregate changed its arguments in place" in out and "  seeded     ok" in out
    assert [line.split()[0] for line in out.splitlines() if "FAILED" in line] == ["pure"]


@pytest.mark.ray
@pytest.mark.slow  # ~25 s; in-process = Ray is also tested for every built-in in tests/test_engines.py
def test_the_ray_engine_property():
    start_test_ray()
    try:
        assert failed(conformance.check("fedavg", ray=True)) == {}
        ray_only = failed(conformance.check(f"{__name__}:RayOnly", ray=True))
    finally:
        ray.shutdown()
    assert set(ray_only) == {"engines"} and "round 1" in ray_only["engines"]


@pytest.mark.parametrize("devices", [
    {"devices.availability": "diurnal", "devices.online_fraction": 0.5, "devices.period_hours": 0.01},
    {"devices.aggregation": "async", "devices.async_buffer": 2, "devices.dropout": 0.2},
], ids=["diurnal", "async"])
def test_the_device_models_schedule_is_part_of_the_same_run(devices):
    """Issue 49: the watched run and the unwatched one keep the same devices (the server's ``scheduled`` reaches
    the strategy through the guard), so FedAvg keeps the contract on the device model, sync and async."""
    cfg = conformance.small_config("fedavg", **{"devices.simulate": True, **devices})
    findings = conformance.check("fedavg", cfg=cfg)
    assert all(f.ok for f in findings), conformance.report("fedavg", findings)


def test_a_config_error_from_a_strategy_is_one_line_and_exit_2(capsys):
    """Not a failed property each (the method did not run): the CLI's one line, before any report."""
    assert main(["check", f"{__name__}:NeedsTwoClusters"]) == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("lcfed:")]  # (besides the progress line)
    assert errors == ["lcfed: config error: method.name: got 'tests.test_conformance:NeedsTwoClusters'; "
                      "needs data.num_devices >= 100"], err
    assert "FAILED" not in out and "Traceback" not in err


def test_a_method_states_its_model_and_lcfed_check_runs_it(capsys):
    """``Strategy.model``: what a config naming no model runs (lcfed check's small federation too, with no
    --set); ``Strategy.models``: another is refused, naming the field and what is allowed."""
    name = f"{__name__}:OnAnMLP"
    assert conformance.small_config(name).model.name == "mlp"
    assert tiny_config(f"method.name={name}").model.name == "mlp"
    assert main(["check", name]) == 0
    assert "  seeded     ok" in capsys.readouterr().out
    assert main(["check", name, "--set", "model.name=lenet5"]) == 2
    assert f"model.name: got 'lenet5'; method {name} runs with mlp only" in capsys.readouterr().err


def test_the_report_names_the_method_checked(capsys):
    assert main(["check", "fedavg", "--set", "method={name: standalone}"]) == 2
    assert "--set method: got 'standalone'; lcfed check checks fedavg" in capsys.readouterr().err
