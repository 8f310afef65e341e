"""The whole config: :class:`ExperimentConfig` (its sections, the method's name and typed parameters, the
seed), its checks across sections, and its conversions: from and to plain data (:func:`from_dict`,
:func:`to_dict`), dotted keys (:func:`flatten`, :func:`field_types`), the digest of what determines the
numbers, YAML loading with ``key=value`` overrides (:func:`load_config`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lcfed import registry
from lcfed.config.data import DataConfig
from lcfed.config.devices import DevicesConfig, NetworkConfig, check_fleet_size
from lcfed.config.engine import EngineConfig, machine_limits
from lcfed.config.overrides import apply_overrides, parse_override, resolve
from lcfed.config.privacy import PrivacyConfig, check_count_noise, check_privacy
from lcfed.config.tracking import CheckpointConfig, TrackingConfig
from lcfed.config.train import ModelConfig, TrainConfig
from lcfed.config.types import build_dataclass, type_hints, typed_value
from lcfed.config.yaml_input import read_yaml
from lcfed.errors import ConfigError, did_you_mean, require

__all__ = ["ExperimentConfig", "LATER_DEFAULTS", "MAX_SEED", "MethodConfig", "NAME_RULE", "devices_per_round", "drop_later_defaults", "field_types", "flatten", "from_dict", "load_config", "safe_name", "to_dict"]


#: numpy, torch and scikit-learn all take it (seed + round stays below 2**32)
MAX_SEED = 2**31 - 1


NAME_RULE = ("must be 1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit "
             "(it names directories: sweeps, checkpoints)")


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def safe_name(name: Any) -> bool:
    """A name that is safe as one path component (no separators, no '..', no leading dot)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


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
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

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
        self.privacy.validate()
        check_privacy(self.privacy, self.data.training_devices, devices_per_round(self))
        check_fleet_size(self.devices, self.data.num_devices, machine_limits()[2])
        for sample in ("eval_devices", "final_eval_devices"):  # a sample of more devices than there are is none
            count = getattr(self.train, sample)
            require(count <= self.data.training_devices, f"train.{sample}", count,
                    f"must be at most the training devices ({self.data.training_devices}: data.num_devices less "
                    "the held-out ones); 0 evaluates every device")
        if self.devices.simulate and self.devices.aggregation == "async":
            in_flight = devices_per_round(self)
            require(self.devices.async_buffer <= in_flight, "devices.async_buffer", self.devices.async_buffer,
                    f"must be <= the devices in flight (train.participation of the training devices = {in_flight})")
            strategy = resolve("method", "method.name", self.method.name).strategy
            able = [e.name for e in registry.names("method")
                    if e.origin == "built-in" and registry.method(e.name).strategy.supports_async]
            require(strategy.supports_async, "devices.aggregation", "async",
                    f"method {self.method.name} does not aggregate asynchronously; those that do: {', '.join(able)}")
        if self.privacy.on:
            self._check_private_method()
        if self.privacy.sample_on:
            self._check_sample_dp()
        self.method.validate(self)
        return self

    def _check_private_method(self) -> None:
        """``privacy.mode: central`` needs a method whose server reads only what it can clip and noise."""
        reads = resolve("method", "method.name", self.method.name).strategy.reads
        if not reads.private:
            what = (f"reads per-device {', '.join(reads.per_device)} beyond the clipped and noised aggregate"
                    if reads.per_device else f"sums {', '.join(reads.sums)} without clipping and noise")
            able = [e.name for e in registry.names("method")
                    if e.origin == "built-in" and registry.method(e.name).strategy.reads.private]
            require(False, "privacy.mode", self.privacy.mode,
                    f"method {self.method.name} {what}; those that can run under central: {', '.join(able)}")
        require(not (self.devices.simulate and self.devices.aggregation == "async"), "privacy.mode",
                self.privacy.mode, "needs devices.aggregation: sync (asynchronous updates are not accounted)")
        if self.privacy.noise_multiplier is not None:  # a solved σ is checked when solved (lcfed.methods.privacy)
            check_count_noise(self.privacy, self.privacy.noise_multiplier, len(reads.sums), devices_per_round(self))

    def _check_sample_dp(self) -> None:
        """Sample-level DP-SGD covers a device's samples only where every read of them is a step of the shared local
        SGD, and its per-sample gradients run in the device loop, not in the vectorized step."""
        strategy = resolve("method", "method.name", self.method.name).strategy
        if not getattr(strategy, "samples_in_sgd_only", False):
            able = [e.name for e in registry.names("method")
                    if e.origin == "built-in" and registry.method(e.name).strategy.samples_in_sgd_only]
            require(False, "privacy.sample_noise", self.privacy.sample_noise,
                    f"method {self.method.name} reads its devices' samples outside the shared local SGD (DP-SGD would "
                    f"not cover it); those that can run with it: {', '.join(able)}")
        require(self.engine.vectorize != "always", "engine.vectorize", self.engine.vectorize,
                "must be auto or never with privacy.sample_noise (DP-SGD's per-sample gradients run device by device)")

    def digest(self) -> str:
        """Hash of what determines the numbers (not rounds, engine, tracking or checkpointing), so a
        checkpoint is only resumed by a config that would have produced it."""
        d = to_dict(self)
        for section in ("engine", "tracking", "checkpoint"):
            d.pop(section, None)
        d["train"] = {k: v for k, v in d["train"].items() if k not in ("rounds", "eval_every", "eval_devices",
                                                                       "final_eval_devices")}
        d.pop("name", None)
        if not self.privacy.on and not self.privacy.sample_on:  # off, its other fields change nothing
            d.pop("privacy", None)
        elif self.privacy.on:
            if self.privacy.target_epsilon is not None:  # σ is solved for the planned rounds
                d["privacy"]["rounds"] = self.train.rounds
            if self.privacy.clip_quantile is None:  # a fixed clip: the adaptive knobs change nothing
                for knob in ("clip_lr", "count_noise"):
                    d["privacy"].pop(knob, None)
        drop_later_defaults(d)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def replace(self, **overrides: Any) -> ExperimentConfig:
        """A copy with dotted-key overrides applied (``{"method.mu": 0.2}``), re-validated."""
        return from_dict(apply_overrides(to_dict(self), overrides))


def devices_per_round(cfg: ExperimentConfig) -> int:
    """How many devices a round selects: ``train.participation`` of the training devices, at least one
    (as :func:`lcfed.methods.round.select_devices` counts them)."""
    return max(1, math.ceil(cfg.train.participation * cfg.data.training_devices - 1e-9))


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "engine": EngineConfig,
    "tracking": TrackingConfig,
    "checkpoint": CheckpointConfig,
    "network": NetworkConfig,
    "devices": DevicesConfig,
    "privacy": PrivacyConfig,
}


def field_types(cfg: ExperimentConfig) -> dict[str, Any]:
    """Dotted keys (those of :func:`flatten`) to their type annotations; the ``method.*`` ones from the
    Params of ``cfg``'s method."""
    top = type_hints(ExperimentConfig)
    out = {key: top[key] for key in ("name", "seed")}
    out["method.name"] = type_hints(MethodConfig)["name"]
    for section, cls in {**_SECTIONS, "method": type(cfg.method.params)}.items():
        hints = type_hints(cls)
        out.update({f"{section}.{f.name}": hints[f.name] for f in dataclasses.fields(cls) if f.init})
    return out


def from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from nested plain data."""
    require(isinstance(raw, Mapping), "<config>", type(raw).__name__, "must be a mapping")
    top = {f.name for f in dataclasses.fields(ExperimentConfig)}
    for key in raw:
        if key not in top:  # the suggestion only for a key refused
            raise ConfigError(key, raw[key], f"unknown section; allowed: {', '.join(sorted(top))}{did_you_mean(key, top)}")
    kwargs: dict[str, Any] = {}
    for key in ("name", "seed"):
        if key in raw:
            kwargs[key] = typed_value(key, raw[key], type_hints(ExperimentConfig)[key])
    for section, cls in _SECTIONS.items():
        if section in raw:
            kwargs[section] = build_dataclass(cls, raw[section], section)
    method_section = raw.get("method") or {}
    require(isinstance(method_section, Mapping), "method", method_section,
            "must be a mapping of fields (name and the method's parameters)")
    method_raw = dict(method_section)
    name = typed_value("method.name", method_raw.pop("name", MethodConfig.name),
                       type_hints(MethodConfig)["name"])
    method = resolve("method", "method.name", name)
    params = build_dataclass(method.params, method_raw, "method")
    kwargs["method"] = MethodConfig(name=name, params=params)
    _method_model(kwargs, raw, name, method.strategy)
    return ExperimentConfig(**kwargs).validate()


def _method_model(kwargs: dict[str, Any], raw: Mapping[str, Any], name: str, strategy: Any) -> None:
    """The model a method declares (``Strategy.model``) when the config names none; one it cannot run with
    (not in ``Strategy.models``) refused."""
    section = raw.get("model")
    named = isinstance(section, Mapping) and "name" in section
    default = getattr(strategy, "model", None)
    if default and not named:
        kwargs["model"] = ModelConfig(name=default)
    allowed = tuple(getattr(strategy, "models", ()) or ())
    chosen = kwargs["model"].name if "model" in kwargs else ModelConfig.name
    require(not allowed or chosen in allowed, "model.name", chosen,
            f"method {name} runs with {' or '.join(allowed)} only")


#: fields added after checkpoints and logged runs existed, with the value that changes nothing: left
#: out of digests at that value, so digests of configs that do not use them stay as they were
LATER_DEFAULTS: dict[str, dict[str, Any]] = {"data": {
    "val_fraction": 0.0, "holdout_fraction": 0.0, "path": "", "format": "auto", "label_column": "label",
    "device_column": "device", "group_column": "", "image_size": (), "user_selection": "largest", "testbed": "none",
    "testbed_groups": 4, "synthetic_samples": 0, "synthetic_alpha": 1.0, "synthetic_beta": 1.0, "synthetic_clusters": 0,
}, "train": {}, "devices": {f.name: f.default for f in dataclasses.fields(DevicesConfig)},
    "privacy": {f.name: f.default for f in dataclasses.fields(PrivacyConfig)},
    # LCFed's, FedAC's and FL+HC's wait for coverage, added after their checkpoints existed
    "method": {"coverage": 0.0}}


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
