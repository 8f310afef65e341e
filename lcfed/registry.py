"""Names -> code, in one place: methods, models and datasets, built in or brought by the user.

A name in ``method.name``, ``model.name`` or ``data.dataset`` is one of

- a built-in name (``lcfed``, ``lenet5``, ``digits``, ...);
- a name an installed package registers through a Python entry point, in the groups
  ``lcfed.methods``, ``lcfed.models`` and ``lcfed.datasets`` (``[project.entry-points."lcfed.methods"]``
  in the plugin's ``pyproject.toml``), as pytest and MLflow find their plugins;
- a ``package.module:attr`` path to code importable from the working directory (as Ray, Hydra and
  uvicorn name code); on a cluster, the job's working directory travels to every node.

What each kind must be:

- a method: a :class:`lcfed.methods.base.Strategy` subclass whose ``Params`` attribute is the
  dataclass of its hyper-parameters (or a :class:`lcfed.methods.base.MethodSpec`);
- a model: a builder ``(input_shape, num_classes) -> torch.nn.Module`` whose module names its
  decision layer in ``decision_layer`` (the embedding/decision split LCFed-style methods need);
- a dataset: a loader ``(data_dir: Path, download: bool) -> lcfed.data.Dataset``.

Anything wrong with a plugin is a :class:`PluginError` whose message is one line (the CLI prints it
as a config error naming the field, before any work starts).

The engines (``engine.kind``) are a table of names here too, :data:`ENGINES`, with each engine's opener as a
``module:attr`` path that :mod:`lcfed.engines` resolves. Built-ins are named by such paths as well
(:data:`BUILTINS`), so this module imports nothing but :mod:`lcfed.errors`: the config's checks read it
without depending on the methods, models or engines, at import or in their types.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any, cast

from lcfed.errors import did_you_mean

KINDS = {"method": "lcfed.methods", "model": "lcfed.models", "dataset": "lcfed.datasets"}


class PluginError(ValueError):
    """A name that resolves to nothing usable; the message says why in one line."""


@dataclass(frozen=True)
class Entry:
    """A name that resolves: where it comes from (``built-in``, ``entry point (dist 1.0)``, ``path``)."""

    name: str
    origin: str


#: where each kind's built-ins are, as ``module:attr`` paths to their tables (name -> method spec, builder or loader):
#: imported when a name is resolved, never at import (the config reads this module, and the built-ins load torch)
BUILTINS = {"method": "lcfed.methods:METHODS", "model": "lcfed.learning.models:MODELS",
            "dataset": "lcfed.data.sources:SOURCES"}

#: the classes a method resolves to, as ``module:attr`` paths (the Strategy base, and the registry's entry for a
#: method): resolved with the built-ins, so neither the config nor this module depends on the methods
STRATEGY = "lcfed.methods.base:Strategy"
METHOD_SPEC = "lcfed.methods.base:MethodSpec"


def resolve_path(path: str) -> Any:
    """The object a ``module:attr`` path of this project names (the tables above, :data:`ENGINES`' openers)."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _builtins(kind: str) -> dict[str, Any]:
    return dict(resolve_path(BUILTINS[kind]))


@cache
def _entry_points(kind: str) -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=KINDS[kind])}


def refresh() -> None:
    """Read the installed plugins again (after installing one into this running process)."""
    _entry_points.cache_clear()


def is_path(name: str) -> bool:
    return ":" in name


def names(kind: str) -> list[Entry]:
    """Every name of ``kind`` that needs no path: built-ins first, then installed plugins (not loaded)."""
    out = [Entry(n, "built-in") for n in _builtins(kind)]
    taken = {e.name for e in out}
    for n, ep in sorted(_entry_points(kind).items()):
        if n not in taken:
            dist = getattr(ep, "dist", None)
            out.append(Entry(n, f"entry point {ep.value} ({dist.name} {dist.version})" if dist else f"entry point {ep.value}"))
    return out


def known(kind: str) -> list[str]:
    return [e.name for e in names(kind)]


def _import_path(name: str) -> Any:
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or not all(p.isidentifier() for p in [*module_name.split("."), *attr.split(".")]):
        raise PluginError(f"{name!r} is not a plugin path: write package.module:attr")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # code in the working directory, as `python -m` would see it
    try:
        obj: Any = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the plugin's own import error, in its words; SystemExit too (exit 0 would hide it)
        raise PluginError(f"cannot import {module_name!r}: {type(exc).__name__}: {one_line(exc)}"
                          f"{_where_looked(module_name, exc)}") from None
    found = module_name + ":"
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = [n for n in dir(obj) if not n.startswith("_")]
            raise PluginError(f"module {module_name!r} has no attribute {attr!r}{did_you_mean(part, public, found)}")
        obj = getattr(obj, part)
        found += part + "."
    return obj


def _where_looked(module_name: str, exc: BaseException) -> str:
    """Where Python looked for a plugin module it did not find (not for a module the plugin itself imports)."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or not (module_name == missing or module_name.startswith(missing + ".")):
        return ""
    path = os.environ.get("PYTHONPATH") or "unset"
    return (f" (looked in the working directory {os.getcwd()}, on PYTHONPATH ({path}) and among the installed "
            f"packages: run lcfed in the directory that holds {missing.replace('.', '/')}.py or its package, or add "
            "that directory to PYTHONPATH)")


def _load(kind: str, name: str) -> tuple[Any, str]:
    if not isinstance(name, str) or not name:
        raise PluginError(f"{kind} name must be a non-empty string")
    builtin = _builtins(kind)
    if name in builtin:
        return builtin[name], "built-in"
    if is_path(name):
        return _import_path(name), "path"
    ep = _entry_points(kind).get(name)
    if ep is None:
        raise PluginError(f"unknown {kind} {name!r}: one of {known(kind)}, or a package.module:attr path")
    try:
        return ep.load(), f"entry point {ep.value}"
    except Exception as exc:
        raise PluginError(f"entry point {name!r} ({ep.value}) failed to load: {type(exc).__name__}: "
                          f"{one_line(exc)}") from None


def method(name: str) -> Any:
    """The :class:`~lcfed.methods.base.MethodSpec` that ``name`` names."""
    MethodSpec, Strategy = resolve_path(METHOD_SPEC), resolve_path(STRATEGY)  # noqa: N806 (classes)
    obj, origin = _load("method", name)
    if isinstance(obj, MethodSpec):
        spec = obj
    elif isinstance(obj, type) and issubclass(obj, Strategy):
        params = getattr(obj, "Params", None)
        if params is None:  # a subclass of a built-in that adds no hyper-parameters takes the built-in's
            inherited = {s.strategy: s.params for s in _builtins("method").values()}
            params = next((inherited[base] for base in obj.__mro__ if base in inherited), None)
        if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
            raise PluginError(f"method {name!r}: {obj.__name__}.Params must be the dataclass of its "
                              "hyper-parameters (an empty @dataclass if it has none)")
        spec = MethodSpec(obj, params)
    else:
        raise PluginError(f"method {name!r} ({origin}) is {_what(obj)}, not a Strategy subclass "
                          "(lcfed.methods.base.Strategy) or a MethodSpec")
    if not (isinstance(spec.params, type) and dataclasses.is_dataclass(spec.params)):
        raise PluginError(f"method {name!r}: its parameters ({_what(spec.params)}) are not a dataclass")
    _check_params(name, spec.params)
    _check_hooks(name, spec.strategy, Strategy)
    return spec


#: the Strategy hooks the base class leaves unimplemented: every method overrides them
REQUIRED_HOOKS = ("init", "configure", "local", "aggregate", "personalized")


def _check_params(name: str, params: type) -> None:
    """Every field of a method's ``Params`` has a default (the config sets only what it changes), and no
    class attribute of it lacks an annotation (a dataclass would silently leave it out of the fields)."""
    fields = dataclasses.fields(params)
    for f in fields:
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PluginError(f"method {name!r}: {params.__qualname__}.{f.name} has no default: every field of a "
                              f"method's Params needs one (e.g. {f.name}: float = 0.1)")
    names = {f.name for f in fields}
    for cls in params.__mro__[:-1]:
        annotated = cls.__dict__.get("__annotations__", {})
        for key, value in cls.__dict__.items():
            # methods, properties and other descriptors are the class's own, not values
            if key.startswith("_") or key in names or key in annotated or callable(value) or \
                    hasattr(type(value), "__get__"):
                continue
            shown = one_line(repr(value))
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise PluginError(f"method {name!r}: {params.__qualname__}.{key} = {shown} has no type annotation, so "
                              f"it is not a field: annotate it (e.g. {key}: {type(value).__name__} = {shown})")


def _check_hooks(name: str, strategy: type, base: type) -> None:
    """The strategy overrides every hook :class:`~lcfed.methods.base.Strategy` leaves raising
    NotImplementedError (and ``aggregate_async`` if it says it ``supports_async``)."""
    required = REQUIRED_HOOKS + (("aggregate_async",) if getattr(strategy, "supports_async", False) else ())
    missing = [h for h in required if getattr(strategy, h, None) is getattr(base, h)]
    if missing:
        hooks = ", ".join(missing)
        raise PluginError(f"method {name!r}: {strategy.__name__} does not implement the Strategy hook"
                          f"{'s' if len(missing) > 1 else ''} {hooks} (every method overrides "
                          f"{', '.join(REQUIRED_HOOKS)}: lcfed.methods.base.Strategy)")


def model(name: str) -> Callable[[tuple[int, ...], int], Any]:
    """The model builder that ``name`` names (checked when it builds: :func:`lcfed.learning.models.build_network`)."""
    obj, origin = _load("model", name)
    if not callable(obj):
        raise PluginError(f"model {name!r} ({origin}) is {_what(obj)}, not a builder (input_shape, num_classes) -> nn.Module")
    return cast(Callable[[tuple[int, ...], int], Any], obj)


def dataset(name: str) -> Callable[..., Any]:
    """The dataset loader that ``name`` names."""
    obj, origin = _load("dataset", name)
    if not callable(obj):
        raise PluginError(f"dataset {name!r} ({origin}) is {_what(obj)}, not a loader (data_dir, download) -> Dataset")
    return cast(Callable[..., Any], obj)


def one_line(text: object) -> str:
    """A plugin's error message (possibly several lines) as one line."""
    return " ".join(str(text).split())


def _what(obj: Any) -> str:
    return f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"


@dataclass(frozen=True)
class EngineEntry:
    """An engine: its ``engine.kind`` name, one line on what it is, and its opener as ``module:attr``: a
    callable ``(cfg, dataset=None, resources=None) -> Engine`` (``dataset``: the loaded data, else it
    loads it; ``resources``: the (CPUs, GPUs) it may use inside an enclosing reservation, a Tune
    trial's, else it takes what the config says)."""

    name: str
    summary: str
    opener: str


#: the engines, by ``engine.kind`` name: the config's check, ``lcfed run --engine``, :func:`lcfed.api.run`, sweep
#: trials and ``lcfed check`` all read it, so an engine is one module and one line here (its opener is imported
#: only when used: :func:`lcfed.engines.open_engine`, so nothing here imports Ray)
ENGINES: dict[str, EngineEntry] = {e.name: e for e in (
    EngineEntry("local", "every device and the server in this process, on worker threads (the reference)",
                "lcfed.engines.local:open_local"),
    EngineEntry("ray", "device actors and a server actor on Ray: a private local Ray, or the cluster "
                "engine.address names", "actors.ray_engine:open_ray"),
)}
