"""Each device's samples into local train and test, stratified by class, with a floor of test samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lcfed.data.schemes import PartitionError, _check_labels, pieces


def split_train_test(
    device_indices: Sequence[np.ndarray], labels: np.ndarray, test_fraction: float, seed: int, min_test: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split every device's samples into local train/test, stratified by class.

    Per device and class, round(count * test_fraction) samples (halves rounded up) go to test.
    Then, when ``test_fraction > 0``: a device with >= 2 samples but no test sample moves one of its
    most frequent class to test, and a device whose samples all went to test keeps one for
    training; so train is empty only for empty devices, test only for devices of 1 sample.

    ``min_test`` > 0 is a floor: a device whose test set came out smaller gets exactly ``min_test``
    test samples instead, apportioned over its classes by largest remainder (so its test set keeps
    the device's label mix); devices already at or above the floor keep the same train and test
    samples as without it (their order, which the shuffle draws for all devices at once, may differ). A
    device with fewer than ``min_test + 1`` samples (one must stay for training) is a
    :class:`PartitionError`. Vectorized over all devices at once.
    """
    labels = _check_labels(labels)
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if min_test < 0:
        raise ValueError(f"min_test must be >= 0, got {min_test}")
    m = len(device_indices)
    rng = np.random.default_rng(seed)
    sizes = np.fromiter((len(d) for d in device_indices), dtype=np.int64, count=m)
    check_test_floor(sizes, min_test)
    flat, dev, is_test = _test_choice(device_indices, sizes, labels, test_fraction, min_test, rng)
    train = _by_device(flat[~is_test], dev[~is_test], m, rng)
    test = _by_device(flat[is_test], dev[is_test], m, rng)
    return train, test


def _test_choice(
    device_indices: Sequence[np.ndarray], sizes: np.ndarray, labels: np.ndarray, test_fraction: float, min_test: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The samples grouped by (device, label) in random order (one draw each), their devices, and which go to
    test: every per-device rule of :func:`split_train_test`."""
    flat, dev, lab, starts, group_of, rank = _class_groups(device_indices, sizes, labels, rng)
    group_size = np.diff(np.append(starts, len(flat)))
    group_dev = dev[starts]
    n_test = np.floor(group_size * test_fraction + 0.5).astype(np.int64)

    if test_fraction > 0 and len(starts):
        _one_test_one_train(n_test, group_size, group_dev, sizes)

    if min_test > 0 and len(starts):
        _raise_to_floor(n_test, group_size, group_dev, lab[starts], sizes, min_test)

    return flat, dev, rank < n_test[group_of]


def _at(seed: int, draws: int) -> np.random.Generator:
    """The split's generator after ``draws`` draws (each of its draws takes one step of PCG64)."""
    bits = np.random.PCG64(seed)  # default_rng's generator
    bits.advance(draws)
    return np.random.Generator(bits)


@dataclass(frozen=True)
class SplitPart:
    """The train/test split of some consecutive devices (a host's), before their samples' order in each: the
    samples grouped, their devices (0 = the first of them) and which go to test."""

    flat: np.ndarray
    dev: np.ndarray
    is_test: np.ndarray

    def counts(self, devices: int) -> tuple[np.ndarray, np.ndarray]:
        """Each device's train and test counts."""
        return (np.bincount(self.dev[~self.is_test], minlength=devices),
                np.bincount(self.dev[self.is_test], minlength=devices))

    def order(self, devices: int, seed: int, train_draws: int, test_draws: int
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each device's train and test samples in the order :func:`split_train_test` gives them for the whole
        federation: ``train_draws`` / ``test_draws`` = the split's draws before these devices' train / test
        samples (all samples', then the train samples of the devices before, and so on)."""
        return (_by_device(self.flat[~self.is_test], self.dev[~self.is_test], devices, _at(seed, train_draws)),
                _by_device(self.flat[self.is_test], self.dev[self.is_test], devices, _at(seed, test_draws)))


def split_part(device_indices: Sequence[np.ndarray], labels: np.ndarray, test_fraction: float, seed: int,
               min_test: int, draws: int) -> SplitPart:
    """:func:`split_train_test` for some consecutive devices of a federation, whose devices hold their samples
    in order (a natural partition: the split's one draw per sample then runs in device order): ``draws`` =
    the samples of the devices before them. The same train and test sets, bit for bit, with
    :meth:`SplitPart.order`. Every device must hold more than ``min_test`` samples (no error is raised here)."""
    labels = _check_labels(labels)
    sizes = np.fromiter((len(d) for d in device_indices), dtype=np.int64, count=len(device_indices))
    return SplitPart(*_test_choice(device_indices, sizes, labels, test_fraction, min_test, _at(seed, draws)))


def check_test_floor(sizes: np.ndarray, min_test: int) -> None:
    """Every device of ``sizes`` samples can keep ``min_test`` test samples and one to train on, else
    :class:`PartitionError` (``min_test_samples``)."""
    if min_test > 0 and len(sizes) and sizes.min() <= min_test:
        raise _floor_error(sizes, min_test)


def _floor_error(sizes: np.ndarray, min_test: int) -> PartitionError:
    """The error for devices too small to keep ``min_test`` test samples and one for training."""
    small = int(np.argmin(sizes))
    return PartitionError(
        "min_test_samples",
        f"device {small} holds {sizes[small]} samples, so a test set of min_test_samples ({min_test}) would "
        f"leave it no training sample ({int(np.count_nonzero(sizes <= min_test))} of {len(sizes)} devices hold <= "
        f"{min_test}): lower data.min_test_samples, or give every device more samples (data.min_samples for "
        "dirichlet, fewer data.num_devices)",
    )


def _class_groups(
    device_indices: Sequence[np.ndarray], sizes: np.ndarray, labels: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every device's samples grouped by (device, label), in random order within each group: the sample
    indices, their devices and labels in that order, where each group starts, each sample's group and
    its rank within it."""
    m = len(device_indices)
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in device_indices] + [np.empty(0, np.int64)])
    dev = np.repeat(np.arange(m), sizes)
    lab = labels[flat]
    # (device, label) as one key: the same order as lexsort((random, lab, dev)), 30 % faster at 10^7 samples
    order = np.lexsort((rng.random(len(flat)), dev * (int(lab.max(initial=0)) + 1) + lab))
    flat, dev, lab = flat[order], dev[order], lab[order]
    starts_mask = np.ones(len(flat), dtype=bool)
    starts_mask[1:] = (dev[1:] != dev[:-1]) | (lab[1:] != lab[:-1])
    starts = np.flatnonzero(starts_mask)
    group_of = np.cumsum(starts_mask) - 1
    rank = np.arange(len(flat)) - starts[group_of]
    return flat, dev, lab, starts, group_of, rank


def _one_test_one_train(n_test: np.ndarray, group_size: np.ndarray, group_dev: np.ndarray, sizes: np.ndarray) -> None:
    """Adjust (in place) the per-(device, class) test counts: a device with >= 2 samples but no test sample
    moves one of its largest class (first on ties) to test; a device all in test keeps one of it for training."""
    by_size = np.lexsort((-group_size, group_dev))
    first = np.ones(len(by_size), dtype=bool)
    first[1:] = group_dev[by_size[1:]] != group_dev[by_size[:-1]]
    largest = by_size[first]  # one group per non-empty device, in device order
    dev_test = np.bincount(group_dev, weights=n_test, minlength=len(sizes)).astype(np.int64)
    owners = group_dev[largest]
    n_test[largest[(dev_test[owners] == 0) & (sizes[owners] >= 2)]] += 1
    n_test[largest[dev_test[owners] == sizes[owners]]] -= 1


def _raise_to_floor(
    n_test: np.ndarray, group_size: np.ndarray, group_dev: np.ndarray, group_label: np.ndarray,
    sizes: np.ndarray, floor: int,
) -> None:
    """Set (in place) the per-(device, class) test counts of devices below ``floor`` test samples to
    an apportionment of exactly ``floor``: floor(floor * count / size) each, and the remaining units
    to the largest remainders (ties: larger class count, then smaller label). Integer arithmetic, so
    ties are exact; no class is asked for more samples than the device holds of it."""
    dev_test = np.bincount(group_dev, weights=n_test, minlength=len(sizes)).astype(np.int64)
    low = dev_test[group_dev] < floor
    if not low.any():
        return
    share = floor * group_size[low]
    base, remainder = share // sizes[group_dev[low]], share % sizes[group_dev[low]]
    devs = group_dev[low]
    missing = floor - np.bincount(devs, weights=base, minlength=len(sizes)).astype(np.int64)
    order = np.lexsort((group_label[low], -group_size[low], -remainder, devs))
    first = np.searchsorted(devs[order], devs[order])  # where each device's run starts in ``order``
    rank = np.arange(len(order)) - first
    extra = np.zeros(len(order), dtype=np.int64)
    extra[order] = rank < missing[devs[order]]
    n_test[low] = base + extra


def _by_device(flat: np.ndarray, dev: np.ndarray, m: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``flat`` into one array per device, each in random order."""
    order = np.lexsort((rng.random(len(flat)), dev))
    return pieces(flat[order], np.bincount(dev, minlength=m))
