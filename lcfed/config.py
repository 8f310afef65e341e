"""Experiment configuration: frozen dataclasses, YAML loading, ``key=value`` overrides, validation.

Every field is checked before any work starts; a bad value raises :class:`ConfigError` naming the
field (dotted path), the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from lcfed.config_types import build_dataclass, typed_value
from lcfed.errors import (  # defined in a leaf module (the methods import it); still this API
    ConfigError,
    did_you_mean,
    require,
)
from lcfed.numerics import PROFILES
from lcfed.overrides import apply_overrides, parse_override, resolve
from lcfed.yaml_input import read_yaml

#: numpy, torch and scikit-learn all take it (seed + round stays below 2**32)
MAX_SEED = 2**31 - 1
#: tracking-store URI schemes MLflow can log to
TRACKING_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")
NAME_RULE = ("must be 1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit "
             "(it names directories: sweeps, checkpoints)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def safe_name(name: Any) -> bool:
    """A name that is safe as one path component (no separators, no '..', no leading dot)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def uri_scheme(uri: str) -> str:
    """The URI's scheme, lower-case and without a driver (``postgresql+psycopg2://`` -> ``postgresql``);
    ``""`` for a plain path."""
    return uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""


#: CPU threads (``engine.torch_threads``, ``engine.num_cpus``) allowed per CPU of this machine: a few
#: times the cores only oversubscribes, far more makes torch's OpenMP run out of memory at the first kernel
THREADS_PER_CPU = 4


def machine_limits() -> tuple[int, int, int]:
    """(this machine's CPUs, the most CPU threads a field may ask for, its memory in MB)."""
    cpus = os.cpu_count() or 1
    return cpus, THREADS_PER_CPU * cpus, psutil.virtual_memory().total // 2**20


NORMALIZE = ("standardize", "unit")
"""``data.normalize``: how uint8 pixels become model inputs."""


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
        # imported here: lcfed.data imports torch (seconds), which reading and checking a config does not need
        from lcfed.data import DIRICHLET_CONVENTIONS, partition_schemes

        resolve("dataset", f"{prefix}.dataset", self.dataset)
        require(
            self.partition in partition_schemes(),
            f"{prefix}.partition",
            self.partition,
            f"one of {partition_schemes()}",
        )
        require(self.alpha > 0, f"{prefix}.alpha", self.alpha, "must be > 0")
        require(self.classes_per_device >= 1, f"{prefix}.classes_per_device", self.classes_per_device, "must be >= 1")
        require(self.num_devices >= 1, f"{prefix}.num_devices", self.num_devices, "must be >= 1")
        require(self.min_samples >= 2, f"{prefix}.min_samples", self.min_samples, "must be >= 2 (one train, one test)")
        require(
            0 < self.test_fraction < 1, f"{prefix}.test_fraction", self.test_fraction, "must be in (0, 1)"
        )
        require(self.subset >= 0, f"{prefix}.subset", self.subset, "must be >= 0 (0 = every sample)")
        self._validate_generated(prefix)
        q = self.samples_per_device
        require(
            q == () or (len(q) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in q)
                        and self.min_samples <= q[0] <= q[1]),
            f"{prefix}.samples_per_device",
            list(q),
            f"must be [] (no quantity skew) or [low, high] integers with min_samples ({self.min_samples}) <= low <= high",
        )
        for name in ("primary", "secondary"):
            r = getattr(self, name)
            require(
                len(r) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r) and 0 <= r[0] <= r[1] <= 1,
                f"{prefix}.{name}",
                list(r),
                "must be [low, high] fractions with 0 <= low <= high <= 1",
            )
        require(
            self.primary[1] + self.secondary[1] <= 1,
            f"{prefix}.secondary",
            list(self.secondary),
            f"max primary ({self.primary[1]}) + max secondary must be <= 1",
        )
        require(
            self.dirichlet_convention in DIRICHLET_CONVENTIONS,
            f"{prefix}.dirichlet_convention",
            self.dirichlet_convention,
            f"one of {sorted(DIRICHLET_CONVENTIONS)} (how partition=dirichlet meets min_samples; README section 2)",
        )
        require(
            self.normalize in NORMALIZE,
            f"{prefix}.normalize",
            self.normalize,
            f"one of {list(NORMALIZE)} (per-channel mean/std of the devices' training samples, or plain [0, 1])",
        )
        require(self.min_test_samples >= 0, f"{prefix}.min_test_samples", self.min_test_samples,
                "must be >= 0 (0 = no floor on a device's test set)")
        require(0 <= self.val_fraction < 1, f"{prefix}.val_fraction", self.val_fraction,
                "must be in [0, 1): the share of each device's training samples held out for validation (0 = off)")
        require(0 <= self.holdout_fraction < 1, f"{prefix}.holdout_fraction", self.holdout_fraction,
                "must be in [0, 1): the share of devices kept out of training, scored as newcomers at the end (0 = off)")
        held = holdout_count(self.num_devices, self.holdout_fraction)
        require(held < self.num_devices, f"{prefix}.holdout_fraction", self.holdout_fraction,
                f"would hold out all {self.num_devices} devices (data.num_devices): at least one must train")
        require(self.holdout_fraction == 0 or held >= 1, f"{prefix}.holdout_fraction", self.holdout_fraction,
                f"holds out no device of {self.num_devices} (rounds to 0): use at least {0.5 / self.num_devices:.4g}, or 0 for off")
        self._validate_sources(prefix)
        if self.partition == "dirichlet":  # other schemes' device sizes are checked against the data
            require(
                self.min_test_samples < self.min_samples,
                f"{prefix}.min_test_samples",
                self.min_test_samples,
                f"must be < data.min_samples ({self.min_samples}), or the smallest devices keep no training sample: "
                f"raise data.min_samples to at least {self.min_test_samples + 1} or lower the floor",
            )

    def _validate_generated(self, prefix: str) -> None:
        """The generators' fields: ``synthetic``'s sample count, ``leaf_synthetic``'s (README section 2)."""
        generated = self.dataset == "leaf_synthetic"
        require(self.synthetic_samples >= 0 and (self.synthetic_samples == 0 or self.dataset == "synthetic" or generated),
                f"{prefix}.synthetic_samples", self.synthetic_samples,
                "must be >= 0, and 0 unless data.dataset is synthetic or leaf_synthetic (samples to generate; 0 = "
                "synthetic's 60,000, or 40 per device)")
        if generated:
            require(self.partition == "natural", f"{prefix}.partition", self.partition,
                    "must be natural with data.dataset=leaf_synthetic, which generates each device's samples itself")
            require(self.synthetic_samples == 0 or self.synthetic_samples >= self.num_devices * self.min_samples,
                    f"{prefix}.synthetic_samples", self.synthetic_samples,
                    f"must be 0 (40 per device) or >= num_devices x min_samples ({self.num_devices} x {self.min_samples})")
        for name, default in (("synthetic_alpha", 1.0), ("synthetic_beta", 1.0), ("synthetic_clusters", 0)):
            value = getattr(self, name)
            require(value == default or generated, f"{prefix}.{name}", value,
                    f"is read only by data.dataset=leaf_synthetic (data.dataset is {self.dataset!r})")
        for name in ("synthetic_alpha", "synthetic_beta"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, f"{prefix}.{name}", value,
                    "must be a finite number >= 0 (the standard deviation of the devices' "
                    + ("model means)" if name == "synthetic_alpha" else "input means)"))
        require(0 <= self.synthetic_clusters <= self.num_devices, f"{prefix}.synthetic_clusters", self.synthetic_clusters,
                f"must be in [0, num_devices = {self.num_devices}] (0: a model per device; G: G known clusters)")

    def _validate_sources(self, prefix: str) -> None:
        """The fields of file datasets, natural partitions and testbeds (README section 2)."""
        from lcfed.data import FILE_FORMATS, TESTBEDS, USER_SELECTIONS  # (the same)
        from lcfed.data.testbeds import MAX_GROUPS  # (the same)

        if self.dataset == "file":
            require(bool(self.path.strip()), f"{prefix}.path", self.path,
                    "data.dataset=file reads the file or folder data.path names: set it (an .npz, .csv or .parquet "
                    "file, or an ImageFolder directory; a relative path lies under data.data_dir)")
        else:
            require(self.path == "", f"{prefix}.path", self.path,
                    f"is read only by data.dataset=file (data.dataset is {self.dataset!r}): set data.dataset=file, "
                    "or leave data.path empty")
        require(self.format in FILE_FORMATS, f"{prefix}.format", self.format,
                f"one of {list(FILE_FORMATS)} (auto: by data.path's extension; a directory is an ImageFolder)")
        for name in ("label_column", "device_column"):
            require(bool(getattr(self, name).strip()), f"{prefix}.{name}", getattr(self, name), "must be a column name")
        require(self.label_column != self.device_column, f"{prefix}.device_column", self.device_column,
                "must differ from data.label_column")
        require(self.image_size == () or (len(self.image_size) == 2 and all(v >= 1 for v in self.image_size)),
                f"{prefix}.image_size", list(self.image_size),
                "must be [] (the images' own size) or [height, width] in pixels, e.g. [28, 28]")
        require(self.user_selection in USER_SELECTIONS, f"{prefix}.user_selection", self.user_selection,
                f"one of {list(USER_SELECTIONS)} (which users partition=natural keeps: the num_devices largest, or a "
                "seeded random sample)")
        require(self.testbed in TESTBEDS, f"{prefix}.testbed", self.testbed,
                f"one of {list(TESTBEDS)} (devices in data.testbed_groups known clusters; README section 2)")
        if self.testbed != "none":
            require(self.partition != "natural", f"{prefix}.testbed", self.testbed,
                    "deals the samples to devices itself, so it does not combine with data.partition=natural; use "
                    "partition iid, dirichlet, pathological or primary_secondary (the split inside each group)")
            limit = min(self.num_devices, MAX_GROUPS.get(self.testbed, self.num_devices))
            require(1 <= self.testbed_groups <= limit, f"{prefix}.testbed_groups", self.testbed_groups,
                    f"must be in [1, {limit}] (at most data.num_devices = {self.num_devices}"
                    + (f"; the {self.testbed} testbed has {MAX_GROUPS[self.testbed]} transformations)"
                       if self.testbed in MAX_GROUPS else ")"))


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

    def validate(self, prefix: str = "train") -> None:
        require(self.rounds >= 1, f"{prefix}.rounds", self.rounds, "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", self.lr, "must be > 0")
        require(self.batch_size >= 1, f"{prefix}.batch_size", self.batch_size, "must be >= 1")
        require(
            (self.local_steps is None) != (self.local_epochs is None),
            f"{prefix}.local_steps",
            self.local_steps,
            "set exactly one of train.local_steps and train.local_epochs (the other null)",
        )
        if self.local_steps is not None:
            require(self.local_steps >= 1, f"{prefix}.local_steps", self.local_steps, "must be >= 1")
        if self.local_epochs is not None:
            require(self.local_epochs >= 1, f"{prefix}.local_epochs", self.local_epochs, "must be >= 1")
        require(
            0 < self.participation <= 1, f"{prefix}.participation", self.participation, "must be in (0, 1]"
        )
        require(self.eval_every >= 1, f"{prefix}.eval_every", self.eval_every, "must be >= 1")
        require(self.eval_devices >= 0, f"{prefix}.eval_devices", self.eval_devices,
                "must be >= 0 (trained devices scored by an evaluation before the last round; 0 = every device)")


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

    def validate(self, prefix: str = "engine") -> None:
        require(self.kind in ("local", "ray"), f"{prefix}.kind", self.kind, "one of ['local', 'ray']")
        require(self.num_actors >= 0, f"{prefix}.num_actors", self.num_actors, "must be >= 0 (0 = one per CPU)")
        require(
            self.devices_per_actor >= 0,
            f"{prefix}.devices_per_actor",
            self.devices_per_actor,
            "must be >= 0 (0 = spread devices over the actors)",
        )
        require(self.cpus_per_actor > 0, f"{prefix}.cpus_per_actor", self.cpus_per_actor, "must be > 0")
        require(
            self.gpus_per_actor == -1 or 0 <= self.gpus_per_actor <= 1,
            f"{prefix}.gpus_per_actor",
            self.gpus_per_actor,
            "must be in [0, 1], or -1 for auto (1 / actors when GPUs exist, else 0)",
        )
        require(
            self.gpus == -1 or 0 <= self.gpus < math.inf,
            f"{prefix}.gpus",
            self.gpus,
            "must be >= 0 (GPUs the device actors ask for in all; state it so an autoscaler starts GPU workers), "
            "or -1 for auto (every GPU the cluster has now)",
        )
        require(self.actors_per_gpu >= 1, f"{prefix}.actors_per_gpu", self.actors_per_gpu,
                "must be >= 1 (device actors sharing one GPU)")
        require(
            0 < self.placement_timeout_s < math.inf,
            f"{prefix}.placement_timeout_s",
            self.placement_timeout_s,
            "must be > 0 seconds (how long to wait for the cluster to place the federation's actors)",
        )
        require(self.torch_threads >= 1, f"{prefix}.torch_threads", self.torch_threads, "must be >= 1")
        cpus, max_threads, memory_mb = machine_limits()
        require(self.torch_threads <= max_threads, f"{prefix}.torch_threads", self.torch_threads,
                f"must be <= {max_threads} ({THREADS_PER_CPU} x this machine's {cpus} CPUs)")
        require(
            self.workers >= 0,
            f"{prefix}.workers",
            self.workers,
            "must be >= 0 (threads training devices per host; 0 = one per CPU the host has, 1 on a GPU)",
        )
        require(
            self.vectorize in ("auto", "always", "never"),
            f"{prefix}.vectorize",
            self.vectorize,
            "one of ['auto', 'always', 'never'] (auto = vmap devices' steps when they train on a GPU)",
        )
        require(self.vectorize_max >= 1, f"{prefix}.vectorize_max", self.vectorize_max, "must be >= 1 (devices per vmapped call)")
        require(self.device in ("auto", "cpu", "cuda"), f"{prefix}.device", self.device, "one of ['auto', 'cpu', 'cuda']")
        require(self.num_cpus >= 0, f"{prefix}.num_cpus", self.num_cpus, "must be >= 0 (0 = all)")
        require(self.num_cpus <= max_threads, f"{prefix}.num_cpus", self.num_cpus,
                f"must be <= {max_threads} ({THREADS_PER_CPU} x this machine's {cpus} CPUs)")
        require(self.object_store_mb >= 64, f"{prefix}.object_store_mb", self.object_store_mb, "must be >= 64")
        require(self.object_store_mb <= memory_mb, f"{prefix}.object_store_mb", self.object_store_mb,
                f"must be <= {memory_mb} (this machine's memory in MB; Ray refuses more)")
        require(self.max_failures >= 0, f"{prefix}.max_failures", self.max_failures, "must be >= 0 (lost hosts tolerated per run)")
        require(0 <= self.state_memory_mb < math.inf, f"{prefix}.state_memory_mb", self.state_memory_mb,
                "must be >= 0 (MB of device states a host keeps in memory before spilling to disk; 0 = no limit)")
        require(self.numerics in PROFILES, f"{prefix}.numerics", self.numerics,
                f"one of {list(PROFILES)} (portable: CPU kernels pinned at AVX2, the same numbers on any x86-64; "
                "native: the CPU's own kernels, numbers tied to the CPU)")


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
        require(self.summary_evals >= 1, f"{prefix}.summary_evals", self.summary_evals,
                "must be >= 1 (the summary averages the last N evaluations)")
        require(0 <= self.end_wait_s <= 3600, f"{prefix}.end_wait_s", self.end_wait_s,
                "must be in [0, 3600] seconds (how long the end of a run waits for a tracking server that is gone "
                "before it saves the unsent metrics for `lcfed tracking replay`)")
        require(bool(self.experiment), f"{prefix}.experiment", self.experiment, "must be a non-empty name")
        parts = self.experiment.split("/")
        require(
            len(self.experiment) <= 256 and self.experiment.isprintable() and "\\" not in self.experiment
            and all(part not in ("", ".", "..") for part in parts),
            f"{prefix}.experiment",
            self.experiment,
            "must be a name of at most 256 printable characters; '/' may separate parts, but no part may be "
            "empty, '.' or '..' (the name becomes a directory of the artifact store) and no backslash",
        )
        if self.run_name is not None:
            require(0 < len(self.run_name) <= 250 and self.run_name.isprintable(), f"{prefix}.run_name",
                    self.run_name, "must be null (use the config's name) or 1-250 printable characters")
        if self.uri is not None:
            scheme = uri_scheme(self.uri)
            require(
                bool(self.uri.strip()) and (scheme == "" or scheme in TRACKING_SCHEMES),
                f"{prefix}.uri",
                self.uri,
                f"must be null ($MLFLOW_TRACKING_URI or ./mlflow.db) or a URI with scheme one of "
                f"{list(TRACKING_SCHEMES)}",
            )
            if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
                path = self.uri.split("://", 1)[-1]
                suggestion = f"sqlite:///{Path(path).expanduser().absolute()}" + ("" if path.endswith(".db") else "/mlflow.db")
                raise ConfigError(f"{prefix}.uri", self.uri,
                                  "is a local path: MLflow's file store, which MLflow no longer writes to (maintenance "
                                  f"mode): use a sqlite store such as {suggestion} or a tracking server "
                                  "http://HOST:PORT (`lcfed mlflow-server`); MLFLOW_ALLOW_FILE_STORE=true keeps "
                                  "the file store")


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
        self.method.validate(self)
        return self

    def digest(self) -> str:
        """Hash of what determines the numbers (not rounds, engine, tracking or checkpointing), so a
        checkpoint is only resumed by a config that would have produced it."""
        d = to_dict(self)
        for section in ("engine", "tracking", "checkpoint"):
            d.pop(section, None)
        d["train"] = {k: v for k, v in d["train"].items() if k not in ("rounds", "eval_every", "eval_devices")}
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
    "device_column": "device", "image_size": (), "user_selection": "largest", "testbed": "none", "testbed_groups": 4,
    "synthetic_samples": 0, "synthetic_alpha": 1.0, "synthetic_beta": 1.0, "synthetic_clusters": 0,
}}


def holdout_count(num_devices: int, fraction: float) -> int:
    """How many of ``num_devices`` devices ``data.holdout_fraction`` keeps out of training (halves up)."""
    return math.floor(num_devices * fraction + 0.5)


def drop_later_defaults(d: dict[str, Any]) -> None:
    """Remove (in place) from a :func:`to_dict`-shaped dict the :data:`LATER_DEFAULTS` at their value."""
    for section, defaults in LATER_DEFAULTS.items():
        values = d.get(section, {})
        for key, value in defaults.items():
            if key in values and values[key] == value:
                del values[key]


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
