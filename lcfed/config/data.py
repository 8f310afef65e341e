"""The ``data`` section: where the samples come from and how they are split across devices, and the rules its
fields follow (:func:`check_data`, which :meth:`DataConfig.validate` applies), each raising
:class:`~lcfed.errors.ConfigError` that names the field, the value and what is allowed.

The data package's own names (partition schemes, file formats, testbeds) are read when a config is checked,
not at import: :mod:`lcfed.data` imports torch, which reading a config does not need."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lcfed.config.engine import machine_limits
from lcfed.config.overrides import resolve
from lcfed.errors import require

__all__ = ["DataConfig", "MAX_ALPHA", "MAX_IMAGE_SIDE", "NORMALIZE", "SYNTHETIC_BYTES", "check_data", "holdout_count"]


NORMALIZE = ("standardize", "unit")
"""``data.normalize``: how uint8 pixels become model inputs."""


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
