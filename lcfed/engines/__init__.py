"""Engines: what hosts a run's devices and server, by name (``engine.kind``).

:mod:`lcfed.engines.local` runs them in this process (the reference every engine must match number for
number); the Ray engine is :mod:`actors.ray_engine`. Both drive the one round loop,
:func:`lcfed.run.loop.run_rounds`, and both deploy an :class:`~lcfed.run.contracts.Engine` (run, placement,
close). :data:`ENGINES` is the one table of them: the config's check, ``lcfed run --engine``,
:func:`lcfed.api.run`, sweep trials and ``lcfed check`` all read it, so an engine is one module and
one line here. An entry names its opener as ``module:attr`` and is imported only when used, so this
package never imports Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the registry is read by the config's check, below everything
    from lcfed.config import ExperimentConfig
    from lcfed.run.checkpoint import Snapshot
    from lcfed.run.contracts import Engine, Observer
    from lcfed.run.result import RunResult


@dataclass(frozen=True)
class EngineEntry:
    """An engine: its ``engine.kind`` name, one line on what it is, and its opener as ``module:attr``: a
    callable ``(cfg, dataset=None, resources=None) -> Engine`` (``dataset``: the loaded data, else it
    loads it; ``resources``: the (CPUs, GPUs) it may use inside an enclosing reservation, a Tune
    trial's, else it takes what the config says)."""

    name: str
    summary: str
    opener: str


ENGINES: dict[str, EngineEntry] = {e.name: e for e in (
    EngineEntry("local", "every device and the server in this process, on worker threads (the reference)",
                "lcfed.engines.local:open_local"),
    EngineEntry("ray", "device actors and a server actor on Ray: a private local Ray, or the cluster "
                "engine.address names", "actors.ray_engine:open_ray"),
)}


def names() -> list[str]:
    """The engine names, as ``engine.kind`` and ``--engine`` accept them."""
    return list(ENGINES)


def open_engine(cfg: ExperimentConfig, dataset: Any = None, resources: tuple[float, float] | None = None) -> Engine:
    """Deploy ``cfg``'s federation on the engine ``cfg.engine.kind`` names; the caller closes it."""
    entry = ENGINES[cfg.engine.kind]
    module, attr = entry.opener.split(":")
    opener = getattr(import_module(module), attr)
    return opener(cfg, dataset, resources)  # type: ignore[no-any-return]


def run(cfg: ExperimentConfig, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
    """Run ``cfg``'s federation on its engine from start (or from ``resume``) to its last round."""
    return run_closed(open_engine(cfg), observers, resume)


def run_closed(engine: Engine, observers: Sequence[Observer] = (), resume: Snapshot | None = None) -> RunResult:
    """``engine.run``, then ``engine.close()`` whatever happened."""
    try:
        return engine.run(observers, resume)
    finally:
        engine.close()
