"""What each config section's fields may hold: the rules :meth:`validate` of each section in
:mod:`lcfed.config` applies, each raising :class:`~lcfed.errors.ConfigError` that names the field, the
value and what is allowed.

The sections' fields and defaults stay together in :mod:`lcfed.config` (one schema to read, and one
place a field is added); the checks of the long sections (data, train, engine, tracking), most of that
file's length, are here, one function per section, in the order they report. The one- and two-line
checks of the other sections stay in their ``validate``. Nothing here imports :mod:`lcfed.config` at run
time (annotations only), so the config imports this.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from lcfed.config.overrides import resolve
from lcfed.engines import ENGINES
from lcfed.errors import ConfigError, require
from lcfed.numerics import PROFILES

if TYPE_CHECKING:  # annotations only: lcfed.config imports this module
    from lcfed.config import DataConfig, DevicesConfig, EngineConfig, TrackingConfig, TrainConfig

#: tracking-store URI schemes MLflow can log to
TRACKING_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")

#: CPU threads (``engine.torch_threads``, ``engine.num_cpus``) allowed per CPU of this machine: a few
#: times the cores only oversubscribes, far more makes torch's OpenMP run out of memory at the first kernel
THREADS_PER_CPU = 4

NORMALIZE = ("standardize", "unit")
"""``data.normalize``: how uint8 pixels become model inputs."""


def uri_scheme(uri: str) -> str:
    """The URI's scheme, lower-case and without a driver (``postgresql+psycopg2://`` -> ``postgresql``);
    ``""`` for a plain path."""
    return uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""


def machine_limits() -> tuple[int, int, int]:
    """(this machine's CPUs, the most CPU threads a field may ask for, its memory in MB)."""
    cpus = os.cpu_count() or 1
    return cpus, THREADS_PER_CPU * cpus, psutil.virtual_memory().total // 2**20


#: bytes one generated sample takes as stored: synthetic's 1x28x28 uint8 image and int64 label; leaf_synthetic's 60
#: float32 features and int64 label, device id and group
SYNTHETIC_BYTES = {"synthetic": 784 + 8, "leaf_synthetic": 60 * 4 + 3 * 8}


#: ``data.alpha``'s largest: Dir(alpha) is IID long before (alpha ~ 100), and numpy's draw overflows to nan near
#: 1e308, which the multinomial refused with a traceback
MAX_ALPHA = 1e6

#: ``data.image_size``: the largest side an image is resized to (every sample is held resized in memory: 40
#: images at 100,000 x 100,000 pixels are 373 GB, which numpy's allocator refused with a traceback)
MAX_IMAGE_SIDE = 4096


def holdout_count(num_devices: int, fraction: float) -> int:
    """How many of ``num_devices`` devices ``data.holdout_fraction`` keeps out of training (halves up)."""
    return math.floor(num_devices * fraction + 0.5)


def check_data(data: DataConfig, prefix: str = "data") -> None:
    """``data.*``: the source, the partition's parameters, the held-out shares, file datasets and testbeds."""
    # imported here: lcfed.data imports torch (seconds), which reading and checking a config does not need
    from lcfed.data import partition_schemes

    resolve("dataset", f"{prefix}.dataset", data.dataset)
    require(
        data.partition in partition_schemes(),
        f"{prefix}.partition",
        data.partition,
        f"one of {partition_schemes()}",
    )
    _check_counts(data, prefix)
    _check_mix(data, prefix)
    _check_held_out(data, prefix)
    _check_sources(data, prefix)
    if data.partition == "dirichlet":  # other schemes' device sizes are checked against the data
        require(
            data.min_test_samples < data.min_samples,
            f"{prefix}.min_test_samples",
            data.min_test_samples,
            f"must be < data.min_samples ({data.min_samples}), or the smallest devices keep no training sample: "
            f"raise data.min_samples to at least {data.min_test_samples + 1} or lower the floor",
        )


def _check_counts(data: DataConfig, prefix: str) -> None:
    """The partition's sizes: concentration, classes, devices, samples, test share, subset and quantity skew."""
    require(0 < data.alpha <= MAX_ALPHA, f"{prefix}.alpha", data.alpha,
            f"must be > 0 and <= {MAX_ALPHA:g} (the Dirichlet concentration; from about 100 on the split is IID: "
            "data.partition=iid)")
    require(data.classes_per_device >= 1, f"{prefix}.classes_per_device", data.classes_per_device, "must be >= 1")
    require(data.num_devices >= 1, f"{prefix}.num_devices", data.num_devices, "must be >= 1")
    require(data.min_samples >= 2, f"{prefix}.min_samples", data.min_samples, "must be >= 2 (one train, one test)")
    require(
        0 < data.test_fraction < 1, f"{prefix}.test_fraction", data.test_fraction, "must be in (0, 1)"
    )
    require(data.subset >= 0, f"{prefix}.subset", data.subset, "must be >= 0 (0 = every sample)")
    _check_generated(data, prefix)
    q = data.samples_per_device
    require(
        q == () or (len(q) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in q)
                    and data.min_samples <= q[0] <= q[1]),
        f"{prefix}.samples_per_device",
        list(q),
        f"must be [] (no quantity skew) or [low, high] integers with min_samples ({data.min_samples}) <= low <= high",
    )


def _check_generated(data: DataConfig, prefix: str) -> None:
    """The generators' fields: ``synthetic``'s sample count, ``leaf_synthetic``'s (docs/data.md)."""
    generated = data.dataset == "leaf_synthetic"
    require(data.synthetic_samples >= 0 and (data.synthetic_samples == 0 or data.dataset == "synthetic" or generated),
            f"{prefix}.synthetic_samples", data.synthetic_samples,
            "must be >= 0, and 0 unless data.dataset is synthetic or leaf_synthetic (samples to generate; 0 = "
            "synthetic's 60,000, or 40 per device)")
    samples = data.synthetic_samples
    if generated:
        from lcfed.data.generated import DEFAULT_PER_DEVICE  # (lcfed.data: as in check_data)

        require(data.partition == "natural", f"{prefix}.partition", data.partition,
                "must be natural with data.dataset=leaf_synthetic, which generates each device's samples itself")
        require(data.synthetic_samples == 0 or data.synthetic_samples >= data.num_devices * data.min_samples,
                f"{prefix}.synthetic_samples", data.synthetic_samples,
                f"must be 0 (40 per device) or >= num_devices x min_samples ({data.num_devices} x {data.min_samples})")
        require(data.synthetic_samples > 0 or data.min_samples <= DEFAULT_PER_DEVICE, f"{prefix}.min_samples",
                data.min_samples, f"must be <= {DEFAULT_PER_DEVICE} with data.dataset=leaf_synthetic and "
                f"data.synthetic_samples=0 ({DEFAULT_PER_DEVICE} samples per device): lower it, or set "
                "data.synthetic_samples >= num_devices x min_samples")
        samples = samples or DEFAULT_PER_DEVICE * data.num_devices
    if samples:  # checked before numpy's allocator fails deep in the generator (or swaps for hours)
        per_sample = SYNTHETIC_BYTES["leaf_synthetic" if generated else "synthetic"]
        need_mb = samples * per_sample / 2**20
        memory_mb = machine_limits()[2]
        field, value = ("synthetic_samples", data.synthetic_samples) if data.synthetic_samples else (
            "num_devices", data.num_devices)
        require(need_mb <= memory_mb, f"{prefix}.{field}", value,
                f"must fit this machine's memory: {samples:,} samples of {per_sample} bytes"
                + ("" if data.synthetic_samples else f" ({DEFAULT_PER_DEVICE} per device)")
                + f" are {need_mb / 1024:,.1f} GB, and it has {memory_mb / 1024:,.1f} GB")
    for name, default in (("synthetic_alpha", 1.0), ("synthetic_beta", 1.0), ("synthetic_clusters", 0)):
        value = getattr(data, name)
        require(value == default or generated, f"{prefix}.{name}", value,
                f"is read only by data.dataset=leaf_synthetic (data.dataset is {data.dataset!r})")
    for name in ("synthetic_alpha", "synthetic_beta"):
        value = getattr(data, name)
        require(math.isfinite(value) and value >= 0, f"{prefix}.{name}", value,
                "must be a finite number >= 0 (the standard deviation of the devices' "
                + ("model means)" if name == "synthetic_alpha" else "input means)"))
    require(0 <= data.synthetic_clusters <= data.num_devices, f"{prefix}.synthetic_clusters", data.synthetic_clusters,
            f"must be in [0, num_devices = {data.num_devices}] (0: a model per device; G: G known clusters)")


def _check_mix(data: DataConfig, prefix: str) -> None:
    """The label mixes (primary/secondary), the Dirichlet convention and the input scaling."""
    from lcfed.data import DIRICHLET_CONVENTIONS  # (as in check_data)

    for name in ("primary", "secondary"):
        r = getattr(data, name)
        require(
            len(r) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r) and 0 <= r[0] <= r[1] <= 1,
            f"{prefix}.{name}",
            list(r),
            "must be [low, high] fractions with 0 <= low <= high <= 1",
        )
    require(
        data.primary[1] + data.secondary[1] <= 1,
        f"{prefix}.secondary",
        list(data.secondary),
        f"max primary ({data.primary[1]}) + max secondary must be <= 1",
    )
    require(
        data.dirichlet_convention in DIRICHLET_CONVENTIONS,
        f"{prefix}.dirichlet_convention",
        data.dirichlet_convention,
        f"one of {sorted(DIRICHLET_CONVENTIONS)} (how partition=dirichlet meets min_samples; docs/data.md)",
    )
    require(
        data.normalize in NORMALIZE,
        f"{prefix}.normalize",
        data.normalize,
        f"one of {list(NORMALIZE)} (per-channel mean/std of the devices' training samples, or plain [0, 1])",
    )


def _check_held_out(data: DataConfig, prefix: str) -> None:
    """The test floor and what is held out of training: validation samples and whole devices."""
    require(data.min_test_samples >= 0, f"{prefix}.min_test_samples", data.min_test_samples,
            "must be >= 0 (0 = no floor on a device's test set)")
    require(0 <= data.val_fraction < 1, f"{prefix}.val_fraction", data.val_fraction,
            "must be in [0, 1): the share of each device's training samples held out for validation (0 = off)")
    require(0 <= data.holdout_fraction < 1, f"{prefix}.holdout_fraction", data.holdout_fraction,
            "must be in [0, 1): the share of devices kept out of training, scored as newcomers at the end (0 = off)")
    held = holdout_count(data.num_devices, data.holdout_fraction)
    require(held < data.num_devices, f"{prefix}.holdout_fraction", data.holdout_fraction,
            f"would hold out all {data.num_devices} devices (data.num_devices): at least one must train")
    require(data.holdout_fraction == 0 or held >= 1, f"{prefix}.holdout_fraction", data.holdout_fraction,
            f"holds out no device of {data.num_devices} (rounds to 0): use at least {0.5 / data.num_devices:.4g}, or 0 for off")


def _check_sources(data: DataConfig, prefix: str) -> None:
    """The fields of file datasets, natural partitions and testbeds (docs/data.md)."""
    from lcfed.data import FILE_FORMATS, TESTBEDS, USER_SELECTIONS  # (as in check_data)
    from lcfed.data.testbeds import MAX_GROUPS  # (the same)

    if data.dataset == "file":
        require(bool(data.path.strip()), f"{prefix}.path", data.path,
                "data.dataset=file reads the file or folder data.path names: set it (an .npz, .csv or .parquet "
                "file, or an ImageFolder directory; a relative path lies under data.data_dir)")
    else:
        require(data.path == "", f"{prefix}.path", data.path,
                f"is read only by data.dataset=file (data.dataset is {data.dataset!r}): set data.dataset=file, "
                "or leave data.path empty")
    require(data.format in FILE_FORMATS, f"{prefix}.format", data.format,
            f"one of {list(FILE_FORMATS)} (auto: by data.path's extension; a directory is an ImageFolder)")
    for name in ("label_column", "device_column"):
        require(bool(getattr(data, name).strip()), f"{prefix}.{name}", getattr(data, name), "must be a column name")
    require(data.label_column != data.device_column, f"{prefix}.device_column", data.device_column,
            "must differ from data.label_column")
    if data.group_column:
        require(bool(data.group_column.strip()), f"{prefix}.group_column", data.group_column,
                'must be a column name (or "" for none)')
        require(data.dataset == "file", f"{prefix}.group_column", data.group_column,
                f"is read only by data.dataset=file (data.dataset is {data.dataset!r}): leave it empty")
        require(data.group_column.strip() not in (data.label_column, data.device_column), f"{prefix}.group_column",
                data.group_column, "must differ from data.label_column and data.device_column")
        require(data.testbed == "none", f"{prefix}.group_column", data.group_column,
                "names the file's true groups, and a data.testbed makes groups of its own: use one or the other")
    require(data.image_size == () or (len(data.image_size) == 2 and all(1 <= v <= MAX_IMAGE_SIDE for v in data.image_size)),
            f"{prefix}.image_size", list(data.image_size),
            f"must be [] (the images' own size) or [height, width] in pixels, each 1-{MAX_IMAGE_SIDE}, e.g. [28, 28]")
    if data.image_size:
        require(data.dataset == "file", f"{prefix}.image_size", list(data.image_size),
                f"resizes the images of data.dataset=file only (data.dataset is {data.dataset!r}): leave it []")
    require(data.user_selection in USER_SELECTIONS, f"{prefix}.user_selection", data.user_selection,
            f"one of {list(USER_SELECTIONS)} (which users partition=natural keeps: the num_devices largest, or a "
            "seeded random sample)")
    require(data.testbed in TESTBEDS, f"{prefix}.testbed", data.testbed,
            f"one of {list(TESTBEDS)} (devices in data.testbed_groups known clusters; docs/data.md)")
    if data.testbed != "none":
        require(data.partition != "natural", f"{prefix}.testbed", data.testbed,
                "deals the samples to devices itself, so it does not combine with data.partition=natural; use "
                "partition iid, dirichlet, pathological or primary_secondary (the split inside each group)")
        limit = min(data.num_devices, MAX_GROUPS.get(data.testbed, data.num_devices))
        require(1 <= data.testbed_groups <= limit, f"{prefix}.testbed_groups", data.testbed_groups,
                f"must be in [1, {limit}] (at most data.num_devices = {data.num_devices}"
                + (f"; the {data.testbed} testbed has {MAX_GROUPS[data.testbed]} transformations)"
                   if data.testbed in MAX_GROUPS else ")"))


# Work that never ends: the budget's upper bounds. A run stops cleanly only between rounds (a signal
# finishes the round it is in, checkpoints and exits; the progress and its ETA move a round at a time), so the
# work inside one round is bounded, not estimated: a typo such as local_steps=10000000 would run for days with
# no progress line and no clean stop. The rounds are bounded too, though each shows its progress and can be
# stopped: every round adds a history row and its MLflow points, and no schedule in the literature comes near.
#: ``train.rounds``: 100x the longest schedules (FedAvg-style runs of 1,000-2,000 rounds)
MAX_ROUNDS = 100_000
#: ``train.local_steps``: minibatches a device trains each round (the papers' are 1-500; 100,000 lenet5 steps
#: are minutes per device, hours per round for a federation)
MAX_LOCAL_STEPS = 100_000
#: ``train.local_epochs``: full passes over a device's samples each round (the papers' are 1-50)
MAX_LOCAL_EPOCHS = 1_000


def check_train(train: TrainConfig, prefix: str = "train") -> None:
    """``train.*``: the budget every method shares."""
    require(1 <= train.rounds <= MAX_ROUNDS, f"{prefix}.rounds", train.rounds,
            f"must be >= 1 and <= {MAX_ROUNDS:,} (rounds of the run)")
    require(train.lr > 0, f"{prefix}.lr", train.lr, "must be > 0")
    require(train.batch_size >= 1, f"{prefix}.batch_size", train.batch_size, "must be >= 1")
    require(
        (train.local_steps is None) != (train.local_epochs is None),
        f"{prefix}.local_steps",
        train.local_steps,
        "set exactly one of train.local_steps and train.local_epochs (the other null)",
    )
    if train.local_steps is not None:
        require(1 <= train.local_steps <= MAX_LOCAL_STEPS, f"{prefix}.local_steps", train.local_steps,
                f"must be >= 1 and <= {MAX_LOCAL_STEPS:,} (minibatches per device per round; a run stops only "
                "between rounds)")
    if train.local_epochs is not None:
        require(1 <= train.local_epochs <= MAX_LOCAL_EPOCHS, f"{prefix}.local_epochs", train.local_epochs,
                f"must be >= 1 and <= {MAX_LOCAL_EPOCHS:,} (passes over each device's samples per round; a run "
                "stops only between rounds)")
    require(
        0 < train.participation <= 1, f"{prefix}.participation", train.participation, "must be in (0, 1]"
    )
    require(train.eval_every >= 1, f"{prefix}.eval_every", train.eval_every, "must be >= 1")
    require(train.eval_devices >= 0, f"{prefix}.eval_devices", train.eval_devices,
            "must be >= 0 (trained devices scored by an evaluation before the last round; 0 = every device)")
    require(train.final_eval_devices >= -1, f"{prefix}.final_eval_devices", train.final_eval_devices,
            "must be -1 (auto: every device up to 10,000, a seeded sample of 10,000 above), 0 (every device) "
            "or N >= 1 (a seeded sample of N trained devices)")


#: ``devices.availability``: every device always online, a daily window, i.i.d. on/off slots, or a trace file
AVAILABILITY = ("always", "diurnal", "iid", "trace")
#: ``devices.phase``: a diurnal window's start per device
PHASES = ("random", "groups")
#: ``devices.aggregation``: rounds that wait (deadline, over-commitment) or FedBuff's buffered asynchrony
AGGREGATION = ("sync", "async")
#: ``devices.staleness``: how much an update ``s`` server versions old counts
STALENESS = ("sqrt", "constant")
#: ``devices.trace_format``
TRACE_FORMATS = ("auto", "json", "csv", "parquet", "pickle")


def check_devices(dev: DevicesConfig, prefix: str = "devices") -> None:
    """``devices.*``: the device model's distributions and the round's policies; each finite, in range, and
    set only with ``devices.simulate: true``."""
    require(isinstance(dev.simulate, bool), f"{prefix}.simulate", dev.simulate, "true or false")
    if not dev.simulate:
        for f in dataclasses.fields(dev):
            value = getattr(dev, f.name)
            require(f.name == "simulate" or value == f.default, f"{prefix}.{f.name}", value,
                    f"only with {prefix}.simulate: true (the device model is off)")
        return
    for name in ("speed_sigma", "bandwidth_sigma", "latency_ms", "deadline_seconds", "overcommit"):
        value = getattr(dev, name)
        require(math.isfinite(value) and value >= 0, f"{prefix}.{name}", value, "must be a finite number >= 0")
    require(dev.availability in AVAILABILITY, f"{prefix}.availability", dev.availability, f"one of {list(AVAILABILITY)}")
    require(math.isfinite(dev.online_fraction) and 0 < dev.online_fraction <= 1, f"{prefix}.online_fraction",
            dev.online_fraction, "must be in (0, 1]")
    require(math.isfinite(dev.period_hours) and dev.period_hours > 0, f"{prefix}.period_hours", dev.period_hours,
            "must be > 0")
    require(math.isfinite(dev.slot_minutes) and dev.slot_minutes > 0, f"{prefix}.slot_minutes", dev.slot_minutes,
            "must be > 0")
    if dev.availability == "iid":
        slots = dev.period_hours * 60 / dev.slot_minutes
        require(abs(slots - round(slots)) < 1e-9, f"{prefix}.slot_minutes", dev.slot_minutes,
                f"must divide {prefix}.period_hours ({dev.period_hours} h) into whole slots")
    require(dev.phase in PHASES, f"{prefix}.phase", dev.phase, f"one of {list(PHASES)}")
    require(math.isfinite(dev.phase_jitter) and 0 <= dev.phase_jitter < 1, f"{prefix}.phase_jitter",
            dev.phase_jitter, "must be in [0, 1) (a share of the period)")
    require(math.isfinite(dev.dropout) and 0 <= dev.dropout < 1, f"{prefix}.dropout", dev.dropout, "must be in [0, 1)")
    require(dev.trace_format in TRACE_FORMATS, f"{prefix}.trace_format", dev.trace_format,
            f"one of {list(TRACE_FORMATS)}")
    require((dev.availability == "trace") == bool(dev.availability_trace), f"{prefix}.availability_trace",
            dev.availability_trace, f"a file exactly when {prefix}.availability is trace")
    for name in ("capacity_trace", "availability_trace"):
        path = getattr(dev, name)
        require(not path or Path(path).expanduser().is_file(), f"{prefix}.{name}", path, "an existing file")
    require(math.isfinite(dev.target_acc) and 0 <= dev.target_acc <= 1, f"{prefix}.target_acc", dev.target_acc,
            "an accuracy in [0, 1] (0: no time to target)")
    require(dev.aggregation in AGGREGATION, f"{prefix}.aggregation", dev.aggregation, f"one of {list(AGGREGATION)}")
    require(dev.staleness in STALENESS, f"{prefix}.staleness", dev.staleness, f"one of {list(STALENESS)}")
    if dev.aggregation == "async":
        require(dev.async_buffer >= 1, f"{prefix}.async_buffer", dev.async_buffer,
                "must be >= 1 with aggregation: async (the arrivals each aggregation takes)")
        require(dev.deadline_seconds == 0, f"{prefix}.deadline_seconds", dev.deadline_seconds,
                "only with aggregation: sync (an asynchronous server has no rounds to close)")
        require(dev.overcommit == 0, f"{prefix}.overcommit", dev.overcommit,
                "only with aggregation: sync (an asynchronous server keeps every arrival)")
    else:
        require(dev.async_buffer == 0, f"{prefix}.async_buffer", dev.async_buffer, "only with aggregation: async")


def check_engine(engine: EngineConfig, prefix: str = "engine") -> None:
    """``engine.*``: the actor pool's resources, then each host's threads, memory and numerics."""
    require(engine.kind in ENGINES, f"{prefix}.kind", engine.kind, f"one of {list(ENGINES)}")
    require(engine.num_actors >= 0, f"{prefix}.num_actors", engine.num_actors, "must be >= 0 (0 = one per CPU)")
    require(
        engine.devices_per_actor >= 0,
        f"{prefix}.devices_per_actor",
        engine.devices_per_actor,
        "must be >= 0 (0 = spread devices over the actors)",
    )
    require(engine.cpus_per_actor > 0, f"{prefix}.cpus_per_actor", engine.cpus_per_actor, "must be > 0")
    require(
        engine.gpus_per_actor == -1 or 0 <= engine.gpus_per_actor <= 1,
        f"{prefix}.gpus_per_actor",
        engine.gpus_per_actor,
        "must be in [0, 1], or -1 for auto (1 / actors when GPUs exist, else 0)",
    )
    require(
        engine.gpus == -1 or 0 <= engine.gpus < math.inf,
        f"{prefix}.gpus",
        engine.gpus,
        "must be >= 0 (GPUs the device actors ask for in all; state it so an autoscaler starts GPU workers), "
        "or -1 for auto (every GPU the cluster has now)",
    )
    require(engine.actors_per_gpu >= 1, f"{prefix}.actors_per_gpu", engine.actors_per_gpu,
            "must be >= 1 (device actors sharing one GPU)")
    require(
        0 < engine.placement_timeout_s <= PLACEMENT_TIMEOUT_MAX_S,
        f"{prefix}.placement_timeout_s",
        engine.placement_timeout_s,
        f"must be > 0 and <= {PLACEMENT_TIMEOUT_MAX_S:,} seconds (a day: how long to wait for the cluster to place "
        "the federation's actors, e.g. while an autoscaler starts nodes)",
    )
    _check_host(engine, prefix)


def _check_host(engine: EngineConfig, prefix: str) -> None:
    """Threads, CPUs and memory against this machine's, failures tolerated, spilling and numerics."""
    require(engine.torch_threads >= 1, f"{prefix}.torch_threads", engine.torch_threads, "must be >= 1")
    cpus, max_threads, memory_mb = machine_limits()
    require(engine.torch_threads <= max_threads, f"{prefix}.torch_threads", engine.torch_threads,
            f"must be <= {max_threads} ({THREADS_PER_CPU} x this machine's {cpus} CPUs)")
    require(
        engine.workers >= 0,
        f"{prefix}.workers",
        engine.workers,
        "must be >= 0 (threads training devices per host; 0 = one per CPU the host has, 1 on a GPU)",
    )
    require(
        engine.vectorize in ("auto", "always", "never"),
        f"{prefix}.vectorize",
        engine.vectorize,
        "one of ['auto', 'always', 'never'] (auto = vmap devices' steps when they train on a GPU)",
    )
    require(engine.vectorize_max >= 1, f"{prefix}.vectorize_max", engine.vectorize_max, "must be >= 1 (devices per vmapped call)")
    require(engine.device in ("auto", "cpu", "cuda"), f"{prefix}.device", engine.device, "one of ['auto', 'cpu', 'cuda']")
    require(engine.num_cpus >= 0, f"{prefix}.num_cpus", engine.num_cpus, "must be >= 0 (0 = all)")
    require(engine.num_cpus <= max_threads, f"{prefix}.num_cpus", engine.num_cpus,
            f"must be <= {max_threads} ({THREADS_PER_CPU} x this machine's {cpus} CPUs)")
    require(engine.object_store_mb >= 64, f"{prefix}.object_store_mb", engine.object_store_mb, "must be >= 64")
    require(engine.object_store_mb <= memory_mb, f"{prefix}.object_store_mb", engine.object_store_mb,
            f"must be <= {memory_mb} (this machine's memory in MB; Ray refuses more)")
    require(engine.max_failures >= 0, f"{prefix}.max_failures", engine.max_failures, "must be >= 0 (lost hosts tolerated per run)")
    require(0 <= engine.state_memory_mb < math.inf, f"{prefix}.state_memory_mb", engine.state_memory_mb,
            "must be >= 0 (MB of device states a host keeps in memory before spilling to disk; 0 = no limit)")
    require(not engine.spill_dir or engine.state_memory_mb > 0, f"{prefix}.spill_dir", engine.spill_dir,
            "is where device states spill past engine.state_memory_mb, which is 0 (no limit: nothing spills); set "
            "engine.state_memory_mb, or leave engine.spill_dir empty")
    require(engine.numerics in PROFILES, f"{prefix}.numerics", engine.numerics,
            f"one of {list(PROFILES)} (portable: CPU kernels pinned, the same numbers on any x86-64, Intel or AMD; "
            "native: the CPU's own kernels, numbers tied to the CPU)")
    require(engine.data_reads in DATA_READS, f"{prefix}.data_reads", engine.data_reads,
            f"one of {list(DATA_READS)} (who reads a cached dataset's samples on Ray: auto = each device actor "
            "where every node sees the driver's cache file, else the driver; nodes = each device actor, from "
            "storage every node reaches; driver = the driver, which sends them)")


#: the longest engine.placement_timeout_s (Ray's waits take a C long of milliseconds)
PLACEMENT_TIMEOUT_MAX_S = 86_400

#: engine.data_reads: who reads a dataset's samples from its cache file on Ray
DATA_READS = ("auto", "nodes", "driver")


def check_tracking(tracking: TrackingConfig, prefix: str = "tracking") -> None:
    """``tracking.*``: the summary, the end-of-run wait, the experiment and run names, the store's URI."""
    require(tracking.summary_evals >= 1, f"{prefix}.summary_evals", tracking.summary_evals,
            "must be >= 1 (the summary averages the last N evaluations)")
    require(0 <= tracking.end_wait_s <= 3600, f"{prefix}.end_wait_s", tracking.end_wait_s,
            "must be in [0, 3600] seconds (how long the end of a run waits for a tracking server that is gone "
            "before it saves the unsent metrics for `lcfed tracking replay`)")
    require(bool(tracking.experiment), f"{prefix}.experiment", tracking.experiment, "must be a non-empty name")
    parts = tracking.experiment.split("/")
    require(
        len(tracking.experiment) <= 256 and tracking.experiment.isprintable() and "\\" not in tracking.experiment
        and all(part not in ("", ".", "..") for part in parts),
        f"{prefix}.experiment",
        tracking.experiment,
        "must be a name of at most 256 printable characters; '/' may separate parts, but no part may be "
        "empty, '.' or '..' (the name becomes a directory of the artifact store) and no backslash",
    )
    if tracking.run_name is not None:
        require(0 < len(tracking.run_name) <= 250 and tracking.run_name.isprintable(), f"{prefix}.run_name",
                tracking.run_name, "must be null (use the config's name) or 1-250 printable characters")
    if tracking.uri is not None:
        scheme = uri_scheme(tracking.uri)
        require(
            bool(tracking.uri.strip()) and (scheme == "" or scheme in TRACKING_SCHEMES),
            f"{prefix}.uri",
            tracking.uri,
            f"must be null ($MLFLOW_TRACKING_URI or ./mlflow.db) or a URI with scheme one of "
            f"{list(TRACKING_SCHEMES)}",
        )
        if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
            path = tracking.uri.split("://", 1)[-1]
            suggestion = f"sqlite:///{Path(path).expanduser().absolute()}" + ("" if path.endswith(".db") else "/mlflow.db")
            raise ConfigError(f"{prefix}.uri", tracking.uri,
                              "is a local path: MLflow's file store, which MLflow no longer writes to (maintenance "
                              f"mode): use a sqlite store such as {suggestion} or a tracking server "
                              "http://HOST:PORT (`lcfed mlflow-server`); MLFLOW_ALLOW_FILE_STORE=true keeps "
                              "the file store")
