"""The search space: a YAML file mapping config fields to Tune domains (or fixed values), checked against
the base config before anything starts, and written back in the file's form for the parent run.

A file reads ``{dotted.field: {loguniform: [lo, hi]} | {choice: [...]} | value}``; a bare name is looked
up among the bundled spaces (``tune_jobs/spaces/``).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Quantized

from lcfed.config import ExperimentConfig, field_types, flatten, from_dict, to_dict
from lcfed.config.overrides import apply_overrides
from lcfed.config.types import accepts, type_name
from lcfed.config.yaml_input import read_yaml
from lcfed.errors import ConfigError, require

SPACES_DIR = Path(__file__).resolve().parent.parent / "spaces"

#: search-space file keywords -> how to build the Tune domain from the listed arguments
DOMAINS = {
    "loguniform": lambda a: tune.loguniform(*a),
    "uniform": lambda a: tune.uniform(*a),
    "choice": lambda a: tune.choice(list(a)),
    "grid": lambda a: tune.grid_search(list(a)),
    "randint": lambda a: tune.randint(*a),
    "quniform": lambda a: tune.quniform(*a),
    "qrandint": lambda a: tune.qrandint(*a),
}
#: the domains whose draws are floats (Tune's Float domains) and those whose draws are integers
FLOAT_DOMAINS = ("uniform", "loguniform", "quniform")
INTEGER_DOMAINS = ("randint", "qrandint")


def load_space(path: str | Path, base: ExperimentConfig) -> dict[str, Any]:
    """Read a search space: ``{dotted.field: {loguniform: [lo, hi]} | {choice: [...]} | value}``.

    Each key must be a config field; each sampled value is validated with the base config before
    the sweep starts (the type of a range's draws, bounds of ranges, every element of choices).
    """
    p = Path(path)
    if not p.exists() and (SPACES_DIR / p).exists():
        p = SPACES_DIR / p
    require(p.is_file(), "--space", str(path), f"must be a YAML file (bundled spaces: {sorted(x.name for x in SPACES_DIR.glob('*.yaml'))})")
    raw = read_yaml(p, "--space", "search-space YAML file")
    require(isinstance(raw, Mapping), "--space", str(path), "must map config fields to domains")
    require(len(raw) > 0, "--space", str(path), "maps no field ({}): a sweep needs at least one field")
    space: dict[str, Any] = {}
    reachable: dict[str, list[Any]] = {}  # each key's grid points, choices, range bounds or fixed value
    base_raw = to_dict(base)
    flat = flatten(base)
    field_type = field_types(base)
    for key, spec in raw.items():
        require(isinstance(key, str) and (key in flat or key.startswith("method.")), f"space.{key}", spec,
                "keys must be dotted config fields, e.g. method.mu or train.lr (see `lcfed config`)")
        if isinstance(spec, Mapping):
            require(len(spec) == 1 and next(iter(spec)) in DOMAINS, f"space.{key}", dict(spec),
                    f"one of {sorted(DOMAINS)} with its arguments, e.g. {{loguniform: [0.001, 1]}}")
            kind, args = next(iter(spec.items()))
            values = domain_extremes(f"space.{key}", kind, args)
            check_draw_type(key, dict(spec), kind, field_type.get(key))
            for v in values:  # every reachable extreme must make a valid config
                try:
                    from_dict(apply_overrides(base_raw, {key: v}))
                except ConfigError as exc:
                    raise ConfigError(f"space.{key}", v, f"gives an invalid config: {exc}") from None
            space[key] = DOMAINS[kind](args)
            reachable[key] = values
        else:
            display_form_hint(key, spec)
            from_dict(apply_overrides(base_raw, {key: spec}))
            space[key] = spec
            reachable[key] = [spec]
    check_combinations(base_raw, reachable, {k for k, v in raw.items() if isinstance(v, Mapping) and "grid" in v})
    return space


def display_form_hint(key: str, spec: Any) -> None:
    """A domain written as it is displayed (``loguniform(0.001, 1)``) is a string to YAML, not a domain: name the
    file's form instead of a type error about the string."""
    match = re.fullmatch(r"\s*(\w+)\s*\((.*)\)\s*", spec) if isinstance(spec, str) else None
    if match and match.group(1) in DOMAINS:
        kind, inner = match.group(1), match.group(2).strip()
        args = inner if inner.startswith("[") else f"[{inner}]"
        raise ConfigError(f"space.{key}", spec, f"is a domain's display form, which YAML reads as a string; "
                                                f"write it as {{{kind}: {args}}}")


#: the most combinations of the sampled keys' reachable values checked together (each costs a config's
#: validation, 10-100 ms; a product of many choices grows fast); every grid point is checked whatever their number
MAX_COMBINATIONS = 16


def check_combinations(base_raw: Mapping[str, Any], reachable: Mapping[str, list[Any]], grid: set[str]) -> None:
    """Every grid point (the product of the ``grid`` keys' values, which Tune runs each of) with the fixed values,
    and, up to :data:`MAX_COMBINATIONS`, every combination of the sampled keys' choices and range bounds with them,
    must validate with the base config, as each key alone does: an invalid one (more evaluation devices than a
    grid point's devices) would fail its trials after Tune has started, so it is refused here, named."""
    keys = list(reachable)
    if len(keys) < 2:
        return
    if math.prod(len(v) for v in reachable.values()) > MAX_COMBINATIONS:  # the grid points alone
        keys = [k for k in keys if k in grid or len(reachable[k]) == 1]
    for combo in itertools.product(*(reachable[k] for k in keys)):
        try:
            from_dict(apply_overrides(base_raw, dict(zip(keys, combo, strict=True))))
        except ConfigError as exc:
            named = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo, strict=True))
            raise ConfigError("--space", named, f"this combination gives an invalid config: {exc}") from None


def finite_number(v: Any) -> bool:
    """A real number (not a bool), finite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def domain_extremes(field_name: str, kind: str, args: Any) -> list[Any]:
    """Check a domain's arguments by type and bounds; return the values a trial can reach at the
    extremes (every element of a choice), which must each make a valid config."""
    if kind in ("choice", "grid"):
        require(isinstance(args, list) and len(args) > 0, field_name, {kind: args},
                f"{kind} takes a non-empty list of values, e.g. {{{kind}: [0.01, 0.1]}}")
        return list(args)
    quantized = kind in ("quniform", "qrandint")
    shape = {"loguniform": "[low, high] with 0 < low < high", "uniform": "[low, high] with low < high",
             "quniform": "[low, high, q] with low < high, q > 0 and low, high multiples of q",
             "randint": "[low, high] integers with low < high (high excluded)",
             "qrandint": "[low, high, q] integers with low < high, q >= 2 (q = 1 is randint) and low, high "
                         "multiples of q (high included)"}[kind]
    ok = isinstance(args, list) and len(args) == (3 if quantized else 2) and all(finite_number(v) for v in args)
    if ok and kind in INTEGER_DOMAINS:
        ok = all(isinstance(v, int) for v in args)
    if ok:
        low, high = args[0], args[1]
        ok = low < high and (kind != "loguniform" or low > 0)
        if quantized:  # bounds on the grid: Tune refuses others (quniform) or moves them inwards (qrandint)
            q = args[2]
            ok = ok and q > (1 if kind == "qrandint" else 0) and all(
                math.isclose(b / q, round(b / q)) for b in (low, high))
    require(ok, field_name, {kind: args}, f"{kind} takes {shape} (finite numbers; a single value needs no domain)")
    return [args[0], args[1] - 1] if kind == "randint" else [args[0], args[1]]


def check_draw_type(key: str, spec: Any, kind: str, annotation: Any) -> None:
    """Refuse a range drawing floats for a field that takes none (``annotation``; None for no such field,
    which the extremes check refuses): bounds such as ``uniform: [1, 10]`` make valid configs, but every
    trial would die on its first draw (2.7 local steps)."""
    if kind not in FLOAT_DOMAINS or annotation is None or accepts(annotation, 0.5):
        return
    fix = ("use randint: [low, high] or qrandint: [low, high, q] (integer draws), or choice: [...]"
           if accepts(annotation, 1) else "use choice: [...]")
    raise ConfigError(f"space.{key}", spec, f"{kind} draws floats, but {key} takes {type_name(annotation)}: {fix}")


def space_spec(domain: Any) -> Any:
    """A search-space entry (a Tune domain, a grid or a value) in the ``--space`` file's form."""
    if isinstance(domain, Mapping) and set(domain) == {"grid_search"}:
        return {"grid": list(domain["grid_search"])}
    if isinstance(domain, Categorical):
        return {"choice": list(domain.categories)}
    if isinstance(domain, (Float, Integer)):
        sampler, q = domain.get_sampler(), None
        if isinstance(sampler, Quantized):
            q, sampler = sampler.q, sampler.sampler  # (q first: mypy reads sampler as reassigned)
        log = isinstance(sampler, LogUniform)
        if isinstance(domain, Integer):
            kind = "lograndint" if log else "randint"
        else:
            kind = "loguniform" if log else "uniform"
        if q is not None:
            kind = "q" + kind
        return {kind: [domain.lower, domain.upper] + ([q] if q is not None else [])}
    return domain


def describe_domain(domain: Any) -> str:
    """``loguniform(0.001, 1)``, ``choice([2, 4])``, ``grid([0.05, 0.2])`` or the fixed value."""
    spec = space_spec(domain)
    if isinstance(spec, dict) and len(spec) == 1:
        kind, args = next(iter(spec.items()))
        if isinstance(args, list) and kind not in ("choice", "grid"):
            return f"{kind}({', '.join(f'{a:g}' if isinstance(a, float) else str(a) for a in args)})"
        return f"{kind}({args})"
    return str(spec)


def swept_keys(space: Mapping[str, Any]) -> list[str]:
    """The space's keys that vary between trials (not fixed values)."""
    return [k for k, v in space.items() if space_spec(v) is not v]


def log_keys(space: Mapping[str, Any]) -> list[str]:
    """The swept keys drawn on a log scale (``loguniform``, ``lograndint`` and their ``q`` forms): their trials
    log :func:`log_param` too, so the UI's charts, which have no log axes, spread them evenly."""
    specs = {k: space_spec(space[k]) for k in swept_keys(space)}
    return [k for k, spec in specs.items() if isinstance(spec, dict) and "log" in next(iter(spec), "")]


def log_param(key: str) -> str:
    """The param a trial logs ``log10`` of a log-scale swept value under: ``log10.method.mu``."""
    return f"log10.{key}"


def numeric_keys(space: Mapping[str, Any]) -> list[str]:
    """The swept keys whose values are numbers (a scatter chart's axis; a choice of names is not)."""
    out = []
    for k in swept_keys(space):
        kind, args = next(iter(space_spec(space[k]).items()))
        if kind not in ("choice", "grid") or all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in args):
            out.append(k)
    return out
