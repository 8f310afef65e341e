"""Federations generated at any size: LEAF's synthetic(α, β), optionally with known clusters.

LEAF's synthetic data (Caldas et al., arXiv:1812.01097; the generator of Li et al., FedProx, MLSys
2020), device by device, as its generator draws it (α and β are standard deviations there):

- the device's model: u_k ~ N(0, α²); W_k (60 x 10) and b_k (10) with entries ~ N(u_k, 1);
- its features: B_k ~ N(0, β²); v_k (60) with entries ~ N(B_k, 1); x ~ N(v_k, Σ), Σ = diag(j^-1.2), j = 1..60;
- its labels: y = argmax(x W_k + b_k).

α sets how much the devices' models differ, β how much their inputs do. With ``clusters`` = G > 0 the
devices fall into G groups of equal size (± 1, seeded) and a group is what a device is above: its
devices share one model (u, W, b) and one input centre c_g (drawn as v_k is), and a device's centre is
c_g moved by N(0, β²) per feature. The groups are then true clusters, scored against the methods'
assignments as a testbed's are (``ari``, ``nmi``); β = 0 makes a group's devices identically distributed.

Sizes: each device gets ``min_samples`` and the rest of ``samples`` is shared out in proportion to
lognormal(0, 1) weights (LEAF's sizes are lognormal too). Devices are generated in blocks of
:data:`BLOCK`, each block from a stream of its own, and the samples are float32: memory peaks at the
samples (240 bytes each). The data is a function of its arguments alone, not of the run's seed, so
every seed of a comparison sees the same federation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lcfed.data.dataset import Dataset

#: the ``data.dataset`` name of :func:`leaf_synthetic`
GENERATED = "leaf_synthetic"
FEATURES, CLASSES = 60, 10
#: devices generated from one stream
BLOCK = 4096
#: samples per device when ``data.synthetic_samples`` is 0
DEFAULT_PER_DEVICE = 40
_STREAM = 0x1EAF
_ROWS = 1024  # rows whose models are gathered at once for their logits (1024 x 600 float64 = 4.9 MB: in cache)


def device_sizes(num_devices: int, samples: int, min_samples: int) -> np.ndarray:
    """Each device's sample count: ``min_samples`` plus a lognormal(0, 1)-weighted share of the rest."""
    if samples < num_devices * min_samples:
        raise ValueError(f"{samples} samples cannot give {num_devices} devices {min_samples} each")
    rng = np.random.default_rng([_STREAM, num_devices, samples, 0])
    weights = rng.lognormal(0.0, 1.0, num_devices)
    return min_samples + rng.multinomial(samples - num_devices * min_samples, weights / weights.sum())


@dataclass(frozen=True)
class GeneratedSpec:
    """What :func:`leaf_synthetic` generates (its arguments): any node can build any devices' samples from it."""

    num_devices: int
    alpha: float = 1.0
    beta: float = 1.0
    clusters: int = 0
    samples: int = 0
    min_samples: int = 2

    def starts(self) -> np.ndarray:
        """Row offsets (m + 1,), read-only: device d's samples are rows ``starts[d]:starts[d + 1]``."""
        return _starts(self)

    def device_groups(self, rng: np.random.Generator | None = None) -> np.ndarray | None:
        """Each device's true group (m,), or None without ``clusters``; ``rng`` is the clusters' stream, which
        goes on to draw the groups' models."""
        if not self.clusters:
            return None
        rng = rng if rng is not None else np.random.default_rng([_STREAM, self.num_devices, self.clusters, 1])
        return rng.permutation(self.num_devices) % self.clusters


@lru_cache(maxsize=4)
def _starts(spec: GeneratedSpec) -> np.ndarray:
    """:meth:`GeneratedSpec.starts`, computed once per process (a host asks for it at every step; 0.1 s at 10^6)."""
    sizes = device_sizes(spec.num_devices, spec.samples or DEFAULT_PER_DEVICE * spec.num_devices, spec.min_samples)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    starts.flags.writeable = False
    return starts


def leaf_synthetic(
    num_devices: int, alpha: float = 1.0, beta: float = 1.0, clusters: int = 0, samples: int = 0, min_samples: int = 2
) -> Dataset:
    """synthetic(α, β) for ``num_devices`` devices with ``samples`` samples in all (0: :data:`DEFAULT_PER_DEVICE`
    each); ``device_ids`` say whose each sample is (``data.partition: natural``), and with ``clusters`` > 0
    ``groups`` say each sample's device's group."""
    return generate_devices(GeneratedSpec(num_devices, alpha, beta, clusters, samples, min_samples), 0, num_devices)


def generate_devices(spec: GeneratedSpec, first: int, stop: int) -> Dataset:
    """The samples of devices ``first``..``stop - 1`` alone (rows ``starts[first]:starts[stop]`` of the whole
    federation's, bit for bit): the blocks they fall in are generated, each from its own stream."""
    m = spec.num_devices
    if not 0 <= first <= stop <= m:
        raise ValueError(f"devices {first}..{stop} are not within 0..{m}")
    starts = spec.starts()
    std_x = np.arange(1, FEATURES + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
    group = shared = centres = None
    if spec.clusters:
        rng = np.random.default_rng([_STREAM, m, spec.clusters, 1])
        group = spec.device_groups(rng)
        shared = _models(rng, spec.clusters, spec.alpha)
        centres = _centres(rng, spec.clusters, 1.0)
    base = int(starts[first])
    n = int(starts[stop]) - base
    x = np.empty((n, FEATURES), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    for i in range(first // BLOCK, -(-stop // BLOCK)):
        lo, hi = i * BLOCK, min(i * BLOCK + BLOCK, m)
        rng = np.random.default_rng([_STREAM, m, i, 2])
        w, b = shared if shared is not None else _models(rng, hi - lo, spec.alpha)
        if centres is not None and group is not None:
            centre = centres[group[lo:hi]] + rng.normal(0.0, spec.beta, (hi - lo, FEATURES))
        else:
            centre = _centres(rng, hi - lo, spec.beta)
        r0, r1 = int(starts[lo]), int(starts[hi])
        owner = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(starts[lo:hi + 1]))
        xb = rng.standard_normal((r1 - r0, FEATURES))
        xb *= std_x
        xb += centre[owner - lo]  # centre + z * std, in place
        yb = np.empty(r1 - r0, dtype=np.int64)
        for s in range(0, r1 - r0, _ROWS):
            rows = slice(s, s + _ROWS)
            dev = owner[rows]
            which = group[dev] if group is not None else dev - lo  # the row's model: its group's, else its own
            yb[rows] = np.argmax(np.einsum("nf,nfc->nc", xb[rows], w[which]) + b[which], axis=1)
        keep = slice(max(r0, int(starts[first])) - r0, min(r1, int(starts[stop])) - r0)  # this call's devices' rows
        at = max(r0, base) - base
        x[at:at + keep.stop - keep.start] = xb[keep]
        y[at:at + keep.stop - keep.start] = yb[keep]
    owner = np.repeat(np.arange(first, stop, dtype=np.int64), np.diff(starts[first:stop + 1]))
    groups = None if group is None else np.ascontiguousarray(group[owner]).astype(np.int64)
    return Dataset(GENERATED, x, y, CLASSES, owner, groups)


def _centres(rng: np.random.Generator, n: int, beta: float) -> np.ndarray:
    """``n`` input centres (n, 60): entries ~ N(B, 1) around means B ~ N(0, β²)."""
    return rng.normal(rng.normal(0.0, beta, n)[:, None], 1.0, (n, FEATURES))


def _models(rng: np.random.Generator, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` softmax models (W (n, 60, 10), b (n, 10)) around means u ~ N(0, α²)."""
    u = rng.normal(0.0, alpha, n)
    # normal(u, 1) draws u + 1.0 * z, z standard normal in the output's order: the same bits, a third faster
    w = rng.standard_normal((n, FEATURES, CLASSES))
    w += u[:, None, None]
    return w, rng.normal(u[:, None], 1.0, (n, CLASSES))
