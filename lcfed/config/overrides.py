"""``key=value`` overrides: parsed as strictly as a config file, resolved against the registry, applied to a
config's mapping before it is validated."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from lcfed import registry
from lcfed.config.yaml_input import _Refused, _StrictLoader, _yaml_problem
from lcfed.errors import ConfigError, did_you_mean, require


def parse_override(text: str, flag: str = "--set") -> tuple[str, Any]:
    """Parse ``key=value``; the value is read as YAML (``0.1`` -> float, ``null`` -> None) as strictly as
    a config file (:func:`read_yaml`), except that text which is not YAML is kept as written."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    require(bool(sep) and bool(key), flag, text, "must look like key=value, e.g. method.mu=0.1")
    try:
        value = yaml.load(raw, Loader=_StrictLoader) if raw.strip() else ""  # noqa: S506 (a SafeLoader subclass)
    except _Refused as exc:
        raise ConfigError(flag, text, f"must be valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(flag, text, "must be valid YAML: nesting too deep") from None
    except yaml.YAMLError:
        value = raw  # not YAML: the text as written
    return key, value


def resolve(kind: str, field_name: str, name: Any) -> Any:
    """What the registry finds for the ``kind`` (method, model, dataset) ``name``: a built-in, an installed
    plugin or a ``package.module:attr`` path; a :class:`ConfigError` naming ``field_name`` otherwise."""
    if not (isinstance(name, str) and name):  # the listing is built for the error only
        raise ConfigError(field_name, name, f"a {kind} name: one of {registry.known(kind)}, or a package.module:attr path")
    try:
        return getattr(registry, kind)(name)
    except registry.PluginError as exc:
        typo = "" if registry.is_path(name) else did_you_mean(name, registry.known(kind))
        raise ConfigError(field_name, name, f"{exc}{typo}") from None


def _method_or_none(name: Any) -> Any:
    try:
        return registry.method(name) if isinstance(name, str) else None
    except registry.PluginError:
        return None  # refused with the whole config's validation


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Return a deep copy of ``raw`` with dotted-key overrides set.

    Switching ``method.name`` keeps only the file's method fields the new method accepts, so one
    config file can be run with every method.
    """
    out: dict[str, Any] = _deepcopy(raw)
    items = list(overrides.items()) if isinstance(overrides, Mapping) else list(overrides)
    for key, value in items:
        spec = _method_or_none(value) if key == "method.name" else None
        if spec is not None:
            old = dict(out.get("method") or {})
            accepted = {f.name for f in dataclasses.fields(spec.params)}
            explicit = {k.split(".", 1)[1] for k, _ in items if k.startswith("method.")}
            out["method"] = {k: v for k, v in old.items() if k in accepted or k in explicit}
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return out


def _deepcopy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deepcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deepcopy(v) for v in value]
    return value
