"""Experiment configuration: frozen dataclasses, YAML loading, ``key=value`` overrides, validation.

Every field is checked before any work starts; a bad value raises :class:`ConfigError` naming the field
(dotted path), the value and what is allowed. One module a section, with its fields, types, defaults and
the rules they follow (:mod:`~lcfed.config.data`, :mod:`~lcfed.config.train` for ``model`` and ``train``,
:mod:`~lcfed.config.engine`, :mod:`~lcfed.config.tracking` for ``tracking`` and ``checkpoint``,
:mod:`~lcfed.config.devices` for ``network`` and ``devices``, :mod:`~lcfed.config.privacy`); the whole config and its conversions in
:mod:`~lcfed.config.experiment`; the override and name-resolution rules in :mod:`~lcfed.config.overrides`,
the typed conversion of values in :mod:`~lcfed.config.types`, strict YAML in :mod:`~lcfed.config.yaml_input`.
The configuration layer imports only the leaves below it (:mod:`lcfed.errors`, :mod:`lcfed.numerics`' profile
names, :mod:`lcfed.registry`'s tables of names): no method, engine or run.

This package is the face plugins and the API import from: the names below, and two it re-exports on
purpose, ``ConfigError`` and ``require`` (:mod:`lcfed.errors`'s; a strategy's ``validate`` raises through
``lcfed.config.require``, docs/plugins.md). Inside this package each name is imported from the module that
defines it.
"""

from lcfed.config.data import DataConfig
from lcfed.config.devices import DevicesConfig, NetworkConfig
from lcfed.config.engine import EngineConfig
from lcfed.config.experiment import (
    LATER_DEFAULTS,
    MAX_SEED,
    NAME_RULE,
    ExperimentConfig,
    MethodConfig,
    devices_per_round,
    drop_later_defaults,
    field_types,
    flatten,
    from_dict,
    load_config,
    safe_name,
    to_dict,
)
from lcfed.config.privacy import PrivacyConfig
from lcfed.config.tracking import CheckpointConfig, TrackingConfig
from lcfed.config.train import ModelConfig, TrainConfig
from lcfed.errors import ConfigError, require

__all__ = [
    "LATER_DEFAULTS", "MAX_SEED", "NAME_RULE", "CheckpointConfig", "ConfigError", "DataConfig", "DevicesConfig",
    "EngineConfig", "ExperimentConfig", "MethodConfig", "ModelConfig", "NetworkConfig", "PrivacyConfig", "TrackingConfig", "TrainConfig",
    "devices_per_round", "drop_later_defaults", "field_types", "flatten", "from_dict", "load_config", "require",
    "safe_name", "to_dict",
]
