"""Engines: what hosts a run's devices and server, by name (``engine.kind``).

:mod:`lcfed.engines.local` runs them in this process (the reference every engine must match number for
number); the Ray engine is :mod:`actors.ray_engine`. Both drive the one round loop,
:func:`lcfed.run.loop.run_rounds`, and both deploy an :class:`~lcfed.run.contracts.Engine` (run, placement,
close). :data:`~lcfed.registry.ENGINES` is the one table of them, kept with the other names in
:mod:`lcfed.registry` (the config's check reads it there) and re-exported here: an entry names its opener as
``module:attr``, which :func:`open_engine` imports only when used, so this package never imports Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lcfed.registry import ENGINES, EngineEntry, resolve_path

__all__ = ["ENGINES", "EngineEntry", "names", "open_engine", "run", "run_closed"]

if TYPE_CHECKING:  # annotations only
    from lcfed.config import ExperimentConfig
    from lcfed.run.checkpoint import Snapshot
    from lcfed.run.contracts import Engine, Observer
    from lcfed.run.result import RunResult


def names() -> list[str]:
    """The engine names, as ``engine.kind`` and ``--engine`` accept them."""
    return list(ENGINES)


def open_engine(cfg: ExperimentConfig, dataset: Any = None, resources: tuple[float, float] | None = None) -> Engine:
    """Deploy ``cfg``'s federation on the engine ``cfg.engine.kind`` names; the caller closes it."""
    opener = resolve_path(ENGINES[cfg.engine.kind].opener)
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
