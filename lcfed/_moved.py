"""Old module paths, from before lcfed's modules were grouped into packages, and where their names live now.

:data:`MOVED` is the one table: an old module -> the modules its names went to (the first one takes the
old module's place, the others took the names split off it). ``import lcfed.loop``, ``from lcfed.loop
import run_rounds`` and ``from lcfed import loop`` keep working through :class:`MovedFinder`, with a
:class:`DeprecationWarning` naming the new path; the module they get is a stand-in whose names are the
new modules' objects (the same functions and classes, not copies). Checkpoints and pickles written
before the move name classes by their old modules: :func:`current_module` maps those, silently.

Names split off a module that stayed (``lcfed.devices.fleet``'s generators, ...) are :data:`SPLIT_OFF`'s: the
module's ``__getattr__`` finds them in their new module, with the same warning (:func:`split_off`).

A leaf: it imports no other module of lcfed, and the new modules only when an old path is used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings
from typing import Any

#: old module -> the modules its names moved to (the first takes the old module's place)
MOVED: dict[str, tuple[str, ...]] = {
    "lcfed.checkpoint": ("lcfed.run.checkpoint", "lcfed.run.checkpoint_codec"),
    "lcfed.clustering": ("lcfed.learning.clustering",),
    "lcfed.config_rules": ("lcfed.config.data", "lcfed.config.train", "lcfed.config.engine", "lcfed.config.tracking",
                           "lcfed.config.devices"),
    "lcfed.config_types": ("lcfed.config.types",),
    "lcfed.contracts": ("lcfed.run.contracts",),
    "lcfed.device_states": ("lcfed.engines.device_states",),
    "lcfed.experiment": ("lcfed.run.setup", "lcfed.run.sources", "lcfed.run.shards"),
    "lcfed.faults": ("lcfed.run.faults",),
    "lcfed.fingerprint": ("lcfed.numerics.fingerprint",),
    "lcfed.local_update": ("lcfed.learning.local_update",),
    "lcfed.loop": ("lcfed.run.loop", "lcfed.run.rounds", "lcfed.run.contracts", "lcfed.run.result"),
    "lcfed.metric_catalog": ("lcfed.run.metric_catalog",),
    "lcfed.metrics": ("lcfed.learning.metrics",),
    "lcfed.models": ("lcfed.learning.models",),
    "lcfed.output_paths": ("lcfed.run.output_paths",),
    "lcfed.overrides": ("lcfed.config.overrides",),
    "lcfed.progress": ("lcfed.run.progress",),
    "lcfed.provenance": ("lcfed.numerics.provenance",),
    "lcfed.recovery": ("lcfed.learning.recovery",),
    "lcfed.run_result": ("lcfed.run.result",),
    "lcfed.similarity": ("lcfed.learning.similarity",),
    "lcfed.stats": ("lcfed.learning.stats",),
    "lcfed.stop": ("lcfed.run.stop",),
    "lcfed.vectorized": ("lcfed.learning.vectorized",),
    "lcfed.yaml_input": ("lcfed.config.yaml_input",),
}


#: a module still in place -> the modules that took some of its names when it was split (it looks them up there on
#: a read it cannot answer: its ``__getattr__`` calls :func:`split_off`)
SPLIT_OFF: dict[str, tuple[str, ...]] = {
    "lcfed.devices.fleet": ("lcfed.devices.generators",),
    "lcfed.devices.traces": ("lcfed.devices.trace_files",),
    "lcfed.engines.local": ("lcfed.engines.hosted",),
}


def _home(targets: tuple[str, ...], name: str) -> Any:
    """The new module among ``targets`` that has ``name`` (imported), else None."""
    for target in targets:
        module = importlib.import_module(target)
        if name in vars(module):
            return module
    return None


def current_module(module: str, name: str) -> str:
    """Where the class or function ``name`` of ``module`` lives now: ``module`` itself unless it is an old path of
    :data:`MOVED`, then the new module that has ``name`` (the first target if none has it). No warning: a
    checkpoint's or a pickle's old name is not the caller's code."""
    top = name.partition(".")[0]
    if module in SPLIT_OFF and top not in vars(importlib.import_module(module)):
        home = _home(SPLIT_OFF[module], top)
        return home.__name__ if home is not None else module
    targets = MOVED.get(module)
    if targets is None:
        return module
    home = _home(targets, top)
    return home.__name__ if home is not None else targets[0]


class MovedModule(types.ModuleType):
    """What an old path imports: its names resolve to the new modules' objects, looked up when read."""

    def __init__(self, name: str, targets: tuple[str, ...]) -> None:
        super().__init__(name, f"moved to {', '.join(targets)}")
        self.__moved_to__ = targets

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        home = _home(self.__moved_to__, name)
        if home is None:
            raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self.__moved_to__)}) has no "
                                 f"attribute {name!r}")
        return getattr(home, name)

    def __dir__(self) -> list[str]:
        return sorted({n for t in self.__moved_to__ for n in dir(importlib.import_module(t))})


_PACKAGE_FILE = os.path.join(os.path.dirname(__file__), "__init__.py")


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the code whose import statement named the old path, past this
    module's frames, the import machinery's and ``__getattr__``'s (``warnings.warn`` itself does not count the
    import machinery's frozen frames, so neither does this)."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_name == "__getattr__"
                                 or frame.f_code.co_filename in (__file__, _PACKAGE_FILE, importlib.__file__)):
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1
        frame = frame.f_back
    return level


def warn(old: str, new: str | None = None) -> None:
    """The deprecation line for importing the old path ``old`` (a module, or a name of a module split since)."""
    if new is None:
        first, *others = MOVED[old]
        new = first + (f" (some of its names to {', '.join(others)})" if others else "")
    warnings.warn(f"{old} moved to {new}: import from there (the old path goes in a later release)",
                  DeprecationWarning, stacklevel=_caller_level())


def split_off(module: str, name: str) -> Any:
    """A name read off ``module`` that a split moved to one of :data:`SPLIT_OFF`'s modules: that module's object,
    with the deprecation line (``module.__getattr__`` calls this); AttributeError for any other name."""
    home = None if name.startswith("__") else _home(SPLIT_OFF.get(module, ()), name)
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn(f"{module}.{name}", f"{home.__name__}.{name}")
    return getattr(home, name)


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED` (and nothing else) and loads each as a :class:`MovedModule`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warn(spec.name)
        return MovedModule(spec.name, MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the names are looked up in the new modules when read."""


def install() -> None:
    """Put :class:`MovedFinder` on ``sys.meta_path`` once (ahead of the path finder: no old path has a file)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


def package_attr(name: str) -> types.ModuleType:
    """``lcfed.<name>`` for an old module name read off the package (``from lcfed import loop``)."""
    full = f"lcfed.{name}"
    if full not in MOVED:
        raise AttributeError(f"module 'lcfed' has no attribute {name!r}")
    return importlib.import_module(full)
