"""Datasets as plain arrays (uint8 images or float32 feature vectors), loaded by name from an
explicit registry.

Every dataset is the union of its train and test pools (train first): the partitioner later
splits each device's samples into local train/test sets, so the original split carries no meaning.

Decoding a torchvision dataset takes seconds (importing torchvision alone ~1.5 s), and every
process that hosts devices loads it, so the decoded arrays are cached next to the files
(``DATA_DIR/.lcfed-cache/<name>/``) and memory-mapped afterwards: a host then reads only the pages
of its own devices' samples. The cache is keyed by the source files' names, sizes and mtimes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lcfed.data.cache import file_version, write_arrays
from lcfed.data.dataset import CACHE_DIR, DataError, Dataset, _stamp
from lcfed.data.formats import FileSource, load_file
from lcfed.data.generated import GENERATED, leaf_synthetic

__all__ = ["SOURCES", "Scaling", "load_dataset", "to_float"]

def feature_sums(x: np.ndarray, chunks: Iterable[np.ndarray]) -> list[np.ndarray]:
    """Each chunk's per-feature sum in float64, of rows ``chunk`` of ``x``."""
    return [np.asarray(x[c], dtype=np.float64).sum(axis=0) for c in chunks]


def feature_spreads(x: np.ndarray, chunks: Iterable[np.ndarray], mean: np.ndarray) -> list[np.ndarray]:
    """Each chunk's per-feature sum of squared deviations from ``mean``, in float64 (as :func:`feature_sums`)."""
    return [((np.asarray(x[c], dtype=np.float64) - mean) ** 2).sum(axis=0) for c in chunks]


def to_float(x: np.ndarray) -> torch.Tensor:
    """uint8 images -> float32 tensor in [0, 1] (a fresh copy, so the dataset stays untouched)."""
    if x.dtype != np.uint8:
        raise TypeError(f"to_float expects uint8 images, got {x.dtype}")
    return torch.from_numpy(x.astype(np.float32)).div_(255.0)


#: rows :meth:`Scaling.fit` sums at a time (its chunks decide the sums' bits)
SCALING_CHUNK = 8192


@dataclass(frozen=True)
class Scaling:
    """How uint8 pixels become model inputs: ``(x / 255 - mean[c]) / std[c]`` per channel ``c``; for
    float32 feature vectors, ``(x - mean[f]) / std[f]`` per feature ``f`` (scikit-learn's StandardScaler).

    Standardizing each channel with the training samples' mean and std is the usual practice
    (torchvision's examples, most FL benchmarks); plain [0, 1] inputs train measurably worse.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def unit(cls, channels: int) -> Scaling:
        """Plain [0, 1] inputs."""
        return cls((0.0,) * channels, (1.0,) * channels)

    @classmethod
    def fit(cls, x: np.ndarray, rows: np.ndarray, chunk: int = SCALING_CHUNK) -> Scaling:
        """Per-channel mean and std (population) of ``x[rows]`` in [0, 1] units, exact: from
        histograms of the uint8 values, in chunks so a memory-mapped dataset is never copied whole.
        A constant channel gets std 1 (nothing to scale). Feature vectors (float32 (N, F)): the
        per-feature mean and std, in float64 (see :meth:`_fit_features`)."""
        if x.dtype != np.uint8:
            return cls._fit_features(x, rows, chunk)
        return cls.from_counts(cls.pixel_counts(x, rows, chunk))

    @staticmethod
    def pixel_counts(x: np.ndarray, rows: np.ndarray, chunk: int = SCALING_CHUNK) -> np.ndarray:
        """(channels, 256) int64: how often each uint8 value occurs in each channel of ``x[rows]``. Exact, so
        hosts holding parts of the rows add theirs up to the same counts, in any order."""
        channels = x.shape[1]
        counts = np.zeros((channels, 256), dtype=np.int64)
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        for start in range(0, len(rows), chunk):
            block = np.asarray(x[rows[start:start + chunk]])
            for c in range(channels):
                counts[c] += np.bincount(block[:, c].ravel(), minlength=256)
        return counts

    @classmethod
    def from_counts(cls, counts: np.ndarray) -> Scaling:
        """The scaling of images from their :meth:`pixel_counts`."""
        channels = len(counts)
        if counts.sum() == 0:
            return cls.unit(channels)
        values = np.arange(256, dtype=np.float64) / 255.0
        n = counts.sum(axis=1).astype(np.float64)
        mean = counts @ values / n
        var = counts @ values**2 / n - mean**2
        std = np.sqrt(np.clip(var, 0.0, None))
        std[std < 1e-6] = 1.0
        return cls(tuple(float(v) for v in mean), tuple(float(v) for v in std))

    @classmethod
    def _fit_features(cls, x: np.ndarray, rows: np.ndarray, chunk: int) -> Scaling:
        """Per-feature mean and (population) std of ``x[rows]``, two passes in float64, in chunks."""
        chunks = cls.feature_chunks(rows, chunk)
        if not chunks:
            return cls.unit(x.shape[1])
        mean = cls.mean_of(feature_sums(x, chunks), len(rows))
        return cls.from_spreads(mean, feature_spreads(x, chunks, mean), len(rows))

    @staticmethod
    def feature_chunks(rows: np.ndarray, chunk: int = SCALING_CHUNK) -> list[np.ndarray]:
        """``rows`` sorted and cut into the chunks :meth:`fit` sums one at a time (a host holding some of
        the rows sums its chunks with :func:`feature_sums`, and the sums add up to the same bits)."""
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        return [rows[start:start + chunk] for start in range(0, len(rows), chunk)]

    @staticmethod
    def mean_of(chunk_sums: Iterable[np.ndarray], n: int) -> np.ndarray:
        """The mean from the chunks' sums, added in the chunks' order."""
        sums = list(chunk_sums)
        total = np.zeros(len(sums[0]))
        for s in sums:
            total += s
        return total / n

    @classmethod
    def from_spreads(cls, mean: np.ndarray, chunk_spreads: Iterable[np.ndarray], n: int) -> Scaling:
        """The scaling from the mean and the chunks' squared deviations, added in the chunks' order."""
        spread = np.zeros(len(mean))
        for s in chunk_spreads:
            spread += s
        std = np.sqrt(spread / n)
        std[std < 1e-6] = 1.0
        return cls(tuple(float(v) for v in mean), tuple(float(v) for v in std))

    def apply(self, x: np.ndarray) -> torch.Tensor:
        """uint8 images (N, C, H, W) or float32 features (N, F) -> float32 model inputs (a fresh tensor)."""
        if x.dtype != np.uint8:
            return self._apply_features(x)
        t = to_float(x)
        if len(self.mean) != t.shape[1]:
            raise ValueError(f"scaling has {len(self.mean)} channels, images have {t.shape[1]}")
        if any(self.mean) or any(s != 1.0 for s in self.std):
            shape = (1, -1, 1, 1)
            t.sub_(torch.tensor(self.mean, dtype=t.dtype).view(shape)).div_(torch.tensor(self.std, dtype=t.dtype).view(shape))
        return t

    def _apply_features(self, x: np.ndarray) -> torch.Tensor:
        if x.ndim != 2 or x.dtype != np.float32:
            raise TypeError(f"scaling expects uint8 images or float32 features (N, F), got {x.dtype} {x.shape}")
        t = torch.from_numpy(np.array(x, dtype=np.float32, copy=True))
        if len(self.mean) != t.shape[1]:
            raise ValueError(f"scaling has {len(self.mean)} features, the samples have {t.shape[1]}")
        if any(self.mean) or any(s != 1.0 for s in self.std):
            t.sub_(torch.tensor(self.mean, dtype=t.dtype)).div_(torch.tensor(self.std, dtype=t.dtype))
        return t


@lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's embedded 8x8 digits, upsampled to 1x28x28 so MNIST models fit unchanged."""
    from sklearn.datasets import load_digits  # scikit-learn's datasets only for digits

    bunch = load_digits()
    small = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32) * (255.0 / 16.0))
    big = torch.nn.functional.interpolate(small.unsqueeze(1), size=(28, 28), mode="bilinear", align_corners=False)
    x = big.round().clamp_(0, 255).to(torch.uint8).numpy()
    y = np.asarray(bunch.target, dtype=np.int64)
    return x, y


def _load_digits(data_dir: Path, download: bool) -> Dataset:
    """1797 samples, 10 classes; needs no files (``data_dir``/``download`` are ignored)."""
    x, y = _digits_arrays()
    # Copies keep the cached arrays safe from callers that write into theirs.
    return Dataset("digits", x.copy(), y.copy(), 10)


@lru_cache(maxsize=1)
def _synthetic_arrays() -> tuple[np.ndarray, np.ndarray]:
    """60,000 MNIST-shaped samples, 10 classes: a fixed random template per class plus noise.
    Learnable, needs no files and no scikit-learn: for benchmarks on machines without data."""
    rng = np.random.default_rng(0x5E7)
    # smooth shapes, as in digits: a random 7x7 pattern per class, blown up into 4x4 blocks
    coarse = rng.integers(0, 156, (10, 1, 7, 7), dtype=np.uint8)
    templates = coarse.repeat(4, axis=2).repeat(4, axis=3)
    y = rng.integers(0, 10, 60_000).astype(np.int64)
    x = rng.integers(0, 100, (60_000, 1, 28, 28), dtype=np.uint8)  # noise; templates + noise <= 255
    x += templates[y]
    return x, y


def _load_synthetic(data_dir: Path, download: bool) -> Dataset:
    """60,000 generated samples of 1x28x28 in 10 classes (``data_dir``/``download`` are ignored)."""
    x, y = _synthetic_arrays()
    return Dataset("synthetic", x.copy(), y.copy(), 10)


#: samples of the ``synthetic`` dataset unless ``data.synthetic_samples`` says otherwise
SYNTHETIC_SAMPLES = 60_000


def synthetic_dataset(samples: int = SYNTHETIC_SAMPLES) -> Dataset:
    """``samples`` generated samples of 1x28x28 in 10 classes, with the class templates of the 60,000
    ``synthetic`` samples (which this is at that size): enough data for any number of devices. Other
    sizes draw their labels from a stream of their own and their noise in blocks of 65,536 samples,
    each from its own stream, so memory peaks at the samples themselves (784 bytes each)."""
    if samples == SYNTHETIC_SAMPLES:
        return _load_synthetic(Path(), False)
    coarse = np.random.default_rng(0x5E7).integers(0, 156, (10, 1, 7, 7), dtype=np.uint8)
    templates = coarse.repeat(4, axis=2).repeat(4, axis=3)
    y = np.random.default_rng([0x5E7, samples]).integers(0, 10, samples).astype(np.int64)
    x = np.empty((samples, 1, 28, 28), dtype=np.uint8)
    block = 65_536
    for i, start in enumerate(range(0, samples, block)):
        stop = min(start + block, samples)
        x[start:stop] = np.random.default_rng([0x5E7, samples, i]).integers(0, 100, (stop - start, 1, 28, 28), dtype=np.uint8)
        x[start:stop] += templates[y[start:stop]]
    return Dataset("synthetic", x, y, 10)


def _from_mnist(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """A torchvision MNIST-style dataset (``data`` (N, H, W) uint8 tensor) -> (N, 1, H, W), labels."""
    x = np.ascontiguousarray(ds.data.numpy(), dtype=np.uint8)[:, None]
    y = np.asarray(ds.targets, dtype=np.int64)
    return x, y


def _from_cifar(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """A torchvision CIFAR dataset (``data`` (N, H, W, 3) uint8 HWC) -> (N, 3, H, W), labels."""
    x = np.ascontiguousarray(np.asarray(ds.data, dtype=np.uint8).transpose(0, 3, 1, 2))
    y = np.asarray(ds.targets, dtype=np.int64)
    return x, y


_IMPORT_FIX = (
    "run `lcfed data import --data-dir {dir}` to place local IDX files there "
    "(or --set data.download=true on a machine with internet); on a Ray cluster the data is needed "
    "on the head only, where the driver runs"
)
_CIFAR_FIX = (
    "--set data.download=true on a machine with internet, or copy the extracted torchvision archive ({folder}/) into {dir}"
)


def _torchvision(
    name: str,
    cls_name: str,
    convert: Callable[[Any], tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    fix: str,
    data_dir: Path,
    download: bool,
) -> Dataset:
    """Load both pools of a torchvision dataset, turning "not found" into a :class:`DataError`."""
    # Imported here: torchvision is slow to import and only these datasets need it.
    from torchvision import datasets

    cls = getattr(datasets, cls_name)
    try:
        pools = [convert(cls(root=str(data_dir), train=train, download=download)) for train in (True, False)]
    except (RuntimeError, OSError) as exc:  # torchvision: "Dataset not found ..."; downloads: URLError
        raise DataError(f"dataset {name!r} is not available in {data_dir} ({exc}); fix: {fix}") from exc
    x = np.concatenate([p[0] for p in pools])
    y = np.concatenate([p[1] for p in pools])
    return Dataset(name, x, y, num_classes)


def _read_cache(cache: Path, stamp: list[list[object]], name: str, num_classes: int) -> Dataset | None:
    """The cached dataset if ``stamp`` is what it was decoded from: ``x`` memory-mapped, so its file is ``x_file``."""
    try:
        if json.loads((cache / "stamp.json").read_text()) != stamp:
            return None
        version = file_version(str(cache / "x.npy"))
        x = np.load(cache / "x.npy", mmap_mode="r")
        y = np.load(cache / "y.npy")
    except (OSError, ValueError):
        return None
    if len(x) != len(y):
        return None
    return Dataset(name, x, y, num_classes, x_file=str(cache / "x.npy"), x_version=version)


def _write_cache(cache: Path, stamp: list[list[object]], ds: Dataset) -> None:
    """Best effort (a read-only data dir just means no cache); each file replaced atomically,
    the stamp last, so a reader never pairs a stamp with other arrays (processes, even on other
    nodes, may fill it at once)."""
    write_arrays(cache, {"x.npy": ds.x, "y.npy": ds.y}, stamp)


def _cached(name: str, folder: str, num_classes: int, data_dir: Path, decode: Callable[[], Dataset]) -> Dataset:
    """``decode()``'s dataset, from the cache when the files under ``data_dir/folder`` are unchanged."""
    src, cache = data_dir / folder, data_dir / CACHE_DIR / name
    stamp = _stamp(src)
    hit = _read_cache(cache, stamp, name, num_classes) if stamp else None
    if hit is not None:
        return hit
    ds = decode()
    after = _stamp(src)  # a download has just created the files
    if after:
        _write_cache(cache, after, ds)
        return _read_cache(cache, after, name, num_classes) or ds  # the cache's file, which Ray hosts can read
    return ds


def _mnist_loader(name: str, cls_name: str) -> Callable[[Path, bool], Dataset]:
    def load(data_dir: Path, download: bool) -> Dataset:
        fix = _IMPORT_FIX.format(dir=data_dir)

        def decode() -> Dataset:
            for f in sorted((data_dir / cls_name / "raw").glob("*-idx[13]-ubyte")):  # torchvision's reader fails
                with open(f, "rb") as idx:  # on a hand-placed file of 0 items with a traceback
                    head = idx.read(8)
                if len(head) == 8 and int.from_bytes(head[4:], "big") == 0:
                    raise DataError(f"{f}: holds no {'images' if '-images-' in f.name else 'labels'} (an empty IDX "
                                    f"file); fix: {fix}")
            return _torchvision(name, cls_name, _from_mnist, 10, fix, data_dir, download)

        return _cached(name, cls_name, 10, data_dir, decode)

    load.__doc__ = f"{name}: torchvision {cls_name}, 60,000 + 10,000 samples of 1x28x28."
    return load


def _cifar_loader(name: str, cls_name: str, num_classes: int) -> Callable[[Path, bool], Dataset]:
    folder = {"CIFAR10": "cifar-10-batches-py", "CIFAR100": "cifar-100-python"}[cls_name]  # torchvision's base_folder

    def load(data_dir: Path, download: bool) -> Dataset:
        fix = _CIFAR_FIX.format(folder=folder, dir=data_dir)
        return _cached(
            name,
            folder,
            num_classes,
            data_dir,
            lambda: _torchvision(name, cls_name, _from_cifar, num_classes, fix, data_dir, download),
        )

    load.__doc__ = f"{name}: torchvision {cls_name}, 50,000 + 10,000 samples of 3x32x32."
    return load


def _load_file(data_dir: Path, download: bool) -> Dataset:
    """your own file or folder, named by data.path: an .npz archive (x, y, optional device ids), an
    ImageFolder directory (one subfolder per class), or a .csv / .parquet table of features with a label
    column; data.format (auto: by the extension) says which."""
    raise DataError("data.dataset 'file' reads the file or folder that data.path names: set data.path "
                    "(an .npz, .csv or .parquet file, or an ImageFolder directory; relative to data.data_dir)")


def _load_leaf_synthetic(data_dir: Path, download: bool) -> Dataset:
    """LEAF's synthetic(alpha, beta): 60 features, 10 classes, a softmax model and an input distribution
    per device (or per known cluster: data.synthetic_clusters), generated for data.num_devices devices
    (data.synthetic_alpha, data.synthetic_beta, data.synthetic_samples); use data.partition=natural.
    Called without a config: 100 devices, alpha = beta = 1."""
    return leaf_synthetic(100)


SOURCES: dict[str, Callable[[Path, bool], Dataset]] = {
    "digits": _load_digits,
    "synthetic": _load_synthetic,
    GENERATED: _load_leaf_synthetic,
    "mnist": _mnist_loader("mnist", "MNIST"),
    "fashion_mnist": _mnist_loader("fashion_mnist", "FashionMNIST"),
    "cifar10": _cifar_loader("cifar10", "CIFAR10", 10),
    "cifar100": _cifar_loader("cifar100", "CIFAR100", 100),
    "file": _load_file,
}
"""Dataset name -> loader(data_dir, download). ``file`` is read by :func:`lcfed.data.formats.load_file`
from the :class:`~lcfed.data.formats.FileSource` that :func:`load_dataset` is given."""


def load_dataset(name: str, data_dir: str | Path, download: bool = False, source: FileSource | None = None,
                 loader: Callable[[Path, bool], Dataset] | None = None) -> Dataset:
    """Load dataset ``name`` from ``data_dir`` (train pool then test pool); for ``file``, the file that
    ``source`` (a :class:`lcfed.data.formats.FileSource`) names. ``loader`` is a plugin's (from
    :func:`lcfed.registry.dataset`, as :func:`lcfed.run.sources.load_source` resolves ``data.dataset``);
    without it ``name`` is a built-in's (:data:`SOURCES`).

    Raises :class:`DataError` for an unknown name or when the files are missing or unusable.
    """
    if name == "file" and source is not None:
        return load_file(source, Path(data_dir).expanduser())
    if loader is None:
        if name not in SOURCES:
            raise DataError(f"unknown built-in dataset {name!r}: one of {sorted(SOURCES)} "
                            "(a plugin's loader comes from lcfed.registry.dataset)")
        loader = SOURCES[name]
    ds = loader(Path(data_dir).expanduser(), download)
    if not isinstance(ds, Dataset):
        raise DataError(f"dataset {name!r}: its loader returned a {type(ds).__name__}, not an lcfed.data.Dataset")
    return ds
