"""Config values against their fields' annotations: is a value of the field's type (a list or mapping where
a scalar is expected included), its name for an error, and a section dataclass built from a mapping."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from lcfed.errors import ConfigError, did_you_mean, require


def _type_ok(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Check ``value`` against a simple annotation, coercing int -> float; return (ok, value)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            ok, coerced = _type_ok(value, arg)
            if ok:
                return True, coerced
        return False, value
    if annotation is type(None):
        return value is None, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return True, float(value)
            except OverflowError:  # an int of hundreds of digits: no float holds it (refused as not finite)
                return True, math.inf
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if annotation is str:
        return isinstance(value, str), value
    if origin is tuple:
        # elements are checked but kept as given ([0, 1] stays ints in a list of floats): digests of
        # existing configs do not change
        element = typing.get_args(annotation)[0]
        if isinstance(value, (list, tuple)) and all(_type_ok(v, element)[0] for v in value):
            return True, tuple(value)
        return False, value
    return True, value


def _finite(value: Any) -> bool:
    """False for a float (or a float inside a list) that is inf or nan: no field means either."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def accepts(annotation: Any, value: Any) -> bool:
    """Whether a field annotated ``annotation`` takes ``value`` (its type; bounds are the field's validate)."""
    return _type_ok(value, annotation)[0]


def type_name(annotation: Any) -> str:
    """``int or null``, ``list of float``: an annotation as the messages name it."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is tuple:
        return f"list of {type_name(typing.get_args(annotation)[0])}"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def typed_value(field_name: str, value: Any, annotation: Any) -> Any:
    """``value`` as a field annotated ``annotation`` holds it (an int for a float field becomes a float),
    or :class:`ConfigError`: every value is checked here before any use, so a list or a mapping where a
    scalar belongs is refused instead of reaching code that hashes or compares it."""
    ok, coerced = _type_ok(value, annotation)
    hint = " (YAML reads on/off/yes/no as booleans: quote the word)" if isinstance(value, bool) and annotation is str else ""
    require(ok, field_name, value, f"must be of type {type_name(annotation)}{hint}")
    require(_finite(coerced), field_name, value, "must be a finite number (not inf or nan)")
    return coerced


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved field types (``typing.get_type_hints`` compiles each string annotation anew: ~0.5 ms a
    class, and a config builds a dozen on every load and ``replace``)."""
    return typing.get_type_hints(cls)


def build_dataclass(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    """Construct ``cls`` from a mapping, rejecting unknown keys and wrongly typed values."""
    if values is None:
        values = {}
    require(isinstance(values, Mapping), prefix, values, "must be a mapping of fields")
    hints = type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:  # the suggestion (difflib, slow) only for a key refused
            allowed = f"allowed: {', '.join(names)}" if names else "there are none to set here"
            raise ConfigError(f"{prefix}.{key}", value, f"unknown field; {allowed}{did_you_mean(key, names, f'{prefix}.')}")
        kwargs[key] = typed_value(f"{prefix}.{key}", value, hints[key])
    return cls(**kwargs)
