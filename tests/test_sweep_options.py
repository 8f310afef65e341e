"""`lcfed sweep`'s objective flags (--metric, --mode, --scheduler, --grace-period, --max-t), the readable
search space and child run names: checked without starting Ray."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lcfed.errors import ConfigError
from lcfed.run.metric_catalog import CATALOG, objectives
from tests.conftest import tiny_config
from tune_jobs.sweep.best import best_result
from tune_jobs.sweep.objective import Objective, resolve_objective
from tune_jobs.sweep.search import make_scheduler
from tune_jobs.sweep.space import describe_domain, space_spec, swept_keys


def test_defaults_half_way_grace_and_the_metrics_direction():
    assert resolve_objective(10) == Objective("acc_mean", "max", "asha", 5, 10)
    assert resolve_objective(1) == Objective("acc_mean", "max", "asha", 1, 1)
    assert resolve_objective(10, max_t=6).grace_period == 3
    for metric, mode in [("acc_weighted", "max"), ("label_homogeneity", "max"), ("ari", "max"),
                         ("test_loss", "min"), ("train_loss", "min"), ("acc_std", "min")]:
        assert resolve_objective(4, metric).mode == mode, metric
    assert resolve_objective(4, "test_loss", "max").mode == "max"  # an explicit --mode wins
    assert resolve_objective(4, "num_clusters", "min").mode == "min"
    assert resolve_objective(4, scheduler="fifo") == Objective("acc_mean", "max", "fifo", None, None)
    assert resolve_objective(8, scheduler="hyperband", grace_period=2, max_t=4) == Objective(
        "acc_mean", "max", "hyperband", 2, 4)


@pytest.mark.parametrize("kwargs,flag", [
    ({"metric": "accuracy"}, "--metric"),
    ({"metric": "cluster_size_0"}, "--metric"),
    ({"metric": "num_clusters"}, "--mode"),  # no natural direction
    ({"mode": "up"}, "--mode"),
    ({"scheduler": "pbt"}, "--scheduler"),
    ({"grace_period": 0}, "--grace-period"),
    ({"grace_period": 5, "max_t": 4}, "--grace-period"),
    ({"max_t": 9}, "--max-t"),
    ({"max_t": 0}, "--max-t"),
    ({"scheduler": "fifo", "grace_period": 1}, "--grace-period"),
    ({"scheduler": "fifo", "max_t": 4}, "--max-t"),
])
def test_bad_objectives_name_their_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        resolve_objective(8, **kwargs)


def test_schedulers_get_the_grace_period_and_max_t():
    import ray
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler

    asha = make_scheduler(resolve_objective(12, grace_period=3))
    assert isinstance(asha, ASHAScheduler) and asha._max_t == 12 and asha._brackets[0]._rungs[-1][0] == 3
    hb = make_scheduler(resolve_objective(27, scheduler="hyperband", grace_period=4))
    assert isinstance(hb, HyperBandScheduler) and hb._max_t_attr == 27
    assert [hb._get_r0(s) for s in range(4)] == [27, 9, 4, 4]  # first rungs: no earlier than the grace period
    assert isinstance(make_scheduler(resolve_objective(5, scheduler="fifo")), FIFOScheduler)
    assert not ray.is_initialized()


def test_the_space_is_logged_in_its_file_form():
    from ray import tune

    space = {"method.mu": tune.loguniform(0.001, 1.0), "method.lam": tune.uniform(0.0, 0.5),
             "train.lr": tune.grid_search([0.05, 0.1]), "method.num_clusters": tune.choice([2, 4]),
             "method.rank": tune.randint(2, 6), "train.local_steps": tune.qrandint(2, 8, 2), "seed": 3}
    assert [describe_domain(v) for v in space.values()] == [
        "loguniform(0.001, 1)", "uniform(0, 0.5)", "grid([0.05, 0.1])", "choice([2, 4])", "randint(2, 6)",
        "qrandint(2, 8, 2)", "3"]
    assert space_spec(space["method.mu"]) == {"loguniform": [0.001, 1.0]}
    assert space_spec(space["train.lr"]) == {"grid": [0.05, 0.1]}
    assert swept_keys(space) == list(space)[:-1]  # a fixed value is not swept


def test_every_domain_of_a_space_file_loads_and_is_logged_as_written(tmp_path):
    from tune_jobs.sweep.space import DOMAINS, load_space

    specs = {"method.mu": {"loguniform": [0.001, 1.0]}, "method.lam": {"uniform": [0.0, 0.5]},
             "train.lr": {"quniform": [0.05, 0.2, 0.05]}, "train.batch_size": {"grid": [16, 32]},
             "method.num_clusters": {"choice": [2, 4]}, "train.rounds": {"randint": [2, 6]},
             "train.local_steps": {"qrandint": [2, 8, 2]}}
    assert {next(iter(spec)) for spec in specs.values()} == set(DOMAINS)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(specs))
    space = load_space(path, tiny_config())
    assert {k: space_spec(v) for k, v in space.items()} == specs


def test_child_names_carry_the_swept_values():
    from lcfed.tracking.naming import method_label as child_name

    assert child_name("lcfed", {"method.mu": 0.03124, "method.lam": 0.2}) == "lcfed mu=0.0312 lam=0.2"
    assert child_name("fedac", {"method.num_clusters": 4, "train.lr": 1e-5}) == "fedac num_clusters=4 lr=1e-05"
    assert child_name("lcfed", {"train.lr": 0.1, "method.lr": 0.2}) == "lcfed train.lr=0.1 method.lr=0.2"
    assert child_name("fedavg", {}) == "fedavg"


def test_the_best_trial_follows_the_mode_and_ties_go_to_the_first_trial():
    results = [SimpleNamespace(metrics={"test_loss": v, "trial_id": t}, error=None)
               for v, t in [(0.5, "a_00002"), (0.3, "a_00001"), (0.3, "a_00000"), (float("nan"), "a_00003")]]
    assert best_result(results, "test_loss", "min").metrics["trial_id"] == "a_00000"
    assert best_result(results, "test_loss", "max").metrics["trial_id"] == "a_00002"
    with pytest.raises(Exception, match="finite ari"):
        best_result(results, "ari", "max")
    # a seeded search's trial ids are random: ties go to the trial created first
    assert best_result(results, "test_loss", "min", {"a_00001": 0, "a_00000": 1}).metrics["trial_id"] == "a_00001"


def test_the_best_trial_is_one_that_ran_the_most_rounds():
    """ASHA stopped b at round 1 on 0.9: it is not compared with a and c, which ran 4 rounds."""
    results = [SimpleNamespace(metrics={"acc_mean": v, "round": r, "trial_id": t}, error=None)
               for v, r, t in [(0.7, 3, "a"), (0.9, 1, "b"), (0.8, 3, "c")]]
    assert best_result(results, "acc_mean", "max").metrics["trial_id"] == "c"


@pytest.mark.subprocess
def test_every_metric_a_run_reports_is_catalogued_and_sweepable():
    """The catalogue holds the engine's per-round metrics (besides per-layer bytes and cluster sizes); --metric takes them."""
    from lcfed.engines.local import run_local

    result = run_local(tiny_config("train.rounds=1", "data.partition=dirichlet", "data.alpha=0.5", "data.val_fraction=0.2",
                                   "data.holdout_fraction=0.25"))
    reported = {k for row in result.history for k in row if k != "round" and "/" not in k}
    catalogued = {m.name for m in CATALOG}
    assert reported <= catalogued, reported - catalogued
    assert reported - {"nmi"} <= set(objectives()), reported - set(objectives())
    # ari: where K clusters can express groups; nmi: on a testbed; the device model's: with a devices section;
    # the privacy metrics: under privacy.mode central, adaptive clipping or DP-SGD
    elsewhere = {"ari", "nmi"} | {m.name for m in CATALOG if "devices" in m.when or "`privacy." in m.when}
    assert catalogued - reported <= elsewhere, catalogued - reported


# -- the sweep options: one object, one check, one declaration of each flag for `lcfed sweep` and `lcfed compare` --


def _subparser(name: str):
    import argparse

    from tune_jobs.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def test_the_defaults_are_the_flags_and_validate_to_the_default_objective():
    from tune_jobs.sweep.options import SweepOptions, sweep_options

    args = _subparser("sweep").parse_args(["--space", "s.yaml"])
    assert sweep_options(args) == SweepOptions(storage="outputs/sweeps")  # the flag's default, None in Python
    assert SweepOptions().validate(10) == Objective("acc_mean", "max", "asha", 5, 10)
    assert SweepOptions(scheduler="fifo", metric="test_loss").validate(4) == Objective("test_loss", "min", "fifo")


@pytest.mark.parametrize("kwargs,flag,says", [
    ({"num_samples": 0}, "--num-samples", "must be >= 1"),
    ({"num_samples": 2.5}, "--num-samples", "must be >= 1"),
    ({"max_concurrent": -1}, "--max-concurrent", "must be >= 0"),
    ({"gpus_per_trial": -1.0}, "--gpus-per-trial", "must be >= 0"),
    ({"gpus_per_trial": float("nan")}, "--gpus-per-trial", "must be >= 0"),
    ({"trial_engine": "spark"}, "--trial-engine", "one of ['auto', 'local', 'ray']"),
    ({"search": "bayes"}, "--search", "one of ['random', 'grid', 'optuna', 'hyperopt']"),
    ({"scheduler": "pbt"}, "--scheduler", "one of ['asha', 'hyperband', 'fifo']"),
    ({"metric": "accuracy"}, "--metric", "a per-round metric"),
    ({"mode": "up"}, "--mode", "max or min"),
    ({"max_t": 9}, "--max-t", "between 1 and train.rounds (8)"),
    ({"scheduler": "fifo", "grace_period": 2}, "--grace-period", "only with --scheduler asha or hyperband"),
    ({"keep_checkpoints": 0}, "--keep-checkpoints", ">= 1"),
    ({"register": "a/b"}, "--register", "without '/' or ':'"),
    ({"register": "best", "max_t": 4}, "--max-t", "with --register"),
    ({"name": "../x"}, "--name", "letters, digits"),
    ({"storage": "/proc/self/tune"}, "--storage", "cannot hold files"),
])
def test_every_bad_option_is_refused_naming_its_flag(kwargs, flag, says):
    from tune_jobs.sweep.options import SweepOptions

    with pytest.raises(ConfigError, match=flag) as err:
        SweepOptions(**kwargs).validate(8)
    assert says in str(err.value)


def test_sweep_and_compare_declare_their_shared_flags_alike():
    """One declaration of each flag: compare offers a subset of sweep's options with the same type, choices
    and metavar (its --search and --scheduler with sweep's choices), in its own words where the meaning differs;
    its --storage defaults to <out>/tune (None)."""
    from tune_jobs.sweep.options import SWEEP_FLAGS, sweep_options

    def actions(name):
        return {a.dest: a for a in _subparser(name)._actions if a.dest in SWEEP_FLAGS}

    sweep_flags, compare_flags = actions("sweep"), actions("compare")
    assert list(sweep_flags) == list(SWEEP_FLAGS)
    assert set(compare_flags) == {"search", "scheduler", "max_concurrent", "gpus_per_trial", "storage", "name",
                                  "keep_checkpoints", "register"}
    for dest, a in compare_flags.items():
        b = sweep_flags[dest]
        assert (a.option_strings, a.type, a.choices, a.metavar) == (b.option_strings, b.type, b.choices, b.metavar)
        assert a.default == (None if dest == "storage" else b.default), dest
    assert compare_flags["search"].choices == ["random", "grid", "optuna", "hyperopt"]
    assert "<out>/tune" in compare_flags["storage"].help and "phase-1" in compare_flags["search"].help
    args = _subparser("compare").parse_args(["--methods", "lcfed,fedavg", "--search", "optuna", "--max-concurrent",
                                             "2", "--register", "best"])
    options = sweep_options(args)
    assert (options.search, options.max_concurrent, options.register, options.storage, options.name) == (
        "optuna", 2, "best", None, None)
    assert options.num_samples == 1 and options.trial_engine == "auto"  # no such flags: the defaults


def test_a_comparisons_sweeps_derive_their_options_from_its_own():
    from dataclasses import replace

    from tune_jobs.compare import ComparePlan
    from tune_jobs.sweep.options import SweepOptions

    shared = SweepOptions(search="optuna", scheduler="hyperband", grace_period=2, max_concurrent=3, gpus_per_trial=0.5,
                          name="cmp", storage="/tmp/tune", keep_checkpoints=1, register="best")
    plan = ComparePlan(base=tiny_config(), methods=("lcfed", "mod:Mine"), out=Path("cmp"), configs={}, spaces={},
                       params={}, options=shared, budget=5, seeds=(0, 1), target=None)
    tuning, seeding = plan.tuning("lcfed"), plan.seeding("lcfed")
    assert tuning == replace(shared, num_samples=5, name="cmp-lcfed-tune", resume=True, register=None, log_models=False)
    assert seeding == replace(shared, num_samples=1, search="random", scheduler="fifo", grace_period=None,
                              name="cmp-lcfed-seeds", resume=True, register=None)
    assert plan.sweep_name("mod:Mine", "tune") == "cmp-mod-Mine-tune"  # a plugin path: one directory name
    for m in plan.methods:
        for options in (plan.tuning(m), plan.seeding(m)):
            options.validate(4)


def test_the_api_sweep_hands_its_options_to_run_sweep_as_one_object(monkeypatch):
    from lcfed import api
    from tune_jobs.sweep.options import SweepOptions

    calls = []
    monkeypatch.setattr("tune_jobs.sweep.run.run_sweep", lambda *a, **k: calls.append((a, k)) or {"trials": 0})
    cfg = tiny_config()
    assert api.sweep(cfg, {"method.mu": 0.1}, num_samples=3, scheduler="fifo", named={"seed": 0}) == {"trials": 0}
    ((base, space, options), nesting), = calls
    assert base is cfg and space == {"method.mu": 0.1} and nesting == {"named": {"seed": 0}}
    assert options == SweepOptions(num_samples=3, scheduler="fifo")
    with pytest.raises(TypeError, match="num_sample"):
        api.sweep(cfg, {"method.mu": 0.1}, num_sample=3)


def test_a_trials_name_leads_with_its_swept_values():
    from tune_jobs.sweep.callbacks import trial_run_name

    cfg = tiny_config("train.rounds=3")
    name = trial_run_name(cfg, {"method.mu": 0.03124, "method.lam": 0.2}, {"train.rounds": 3})
    assert name == "mu=0.0312 lam=0.2 · lcfed rounds=3 · digits path2 · s0"
    assert trial_run_name(cfg, {}, {}) == "lcfed · digits path2 · s0"
    # a seeds sweep (lcfed compare's phase 2): the seed stays where the name shows it
    assert trial_run_name(cfg, {"seed": 1}, {"method.mu": 0.1}) == "lcfed mu=0.1 · digits path2 · s0"


def test_a_trials_progress_line_carries_its_last_evaluation_never_nan():
    import io
    import math
    from types import SimpleNamespace

    from tune_jobs.sweep.callbacks import SweepProgress

    out = io.StringIO()
    progress = SweepProgress(["method.mu"], "acc_mean", "max", rounds=3, file=out, lines=True)
    trial = SimpleNamespace(trial_id="a_00000", config={"method.mu": 0.1}, experiment_tag="0_method.mu=0.1")
    for rnd, acc in enumerate([math.nan, 0.5, math.nan]):
        progress.on_trial_result(rnd, [trial], trial, {"round": rnd, "acc_mean": acc})
    assert [line.split("  ")[-1] for line in out.getvalue().splitlines()] == [
        "acc_mean not evaluated yet", "acc_mean 0.5", "acc_mean 0.5 (round 1)"]


def test_the_sweeps_pages_space_example_loads_and_a_display_form_is_refused_with_the_files_form(tmp_path):
    import re

    from tune_jobs.sweep.space import DOMAINS, load_space

    page = (Path(__file__).resolve().parents[1] / "docs" / "sweeps.md").read_text()
    (example,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "loguniform" in b]
    (tmp_path / "space.yaml").write_text(example)
    space = load_space(tmp_path / "space.yaml", tiny_config("data.num_devices=20"))
    assert {type(space[k]).__name__ for k in space} >= {"Float", "Categorical", "Integer"} and space["train.rounds"] == 20
    assert {k for line in example.splitlines() for k in DOMAINS if f"{{{k}:" in line} == set(DOMAINS)  # every domain
    (tmp_path / "bad.yaml").write_text("method.mu: loguniform(0.001, 1)\n")
    with pytest.raises(ConfigError, match=r"space\.method\.mu: .*display form.*\{loguniform: \[0\.001, 1\]\}"):
        load_space(tmp_path / "bad.yaml", tiny_config())


def test_a_methods_compare_space_is_read_next_to_its_module_and_a_module_class_method_names_its_class(
        tmp_path, monkeypatch):
    from tune_jobs.compare import method_space

    pkg = tmp_path / "plug"
    pkg.mkdir()
    (pkg / "space.yaml").write_text("train.lr: {loguniform: [0.01, 0.1]}\n")
    (pkg / "strat.py").write_text("from lcfed.methods.fedavg import FedAvg\n\n\n"
                                  "class Mine(FedAvg):\n    compare_space = 'space.yaml'\n\n\n"
                                  "class Lost(FedAvg):\n    compare_space = 'nowhere.yaml'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a relative compare_space is not read from the working directory
    assert method_space("plug.strat:Mine", None) == pkg / "space.yaml"
    with pytest.raises(ConfigError, match=r"nowhere\.yaml, which is not a file \(a relative path is read next to"):
        method_space("plug.strat:Lost", None)
    spaces = tmp_path / "spaces"
    spaces.mkdir()
    with pytest.raises(ConfigError, match=r"write .*spaces/Mine\.yaml or .*spaces/plug\.strat:Mine\.yaml"):
        method_space("plug.strat:Mine", spaces)
    (spaces / "Mine.yaml").write_text("train.lr: 0.05\n")
    assert method_space("plug.strat:Mine", spaces) == spaces / "Mine.yaml"


@pytest.mark.parametrize("level,shown", [(-1, False), (0, True)])
def test_a_failed_trial_under_quiet_is_not_tunes_traceback(level, shown, log_records):
    """Issue 49: with -q the sweep's one closing line says why a trial failed; Tune's logged traceback of the
    trial (ray.tune's ERROR records) is held back while it fits, and shown without -q."""
    import logging

    from lcfed import logs
    from tune_jobs.sweep.run import _fit

    class Tuner:
        def fit(self) -> None:
            logging.getLogger("ray.tune.execution.tune_controller").error("Trial task failed\nTraceback ...")

    with logs.verbosity_scope(level):
        assert _fit(Tuner(), None, "s") is None
    assert any("Trial task failed" in r.getMessage() for r in log_records) is shown
