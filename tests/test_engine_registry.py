"""The engine registry (lcfed/engines/__init__.py): one table every dispatch reads, so an engine is one
module and one line. Ray = local number for number is tests/test_engines.py's."""

from __future__ import annotations

from typing import Any

import pytest

from lcfed import api, engines
from lcfed.engines.local import LocalEngine, open_local
from lcfed.errors import ConfigError
from tests.conftest import same_history, tiny_config
from tune_jobs.cli import build_parser
from tune_jobs.sweep.options import resolve_trial_engine, trial_engines

OPENED: list[Any] = []


def open_recording(cfg: Any, dataset: Any = None, resources: tuple[float, float] | None = None) -> LocalEngine:
    """A test engine: the in-process one, noting each federation it deploys."""
    engine = open_local(cfg, dataset, resources)
    OPENED.append((cfg.engine.kind, resources))
    return engine


def test_every_dispatch_reads_the_registry():
    assert engines.names() == ["local", "ray"]
    with pytest.raises(ConfigError, match=r"engine\.kind.*one of \['local', 'ray'\]"):
        tiny_config("engine.kind=batched")
    with pytest.raises(ConfigError, match=r"engine.*one of \['local', 'ray'\]"):
        api.run(tiny_config(), engine="batched")
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    assert next(a for a in run._actions if "--engine" in a.option_strings).choices == ["local", "ray"]
    assert trial_engines() == ["auto", "local", "ray"]


def test_an_engine_is_one_registry_line(monkeypatch):
    """A new entry is accepted by the config, run by api.run and chosen by --trial-engine, with nothing else
    edited; deployed here, it gives the in-process numbers."""
    monkeypatch.setitem(engines.ENGINES, "recording", engines.EngineEntry(
        "recording", "the in-process engine, noted", "tests.test_engine_registry:open_recording"))
    OPENED.clear()
    cfg = tiny_config("engine.kind=recording", "train.rounds=1", "train.local_steps=1")  # dispatch, not training
    result = api.run(cfg)
    assert OPENED == [("recording", None)]
    same_history(result.history, api.run(cfg, engine="local").history)
    assert resolve_trial_engine("recording", 0.0, 1) == "recording"
    engine = engines.open_engine(cfg, resources=(1.0, 0.0))
    try:
        assert engine.placement()["cpus"] == 1 and OPENED[-1] == ("recording", (1.0, 0.0))
    finally:
        engine.close()
