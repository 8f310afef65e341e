"""A plugin author's mistakes are one line when the method is resolved (the CLI's rows: tests/test_bad_inputs.py),
with no false alarm for a sound method; and tracking off everywhere it can be: an untracked ``lcfed sweep`` or
``lcfed compare`` (``--no-track`` or ``tracking.enabled=false``) runs, reports the best trial and leaves no MLflow
file behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from lcfed import registry
from lcfed.config import to_dict
from lcfed.methods.base import Strategy
from tests.conftest import start_test_ray, tiny_config
from tune_jobs.cli import main

#: what MLflow creates in the working directory (the default store, a file store, a server's artifacts)
MLFLOW_FILES = ("mlflow.db", "mlruns", "mlartifacts")


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """An empty working directory whose ``*.py`` files import as plugin paths (and are forgotten after)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def _write(where: Path, name: str, body: str) -> None:
    head = ("import functools\nfrom dataclasses import dataclass, field\nfrom typing import ClassVar\n\n"
            "from lcfed.methods.base import Strategy\n")
    (where / f"{name}.py").write_text(head + "from lcfed.methods.fedavg import FedAvg\n\n\n" + body)


def test_every_built_in_method_passes_the_plugin_checks():
    for entry in registry.names("method"):
        if entry.origin == "built-in":
            spec = registry.method(entry.name)  # the checks run on every lookup: no PluginError
            assert all(getattr(spec.strategy, h) is not getattr(Strategy, h) for h in registry.REQUIRED_HOOKS)


def test_a_sound_params_with_constants_methods_and_factories_is_accepted(plugin_dir):
    """Annotated ``ClassVar`` constants, methods, properties and ``default_factory`` fields are not mistakes."""
    _write(plugin_dir, "plugsound", "class Mine(FedAvg):\n    @dataclass(frozen=True)\n    class Params:\n"
           "        LIMIT: ClassVar[int] = 3\n        mu: float = 0.1\n        ks: tuple = field(default_factory=tuple)\n\n"
           "        def validate(self, cfg, prefix='method'):\n            pass\n\n"
           "        @property\n        def twice(self):\n            return 2 * self.mu\n\n"
           "        @functools.cached_property\n        def half(self):\n            return self.mu / 2\n")
    spec = registry.method("plugsound:Mine")
    assert spec.params().mu == 0.1 and spec.params().half == 0.05


def test_async_without_aggregate_async_is_a_missing_hook(plugin_dir):
    _write(plugin_dir, "plugasync", "class Mine(Strategy):\n    supports_async = True\n\n    @dataclass(frozen=True)\n"
           "    class Params:\n        pass\n\n"
           + "".join(f"    def {h}(self, *a):\n        return None\n\n" for h in registry.REQUIRED_HOOKS))
    with pytest.raises(registry.PluginError, match="does not implement the Strategy hook aggregate_async"):
        registry.method("plugasync:Mine")


def test_a_plugins_own_missing_dependency_gets_no_path_hint(plugin_dir):
    """The hint about the working directory and PYTHONPATH is for the plugin's module only: a module the plugin
    imports that is not installed is the plugin's error, in its own words."""
    (plugin_dir / "plugdep.py").write_text("import no_such_dep_xyz\n")
    with pytest.raises(registry.PluginError) as err:
        registry.method("plugdep:Mine")
    assert "No module named 'no_such_dep_xyz'" in str(err.value) and "PYTHONPATH" not in str(err.value)
    with pytest.raises(registry.PluginError, match=r"on PYTHONPATH \(") as err:
        registry.method("plugnothere:Mine")
    assert str(plugin_dir) in str(err.value)


def test_a_typo_in_a_nested_attribute_is_suggested_with_its_path(plugin_dir):
    _write(plugin_dir, "plugnest", "class Box:\n    class FedProx(FedAvg):\n        pass\n")
    with pytest.raises(registry.PluginError, match=r"did you mean plugnest:Box\.FedProx\?"):
        registry.method("plugnest:Box.FedProxx")


# -- untracked sweeps and comparisons ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_ray():
    """One small Ray for the module's commands (each attaches to it, as a command in a Ray job does)."""
    import ray

    start_test_ray()
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory, with no tracking store named by the environment; the base config there
    asks for tracking (so it is the flag or the --set that turns it off)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    base = tiny_config("engine.num_cpus=2", "tracking.enabled=true")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(to_dict(base)))
    (tmp_path / "space.yaml").write_text("method.mu: {grid: [0.05, 0.5]}\n")
    return tmp_path


def _mlflow_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name in MLFLOW_FILES)


def test_no_track_is_tracking_enabled_false():
    """A sweep or comparison with ``--no-track`` is the one whose config says ``tracking.enabled: false`` (so the
    untracked sweep below, run with the flag, stands for both)."""
    from tune_jobs.sweep.options import tracking_of

    tracked, untracked = tiny_config("tracking.enabled=true"), tiny_config()
    assert tracking_of(tracked, True) == untracked.replace(**{"tracking.uri": tracked.tracking.uri})
    assert tracking_of(tracked, False) is tracked and tracking_of(untracked, True) is untracked


def test_an_untracked_sweep_reports_its_best_trial_and_creates_no_mlflow_file(shared_ray, workdir, capsys):
    code = main(["sweep", "-c", "base.yaml", "--space", "space.yaml", "--set", "train.rounds=2", "--scheduler", "fifo",
                 "--max-concurrent", "1", "--storage", "tune", "--name", "untracked", "--json", "summary.json",
                 "--no-track"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["trials"] == 2 and summary["errors"] == 0
    assert summary["best_config"]["method.mu"] in (0.05, 0.5) and summary["best_acc_mean"] > 0
    assert (summary["parent_run_id"], summary["tracking_uri"], summary["view"], summary["registered"]) == (
        None, None, None, None)
    assert "sweep: 2/2 trials ended; best acc_mean" in out and "MLflow" not in out
    assert f"not tracked: the trials are in Tune's storage, {workdir / 'tune' / 'untracked'}" in out
    assert _mlflow_files(workdir) == []
    assert (workdir / "tune" / "untracked").is_dir()
    assert not list((workdir / "tune").rglob("final_models.pt"))  # no run to log them on: none kept


def test_an_untracked_compare_writes_its_report_and_creates_no_mlflow_file(shared_ray, workdir, capsys):
    args = ["compare", "-c", "base.yaml", "--methods", "fedavg,standalone", "--budget", "1", "--seeds", "1",
            "--scheduler", "fifo", "--max-concurrent", "1", "--set", "train.rounds=2", "--out", "cmp", "-q",
            "--no-track"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "standalone" in out and "MLflow" not in out
    for name in ("compare.md", "compare.csv", "phase1/fedavg.json", "phase2/standalone.json"):
        assert (workdir / "cmp" / name).is_file(), name
    state = json.loads((workdir / "cmp" / "state.json").read_text())
    assert state["parent_run_id"] is None and state["params"]["tracking"] == "off"
    assert _mlflow_files(workdir) == []
    # a tracked rerun into the untracked comparison's --out is refused (it has no parent run to continue)
    assert main(args[:-1]) == 2
    assert "holds a comparison with other settings" in capsys.readouterr().err
    assert _mlflow_files(workdir) == []
