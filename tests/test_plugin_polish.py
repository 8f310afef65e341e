"""Issue 37, item 6: ``lcfed check --set``, a method's description from its own class docstring, the
``round`` convention of Tune results and the validation metrics a trainable reports."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from lcfed import api, conformance, registry
from tune_jobs.catalog import _first_line
from tune_jobs.cli import main


def test_check_takes_set_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance.small_config("fedavg", **{"train.lr": 0.01}).train.lr == 0.01
    assert main(["check", "fedavg", "--set", "train.lr=0.01", "--set", "train.local_steps=1"]) == 0
    out = capsys.readouterr().out
    assert "seeded     ok" in out and "resumable  ok" in out


@pytest.mark.parametrize("bad", ["method.nope=1", "nope", "train.lr=-1"])
def test_check_refuses_a_bad_set_in_one_line(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "fedavg", "--set", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lcfed: config error:") and "\n" not in err


def test_check_set_cannot_bring_rounds_below_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "fedavg", "--set", "train.rounds=1"]) == 2
    assert "train.rounds" in capsys.readouterr().err


PLUGIN = '''
"""Polish plugins: a module docstring whose first paragraph is long enough that a cut at a width would
land mid-word, so the listing must keep it whole.

Second paragraph, never shown.
"""

from lcfed.methods.fedavg import FedAvg


class Documented(FedAvg):
    """Documented: its own one-line description.

    More detail that the listing leaves out.
    """

    name = "documented"


class Inheriting(FedAvg):
    name = "inheriting"


class Empty(Documented):
    __doc__ = None
    name = "empty"
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "polish_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    yield "polish_plugin"
    sys.modules.pop("polish_plugin", None)


def test_a_method_is_described_by_its_own_class_docstring(plugin: str) -> None:
    assert _first_line(registry.method(f"{plugin}:Documented").strategy) == "Documented: its own one-line description."
    module_line = ("Polish plugins: a module docstring whose first paragraph is long enough that a cut at a width "
                   "would land mid-word, so the listing must keep it whole.")
    # not FedAvg's or Strategy's docstring: the class's module's, whole
    assert _first_line(registry.method(f"{plugin}:Inheriting").strategy) == module_line
    assert _first_line(registry.method(f"{plugin}:Empty").strategy) == module_line


def test_methods_still_lists_every_built_in(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    described = {line.split()[0]: line for line in lines if line and not line.startswith(" ")}
    for entry in registry.names("method"):
        assert entry.name in described
        assert len(described[entry.name].split(None, 1)) == 2  # a description follows the name
    assert described["fedavg"].endswith("the sample-weighted mean of the participants' local models.")


def _reports(overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``api.trainable``'s reporter hands Tune each round, without Ray."""
    from lcfed.engines.local import LocalEngine
    from lcfed.run.sources import load

    cfg = api.config(None, {"method.name": "fedavg", "data.dataset": "digits", "data.num_devices": 4,
                            "train.local_steps": 1, "tracking.enabled": False, "engine.kind": "local",
                            "engine.torch_threads": 1, **overrides})
    got: list[dict[str, Any]] = []
    with mock.patch("ray.tune.report", side_effect=lambda metrics, **_: got.append(metrics)):
        engine = LocalEngine(cfg, load(cfg), 1)
        try:
            engine.run([api._Report()])
        finally:
            engine.close()
    return got


def test_trainable_reports_validation_metrics_carried_forward() -> None:
    got = _reports({"data.val_fraction": 0.2, "train.rounds": 5, "train.eval_every": 2})
    assert [r["round"] for r in got] == [0, 1, 2, 3, 4]  # from 0, as the history and MLflow's steps
    first = next(i for i, r in enumerate(got) if math.isfinite(r["acc_mean"]))
    assert first < len(got) - 1
    for r in got[first:]:
        for key in ("val_acc_mean", "val_acc_weighted", "val_loss", "acc_mean"):
            assert math.isfinite(r[key]), (r["round"], key)
    for r in got[:first]:
        assert math.isnan(r["val_acc_mean"])
