"""Config loading, overrides and validation: every bad value names its field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lcfed.config import flatten, from_dict, load_config, to_dict
from lcfed.config.overrides import parse_override
from lcfed.config.yaml_input import MAX_ALIAS_NODES
from lcfed.errors import ConfigError
from tune_jobs.cli import main

BAD = [
    ("data.samples_per_device=[350, 50]", "data.samples_per_device", "low <= high"),
    ("data.samples_per_device=[1, 50]", "data.samples_per_device", "min_samples"),
    ("data.samples_per_device=[50]", "data.samples_per_device", "[low, high]"),
    ("data.primary=[0.6, 0.4]", "data.primary", "0 <= low <= high <= 1"),
    ("data.secondary=[0.5, 0.6]", "data.secondary", "must be <= 1"),
    ("network.bandwidth_mbps=0", "network.bandwidth_mbps", "> 0"),
    ("network.device_gflops=-1", "network.device_gflops", "> 0"),
    ("data.alpha=0", "data.alpha", "> 0"),
    ("data.alpha=-1", "data.alpha", "> 0"),
    ("data.dataset=imagenet", "data.dataset", "one of"),
    ("data.partition=random", "data.partition", "one of"),
    ("data.num_devices=0", "data.num_devices", ">= 1"),
    ("data.test_fraction=1.5", "data.test_fraction", "(0, 1)"),
    ("data.alpha=abc", "data.alpha", "type float"),
    ("train.rounds=0", "train.rounds", ">= 1"),
    ("train.lr=-0.1", "train.lr", "> 0"),
    ("train.participation=0", "train.participation", "(0, 1]"),
    ("train.participation=1.2", "train.participation", "(0, 1]"),
    ("train.local_epochs=2", "train.local_steps", "exactly one"),
    ("train.rounds=2.5", "train.rounds", "type int"),
    ("method.name=nope", "method.name", "one of"),
    ("method.mu=-1", "method.mu", ">= 0"),
    ("method.lam=-0.5", "method.lam", ">= 0"),
    ("method.num_clusters=0", "method.num_clusters", "[1,"),
    ("method.num_clusters=500", "method.num_clusters", "[1,"),
    ("method.rank=0", "method.rank", "[1,"),
    ("method.bogus=1", "method.bogus", "unknown field"),
    ("engine.kind=spark", "engine.kind", "one of"),
    ("engine.gpus_per_actor=2", "engine.gpus_per_actor", "[0, 1]"),
    ("model.name=resnet", "model.name", "one of"),
    ("tracking.enabled=maybe", "tracking.enabled", "type bool"),
    ("seed=-3", "seed", "[0, 2147483647]"),
    ("nosuch.key=1", "nosuch", "unknown section"),
    ("data.min_samples=1", "data.min_samples", ">= 2"),
    ("data.classes_per_device=0", "data.classes_per_device", ">= 1"),
    ("train.batch_size=0", "train.batch_size", ">= 1"),
    ("train.eval_every=0", "train.eval_every", ">= 1"),
    ("method.sample_size=1", "method.sample_size", "[2, devices per round"),
    ("method.sample_size=50", "method.sample_size", "[2, devices per round"),
    ("method.refit_every=-1", "method.refit_every", ">= 0"),
    ("engine.num_actors=-2", "engine.num_actors", ">= 0"),
    ("engine.cpus_per_actor=0", "engine.cpus_per_actor", "> 0"),
    ("engine.workers=-1", "engine.workers", ">= 0"),
    ("engine.vectorize=sometimes", "engine.vectorize", "'always'"),
    ("engine.vectorize=on", "engine.vectorize", "quote the word"),  # YAML reads `on` as true
    ("engine.vectorize_max=0", "engine.vectorize_max", ">= 1"),
    ("engine.device=tpu", "engine.device", "one of"),
    ("engine.max_failures=-1", "engine.max_failures", ">= 0"),
    ("engine.object_store_mb=10", "engine.object_store_mb", ">= 64"),
    ("checkpoint.every=0", "checkpoint.every", ">= 1"),
    ("tracking.experiment=", "tracking.experiment", "non-empty"),
]


@pytest.mark.parametrize("override,field,allowed", BAD)
def test_bad_values_name_the_field(override, field, allowed):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.field == field
    assert allowed in str(err.value)
    assert field in str(err.value)


def test_rank_bounded_by_sampled_models():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.num_devices=10", "method.num_clusters=2", "method.sample_size=5", "method.rank=6"])
    assert err.value.field == "method.rank"
    assert "S_d = 5" in str(err.value)


def test_defaults_are_valid_for_every_method():
    from lcfed.methods import METHODS

    for name in METHODS:
        assert load_config(None, [f"method.name={name}"]).method.name == name


def test_exponent_literals_are_floats(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\n")
    assert load_config(path).train.lr == 0.001
    assert load_config(None, ["method.mu=5e-2"]).method.params.mu == 0.05


def test_overrides_parse_yaml_values():
    assert parse_override("method.mu=0.25") == ("method.mu", 0.25)
    assert parse_override("engine.address=null") == ("engine.address", None)
    assert parse_override("tracking.run_name=abc") == ("tracking.run_name", "abc")
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_aliases_load_up_to_the_bound(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  primary: &p [0.1, 0.2]\n  secondary: *p\n")
    assert load_config(path).data.secondary == (0.1, 0.2)
    # each alias of a scalar adds one node: MAX_ALIAS_NODES of them load, one more is refused
    assert len(parse_override("x=[&a 1" + ", *a" * MAX_ALIAS_NODES + "]")[1]) == MAX_ALIAS_NODES + 1
    with pytest.raises(ConfigError, match="alias bomb") as err:
        parse_override("x=[&a 1" + ", *a" * (MAX_ALIAS_NODES + 1) + "]")
    assert err.value.field == "--set"
    with pytest.raises(ConfigError, match="alias bomb") as err:
        parse_override("mu=[&a [1, 1], &b [*a, *a]" + ", *b" * MAX_ALIAS_NODES + "]", "--method-set")
    assert err.value.field == "--method-set"


def test_roundtrip_and_flatten():
    cfg = load_config(None, ["method.mu=0.3", "data.num_devices=12", "method.num_clusters=4", "method.rank=5"])
    assert from_dict(to_dict(cfg)) == cfg
    flat = flatten(cfg)
    assert flat["method.mu"] == 0.3 and flat["method.name"] == "lcfed" and flat["data.num_devices"] == 12
    assert cfg.replace(**{"method.lam": 0.7}).method.params.lam == 0.7


def test_switching_method_drops_fields_it_does_not_take(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method:\n  name: lcfed\n  mu: 0.5\n  num_clusters: 2\n  rank: 2\n")
    cfg = load_config(path, ["method.name=fedavg"])
    assert cfg.method.name == "fedavg"
    with pytest.raises(ConfigError) as err:  # an explicit override the method does not take is an error
        load_config(path, ["method.name=fedavg", "method.mu=0.1"])
    assert err.value.field == "method.mu"


def test_cli_exits_2_with_field_name(capsys):
    assert main(["run", "--set", "method.mu=-1", "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "method.mu" in err and ">= 0" in err


def test_cli_bad_config_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  alpha: [1, 2\n")
    assert main(["run", "--config", str(bad)]) == 2
    assert "--config" in capsys.readouterr().err


@pytest.mark.parametrize(
    "sets,field",
    [
        (["data.num_devices=200", "data.min_samples=10"], "data.num_devices"),  # digits has 1,797 samples
        (["data.partition=pathological", "data.classes_per_device=11"], "data.classes_per_device"),
    ],
)
def test_limits_that_depend_on_the_dataset(sets, field, capsys):
    args = ["run", "--no-track", "--set", "method.num_clusters=2", "--set", "method.rank=2"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    assert field in capsys.readouterr().err


def test_missing_data_dir_points_to_the_importer(tmp_path, capsys):
    code = main(["run", "--no-track", "--set", "data.dataset=mnist", "--set", f"data.data_dir={tmp_path / 'none'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "lcfed data import" in err and "mnist" in err.lower()


@pytest.mark.subprocess
def test_console_script_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "tune_jobs", "run", "--set", "data.num_devices=0"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "data.num_devices" in proc.stderr
