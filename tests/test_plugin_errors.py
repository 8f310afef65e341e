"""A plugin author's mistakes are one line when the method is resolved (the CLI's rows: tests/test_bad_inputs.py),
with no false alarm for a sound method. (An untracked ``lcfed sweep`` and ``lcfed compare``: tests/test_sweep.py
and tests/test_compare.py, on their modules' Ray.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lcfed import registry
from lcfed.methods.base import Strategy
from tests.conftest import tiny_config


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


def test_no_track_is_tracking_enabled_false():
    """A sweep or comparison with ``--no-track`` is the one whose config says ``tracking.enabled: false`` (so the
    untracked sweep of tests/test_sweep.py, run with the flag, stands for both)."""
    from tune_jobs.sweep.options import tracking_of

    tracked, untracked = tiny_config("tracking.enabled=true"), tiny_config()
    assert tracking_of(tracked, True) == untracked.replace(**{"tracking.uri": tracked.tracking.uri})
    assert tracking_of(tracked, False) is tracked and tracking_of(untracked, True) is untracked
