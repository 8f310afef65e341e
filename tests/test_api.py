"""The Python API (lcfed/api.py): configs from files, dicts and overrides; a run with its models; the Tune
trainable inside a user's own Tuner, with the user's space and callback, giving the run's own numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from ray import tune

from lcfed import api
from lcfed.errors import ConfigError
from tests.conftest import TINY, start_test_ray

ROOT = Path(__file__).resolve().parents[1]


def test_configs_from_a_file_a_dict_and_another_config():
    from_file = api.config(ROOT / "configs" / "demo.yaml", {"train.rounds": 2, "method.mu": 0.5})
    assert from_file.train.rounds == 2 and from_file.method.params.mu == 0.5 and from_file.data.alpha == 0.15
    as_sets = api.config(str(ROOT / "configs" / "demo.yaml"), ["train.rounds=2", "method.mu=0.5"])
    assert as_sets == from_file
    assert api.config(from_file, {"method.name": "fedavg"}).method.name == "fedavg"
    assert api.config(TINY).data.num_devices == 8 and api.config().method.name == "lcfed"
    with pytest.raises(ConfigError, match=r"method\.mu"):
        api.config(TINY, {"method.mu": -1})


def test_a_run_gives_history_final_metrics_and_models():
    cfg = api.config(TINY, {"train.rounds": 2})
    result = api.run(cfg, models=True)
    assert [int(r["round"]) for r in result.history] == [0, 1] and 0 <= result.final["acc_mean"] <= 1
    assert result.models is not None and sorted(result.models.personal) == list(range(8))
    assert result.provenance["numerics"] == "portable"
    with pytest.raises(ConfigError, match="engine"):
        api.run(cfg, engine="spark")


@pytest.mark.ray
def test_the_trainable_in_a_users_own_tuner(tmp_path):
    """The user's space (a grid of mu, not its default of 0.1), metric, callback and storage; the trial reports
    every round and ends with the numbers an in-process run of its config gives. One trial: a second would check
    nothing more (each trial its own process) but cost one."""
    cfg = api.config(TINY, {"train.rounds": 2})

    class Count(tune.Callback):
        results = 0

        def on_trial_result(self, iteration, trials, trial, result, **info):
            Count.results += 1

    start_test_ray()
    try:
        tuner = tune.Tuner(api.trainable(cfg), param_space={"method.mu": tune.grid_search([1.0])},
                           tune_config=tune.TuneConfig(metric="acc_mean", mode="max"),
                           run_config=tune.RunConfig(storage_path=str(tmp_path), callbacks=[Count()], verbose=0))
        grid = tuner.fit()
    finally:
        ray.shutdown()
    assert Count.results == 2 and len(grid) == 1 and not grid.errors
    for r in grid:
        assert r.config["method.mu"] == 1.0
        expected = api.run(api.config(cfg, {"method.mu": 1.0}))
        assert r.metrics["round"] == 1
        assert r.metrics["acc_mean"] == expected.final["acc_mean"]
        assert r.metrics["train_loss"] == expected.final["train_loss"]
