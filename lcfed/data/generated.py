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
_ROWS = 8192  # rows whose models are gathered at once for their logits (8192 x 600 float64 = 39 MB)


def device_sizes(num_devices: int, samples: int, min_samples: int) -> np.ndarray:
    """Each device's sample count: ``min_samples`` plus a lognormal(0, 1)-weighted share of the rest."""
    if samples < num_devices * min_samples:
        raise ValueError(f"{samples} samples cannot give {num_devices} devices {min_samples} each")
    rng = np.random.default_rng([_STREAM, num_devices, samples, 0])
    weights = rng.lognormal(0.0, 1.0, num_devices)
    return min_samples + rng.multinomial(samples - num_devices * min_samples, weights / weights.sum())


def leaf_synthetic(
    num_devices: int, alpha: float = 1.0, beta: float = 1.0, clusters: int = 0, samples: int = 0, min_samples: int = 2
) -> Dataset:
    """synthetic(α, β) for ``num_devices`` devices with ``samples`` samples in all (0: :data:`DEFAULT_PER_DEVICE`
    each); ``device_ids`` say whose each sample is (``data.partition: natural``), and with ``clusters`` > 0
    ``groups`` say each sample's device's group."""
    m = num_devices
    sizes = device_sizes(m, samples or DEFAULT_PER_DEVICE * m, min_samples)
    owner = np.repeat(np.arange(m, dtype=np.int64), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    x = np.empty((len(owner), FEATURES), dtype=np.float32)
    y = np.empty(len(owner), dtype=np.int64)
    std_x = np.arange(1, FEATURES + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
    group = shared = centres = None
    if clusters:
        rng = np.random.default_rng([_STREAM, m, clusters, 1])
        group = rng.permutation(m) % clusters
        shared = _models(rng, clusters, alpha)
        centres = _centres(rng, clusters, 1.0)
    for i, lo in enumerate(range(0, m, BLOCK)):
        hi = min(lo + BLOCK, m)
        rng = np.random.default_rng([_STREAM, m, i, 2])
        w, b = shared if shared is not None else _models(rng, hi - lo, alpha)
        if centres is not None and group is not None:
            centre = centres[group[lo:hi]] + rng.normal(0.0, beta, (hi - lo, FEATURES))
        else:
            centre = _centres(rng, hi - lo, beta)
        r0, r1 = int(starts[lo]), int(starts[hi])
        xb = centre[owner[r0:r1] - lo] + rng.standard_normal((r1 - r0, FEATURES)) * std_x
        for s in range(0, r1 - r0, _ROWS):
            rows = slice(s, s + _ROWS)
            dev = owner[r0:r1][rows]
            which = group[dev] if group is not None else dev - lo  # the row's model: its group's, else its own
            y[r0:r1][rows] = np.argmax(np.einsum("nf,nfc->nc", xb[rows], w[which]) + b[which], axis=1)
        x[r0:r1] = xb
    groups = None if group is None else np.ascontiguousarray(group[owner]).astype(np.int64)
    return Dataset(GENERATED, x, y, CLASSES, owner, groups)


def _centres(rng: np.random.Generator, n: int, beta: float) -> np.ndarray:
    """``n`` input centres (n, 60): entries ~ N(B, 1) around means B ~ N(0, β²)."""
    return rng.normal(rng.normal(0.0, beta, n)[:, None], 1.0, (n, FEATURES))


def _models(rng: np.random.Generator, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` softmax models (W (n, 60, 10), b (n, 10)) around means u ~ N(0, α²)."""
    u = rng.normal(0.0, alpha, n)
    return rng.normal(u[:, None, None], 1.0, (n, FEATURES, CLASSES)), rng.normal(u[:, None], 1.0, (n, CLASSES))
