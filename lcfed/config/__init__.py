"""Experiment configuration: frozen dataclasses, YAML loading, ``key=value`` overrides, validation.

Every field is checked before any work starts; a bad value raises :class:`ConfigError` naming the
field (dotted path), the value and what is allowed.

This file is the one schema: every section's fields, types and defaults, in the order they print, and
the conversions (plain data, dotted keys, digests). The long sections' checks live in
:mod:`lcfed.config.rules` (each section's ``validate`` calls its function there), the override and
name-resolution rules in :mod:`lcfed.config.overrides`, the typed conversion of values in
:mod:`lcfed.config.types`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcfed import registry
from lcfed.config.overrides import apply_overrides, parse_override, resolve
from lcfed.config.rules import check_data, check_devices, check_engine, check_tracking, check_train, holdout_count
from lcfed.config.types import build_dataclass, typed_value
from lcfed.config.yaml_input import read_yaml
from lcfed.errors import (  # a leaf module (the methods import it); ConfigError and require: this API too
    ConfigError,
    did_you_mean,
    require,
)

#: what this module defines, and two names it re-exports on purpose: ``ConfigError`` and ``require``
#: (:mod:`lcfed.errors`'s) are the plugin face (a strategy's ``validate`` raises through
#: ``lcfed.config.require``, docs/plugins.md); the repository's own code imports them from lcfed.errors
__all__ = [
    "LATER_DEFAULTS", "MAX_SEED", "NAME_RULE", "CheckpointConfig", "ConfigError", "DataConfig", "DevicesConfig",
    "EngineConfig",
    "ExperimentConfig", "MethodConfig", "ModelConfig", "NetworkConfig", "TrackingConfig", "TrainConfig",
    "drop_later_defaults", "field_types", "flatten", "from_dict", "load_config", "require", "safe_name", "to_dict",
]

#: numpy, torch and scikit-learn all take it (seed + round stays below 2**32)
MAX_SEED = 2**31 - 1
NAME_RULE = ("must be 1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit "
             "(it names directories: sweeps, checkpoints)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def safe_name(name: Any) -> bool:
    """A name that is safe as one path component (no separators, no '..', no leading dot)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class DataConfig:
    """Where the samples come from and how they are split across devices."""

    dataset: str = "digits"
    data_dir: str = "~/.cache/lcfed"
    download: bool = False
    partition: str = "dirichlet"
    alpha: float = 0.5
    classes_per_device: int = 2
    num_devices: int = 20
    min_samples: int = 10
    test_fraction: float = 0.2
    subset: int = 0
    samples_per_device: tuple[int, ...] = ()
    primary: tuple[float, ...] = (0.4, 0.6)
    secondary: tuple[float, ...] = (0.2, 0.4)
    dirichlet_convention: str = "rebalance"
    min_test_samples: int = 0
    normalize: str = "standardize"
    val_fraction: float = 0.0
    holdout_fraction: float = 0.0
    path: str = ""
    format: str = "auto"
    label_column: str = "label"
    device_column: str = "device"
    group_column: str = ""
    image_size: tuple[int, ...] = ()
    user_selection: str = "largest"
    testbed: str = "none"
    testbed_groups: int = 4
    synthetic_samples: int = 0
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    synthetic_clusters: int = 0

    @property
    def training_devices(self) -> int:
        """The devices rounds draw from: ``num_devices`` less the held-out ones."""
        return self.num_devices - holdout_count(self.num_devices, self.holdout_fraction)

    def validate(self, prefix: str = "data") -> None:
        check_data(self, prefix)


@dataclass(frozen=True)
class ModelConfig:
    """Which network every device trains."""

    name: str = "lenet5"

    def validate(self, prefix: str = "model") -> None:
        resolve("model", f"{prefix}.name", self.name)


@dataclass(frozen=True)
class TrainConfig:
    """The federation's budget: rounds, participation and local work, shared by every method."""

    rounds: int = 20
    lr: float = 0.05
    batch_size: int = 32
    local_steps: int | None = 10
    local_epochs: int | None = None
    participation: float = 1.0
    eval_every: int = 1
    eval_devices: int = 0
    final_eval_devices: int = -1  # the last round's: -1 auto (a sample above FINAL_EVAL_AUTO devices), 0 all, N

    def validate(self, prefix: str = "train") -> None:
        check_train(self, prefix)


@dataclass(frozen=True)
class EngineConfig:
    """How rounds execute: in-process, or on Ray with a pool of device actors."""

    kind: str = "local"
    num_actors: int = 0
    devices_per_actor: int = 0
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = -1.0
    gpus: float = -1.0
    actors_per_gpu: int = 2
    placement_timeout_s: float = 300.0
    torch_threads: int = 1
    workers: int = 0
    vectorize: str = "auto"
    vectorize_max: int = 256
    device: str = "auto"
    address: str | None = None
    num_cpus: int = 0
    object_store_mb: int = 256
    max_failures: int = 3
    numerics: str = "portable"
    state_memory_mb: float = 0.0
    spill_dir: str = ""
    data_reads: str = "auto"

    def validate(self, prefix: str = "engine") -> None:
        check_engine(self, prefix)


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking: where runs go and what they are called; how many evaluations the end-of-run
    summary averages (``summary_evals``; the table reproductions average 3 too); how long the end of a run
    waits for a tracking server that is gone (``end_wait_s``: a restart takes seconds)."""

    enabled: bool = True
    uri: str | None = None
    experiment: str = "lcfed"
    run_name: str | None = None
    summary_evals: int = 3
    end_wait_s: float = 30.0

    def validate(self, prefix: str = "tracking") -> None:
        check_tracking(self, prefix)


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often the run's full state is saved (server, devices, history)."""

    dir: str | None = None
    every: int = 1

    def validate(self, prefix: str = "checkpoint") -> None:
        require(self.every >= 1, f"{prefix}.every", self.every, "must be >= 1 (rounds between checkpoints)")


@dataclass(frozen=True)
class NetworkConfig:
    """The simulated deployment that prices a round in seconds: each device's link and compute speed.

    Devices transfer in parallel on their own links; compute counts 3 forward passes (forward +
    backward) per training sample at ``device_gflops``.
    """

    bandwidth_mbps: float = 2.0
    device_gflops: float = 10.0

    def validate(self, prefix: str = "network") -> None:
        require(self.bandwidth_mbps > 0, f"{prefix}.bandwidth_mbps", self.bandwidth_mbps, "must be > 0 (Mbit/s per device link)")
        require(self.device_gflops > 0, f"{prefix}.device_gflops", self.device_gflops, "must be > 0 (GFLOP/s per device)")


@dataclass(frozen=True)
class DevicesConfig:
    """Devices that come and go (docs/devices.md): per-device speed, links, availability and dropouts on a
    simulated clock, and the round's policies (deadline, over-commitment). Off (``simulate: false``) every
    sampled device is online, finishes and answers at once, as before."""

    simulate: bool = False
    speed_sigma: float = 0.0  # lognormal log-sd of compute speeds around network.device_gflops
    bandwidth_sigma: float = 0.0  # the same for links around network.bandwidth_mbps
    latency_ms: float = 0.0  # added to each transfer, each way
    availability: str = "always"  # always | diurnal | iid | trace
    online_fraction: float = 1.0  # diurnal: the share of the day online; iid: each slot's chance to be online
    period_hours: float = 24.0  # diurnal / iid: the pattern's period
    slot_minutes: float = 60.0  # iid: the on/off slot
    phase: str = "random"  # diurnal: random per device, or "groups" (follows data's true groups / users)
    phase_jitter: float = 0.05  # phase: groups: each device's offset from its group's phase (share of a period)
    dropout: float = 0.0  # chance that a selected device drops out during the round
    capacity_trace: str = ""  # FedScale capacity trace: speeds and links per device
    availability_trace: str = ""  # FedScale availability trace (with availability: trace)
    trace_format: str = "auto"  # auto | json | csv | parquet | pickle
    deadline_seconds: float = 0.0  # devices not back by then are dropped (0: the server waits)
    overcommit: float = 0.0  # select ceil((1 + overcommit) * k), keep the first k to finish
    target_acc: float = 0.0  # acc_mean for time_to_target (simulated seconds); 0: not reported
    aggregation: str = "sync"  # sync: rounds; async: FedBuff, the server aggregates every async_buffer arrivals
    async_buffer: int = 0  # async: B, the arrivals per aggregation (1 <= B <= devices in flight)
    staleness: str = "sqrt"  # async: an update s versions old counts 1/sqrt(1 + s) (sqrt) or 1 (constant)

    def validate(self, prefix: str = "devices") -> None:
        check_devices(self, prefix)


@dataclass(frozen=True)
class MethodConfig:
    """The method's registered name and its own typed hyper-parameters."""

    name: str = "lcfed"
    params: Any = None

    def validate(self, cfg: ExperimentConfig, prefix: str = "method") -> None:
        if hasattr(self.params, "validate"):
            self.params.validate(cfg, prefix)


@dataclass(frozen=True)
class ExperimentConfig:
    """One federation: data, model, budget, method, engine, tracking and the seed."""

    name: str = "experiment"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)

    def validate(self) -> ExperimentConfig:
        require(0 <= self.seed <= MAX_SEED, "seed", self.seed, f"must be an integer in [0, {MAX_SEED}]")
        require(safe_name(self.name), "name", self.name, NAME_RULE)
        self.data.validate()
        self.model.validate()
        self.train.validate()
        self.engine.validate()
        self.tracking.validate()
        self.checkpoint.validate()
        self.network.validate()
        self.devices.validate()
        if self.devices.simulate and self.devices.aggregation == "async":
            from lcfed.methods.base import devices_per_round  # (torch: the method resolved below loads it anyway)

            in_flight = devices_per_round(self)
            require(self.devices.async_buffer <= in_flight, "devices.async_buffer", self.devices.async_buffer,
                    f"must be <= the devices in flight (train.participation of the training devices = {in_flight})")
            strategy = resolve("method", "method.name", self.method.name).strategy
            able = [e.name for e in registry.names("method")
                    if e.origin == "built-in" and registry.method(e.name).strategy.supports_async]
            require(strategy.supports_async, "devices.aggregation", "async",
                    f"method {self.method.name} does not aggregate asynchronously; those that do: {', '.join(able)}")
        self.method.validate(self)
        return self

    def digest(self) -> str:
        """Hash of what determines the numbers (not rounds, engine, tracking or checkpointing), so a
        checkpoint is only resumed by a config that would have produced it."""
        d = to_dict(self)
        for section in ("engine", "tracking", "checkpoint"):
            d.pop(section, None)
        d["train"] = {k: v for k, v in d["train"].items() if k not in ("rounds", "eval_every", "eval_devices",
                                                                       "final_eval_devices")}
        d.pop("name", None)
        drop_later_defaults(d)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def replace(self, **overrides: Any) -> ExperimentConfig:
        """A copy with dotted-key overrides applied (``{"method.mu": 0.2}``), re-validated."""
        return from_dict(apply_overrides(to_dict(self), overrides))


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "engine": EngineConfig,
    "tracking": TrackingConfig,
    "checkpoint": CheckpointConfig,
    "network": NetworkConfig,
    "devices": DevicesConfig,
}


def field_types(cfg: ExperimentConfig) -> dict[str, Any]:
    """Dotted keys (those of :func:`flatten`) to their type annotations; the ``method.*`` ones from the
    Params of ``cfg``'s method."""
    top = typing.get_type_hints(ExperimentConfig)
    out = {key: top[key] for key in ("name", "seed")}
    out["method.name"] = typing.get_type_hints(MethodConfig)["name"]
    for section, cls in {**_SECTIONS, "method": type(cfg.method.params)}.items():
        hints = typing.get_type_hints(cls)
        out.update({f"{section}.{f.name}": hints[f.name] for f in dataclasses.fields(cls) if f.init})
    return out


def from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from nested plain data."""
    require(isinstance(raw, Mapping), "<config>", type(raw).__name__, "must be a mapping")
    top = {f.name for f in dataclasses.fields(ExperimentConfig)}
    for key in raw:
        require(key in top, key, raw[key],
                f"unknown section; allowed: {', '.join(sorted(top))}{did_you_mean(key, top)}")
    kwargs: dict[str, Any] = {}
    for key in ("name", "seed"):
        if key in raw:
            kwargs[key] = typed_value(key, raw[key], typing.get_type_hints(ExperimentConfig)[key])
    for section, cls in _SECTIONS.items():
        if section in raw:
            kwargs[section] = build_dataclass(cls, raw[section], section)
    method_section = raw.get("method") or {}
    require(isinstance(method_section, Mapping), "method", method_section,
            "must be a mapping of fields (name and the method's parameters)")
    method_raw = dict(method_section)
    name = typed_value("method.name", method_raw.pop("name", MethodConfig.name),
                       typing.get_type_hints(MethodConfig)["name"])
    params = build_dataclass(resolve("method", "method.name", name).params, method_raw, "method")
    kwargs["method"] = MethodConfig(name=name, params=params)
    return ExperimentConfig(**kwargs).validate()


#: fields added after checkpoints and logged runs existed, with the value that changes nothing: left
#: out of digests at that value, so digests of configs that do not use them stay as they were
LATER_DEFAULTS: dict[str, dict[str, Any]] = {"data": {
    "val_fraction": 0.0, "holdout_fraction": 0.0, "path": "", "format": "auto", "label_column": "label",
    "device_column": "device", "group_column": "", "image_size": (), "user_selection": "largest", "testbed": "none",
    "testbed_groups": 4, "synthetic_samples": 0, "synthetic_alpha": 1.0, "synthetic_beta": 1.0, "synthetic_clusters": 0,
}, "train": {}, "devices": {f.name: f.default for f in dataclasses.fields(DevicesConfig)}}


#: the sections every digest has always had (a later one at its defaults leaves the digest as it was)
_FIRST_SECTIONS = frozenset({"name", "seed", "data", "model", "train", "method", "engine", "tracking", "checkpoint",
                             "network"})


def drop_later_defaults(d: dict[str, Any]) -> None:
    """Remove (in place) from a :func:`to_dict`-shaped dict the :data:`LATER_DEFAULTS` at their value."""
    for section, defaults in LATER_DEFAULTS.items():
        values = d.get(section, {})
        for key, value in defaults.items():
            if key in values and values[key] == value:
                del values[key]
        if section in d and not values and section not in _FIRST_SECTIONS:  # a later section at its defaults
            del d[section]


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Nested plain data that :func:`from_dict` turns back into ``cfg``."""
    out: dict[str, Any] = {"name": cfg.name, "seed": cfg.seed}
    for section in _SECTIONS:
        out[section] = dataclasses.asdict(getattr(cfg, section))
    method = {"name": cfg.method.name}
    if cfg.method.params is not None:
        method.update(dataclasses.asdict(cfg.method.params))
    out["method"] = method
    return out


def flatten(cfg: ExperimentConfig) -> dict[str, Any]:
    """Dotted keys to scalars (``method.mu``): MLflow params and Tune search spaces address these."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = value

    walk("", to_dict(cfg))
    return flat


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Read a YAML file (or start from defaults), apply ``key=value`` overrides, validate."""
    raw: Mapping[str, Any] = {}
    if path is not None:
        raw = read_yaml(path, "--config", "YAML experiment config")
        require(isinstance(raw, Mapping), "--config", str(path),
                f"must be a mapping of sections (name, seed, data, train, method, ...), not a {type(raw).__name__}")
    parsed = [parse_override(o) for o in overrides]
    return from_dict(apply_overrides(raw, parsed))
