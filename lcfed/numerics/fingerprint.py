"""This machine's kernel fingerprint: a hash of each floating-point kernel on the project's CPU path, run on
fixed inputs, so that two machines can tell whether a seed gives them the same numbers before a run.

Two CPUs give the same numbers for the same config and seed exactly when every kernel a run uses gives the
same bits on both. Each line of a fingerprint is ``name sha256[:16]`` of one kernel's result: the generic
kernels first (convolutions, linear layers, matmuls, reductions, transcendental functions, the LAPACK and
BLAS routines that numpy, scipy and scikit-learn call), with the inputs and names of
``shared/numerics/fingerprint.py`` so that a line can be diffed against that script's reference outputs;
then the project's own path: model initialisation, :func:`lcfed.learning.local_update.local_update` with proximal
terms, the vectorized step, evaluation, LCFed's projector and assignments, k-means, the cluster means,
the input scaling, the partitioner's draws and the generated data. The digest is a hash of all lines.

Computing it takes a second or two (scikit-learn's import is most of it); :func:`for_process` computes
it once per process and keeps it on disk keyed by everything that decides it (CPU model and flags,
the kernel settings in force, the numeric libraries' versions, threads), so a run records its digest in
milliseconds. The inputs come from numpy's generator, whose bits are the same on every CPU; torch's
own generator runs in a forked RNG state, so computing a fingerprint never changes a run's numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from lcfed import numerics

#: bump when a kernel, an input or a name changes: digests of different versions never compare equal
VERSION = 2
#: the libraries whose versions decide the bits (beside the CPU and the kernel settings)
LIBRARIES = ("torch", "numpy", "scipy", "scikit-learn", "threadpoolctl")
#: where :func:`for_process` keeps computed fingerprints (``$LCFED_CACHE_DIR``, else ~/.cache/lcfed)
ENV_CACHE = "LCFED_CACHE_DIR"


@dataclass(frozen=True)
class Fingerprint:
    """One machine's kernel hashes under one profile, and what it was taken with."""

    kernels: dict[str, str]
    machine: dict[str, str] = field(default_factory=dict)
    name: str = ""
    note: str = ""

    @property
    def digest(self) -> str:
        """12 hex digits of the hash of every kernel line (and the fingerprint's version)."""
        text = f"v{VERSION}\n" + "".join(f"{k} {v}\n" for k, v in sorted(self.kernels.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def lines(self) -> list[str]:
        return [f"{k} {v}" for k, v in self.kernels.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "name": self.name, "note": self.note, "digest": self.digest,
                "machine": self.machine, "kernels": self.kernels}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fingerprint:
        if d.get("version") != VERSION:
            raise ValueError(f"fingerprint version {d.get('version')!r}, this lcfed reads version {VERSION}")
        return cls(dict(d["kernels"]), dict(d.get("machine", {})), str(d.get("name", "")), str(d.get("note", "")))

    def differing(self, other: Fingerprint) -> list[str]:
        """The kernels whose hashes differ (or that only one of the two has), in this one's order."""
        names = list(self.kernels) + [k for k in other.kernels if k not in self.kernels]
        return [k for k in names if self.kernels.get(k) != other.kernels.get(k)]


def _hash(x: Any) -> str:
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().contiguous().numpy()
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]


def _generic(out: dict[str, str]) -> None:
    """The kernels and inputs of ``shared/numerics/fingerprint.py`` (same order of draws, same names), but
    ``torch.pca_lowrank`` from a seeded generator (the script's draws from an unseeded one)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(0)

    def r(*s: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(s).astype(np.float32))

    x = r(32, 1, 28, 28).requires_grad_()
    w1, b1 = r(6, 1, 5, 5).requires_grad_(), r(6).requires_grad_()
    y = F.conv2d(x, w1, b1, padding=2)
    out["conv1.fwd"] = _hash(y)
    y.sum().backward()
    out["conv1.bwd_w"], out["conv1.bwd_x"] = _hash(w1.grad), _hash(x.grad)
    x2 = r(32, 6, 14, 14).requires_grad_()
    w2 = r(16, 6, 5, 5).requires_grad_()
    y2 = F.conv2d(x2, w2)
    out["conv2.fwd"] = _hash(y2)
    (y2 * y2).sum().backward()
    out["conv2.bwd_w"], out["conv2.bwd_x"] = _hash(w2.grad), _hash(x2.grad)
    x3 = r(32, 3, 32, 32)
    out["conv_rgb.fwd"] = _hash(F.conv2d(x3, r(6, 3, 5, 5)))
    out["maxpool"], out["avgpool"] = _hash(F.max_pool2d(y, 2)), _hash(F.avg_pool2d(y, 2))
    a = r(32, 400).requires_grad_()
    wl = r(120, 400).requires_grad_()
    yl = F.linear(a, wl)
    out["linear.fwd"] = _hash(yl)
    yl.pow(2).sum().backward()
    out["linear.bwd_w"], out["linear.bwd_x"] = _hash(wl.grad), _hash(a.grad)
    out["matmul.64"] = _hash(r(64, 64) @ r(64, 64))
    out["matmul.odd"] = _hash(r(37, 301) @ r(301, 11))
    z = r(32, 10)
    t = torch.from_numpy(rng.integers(0, 10, 32))
    out["log_softmax"], out["cross_entropy"] = _hash(F.log_softmax(z, 1)), _hash(F.cross_entropy(z, t))
    out["relu"], out["exp"] = _hash(F.relu(z)), _hash(z.exp())
    out["tanh"], out["sigmoid"] = _hash(z.tanh()), _hash(torch.sigmoid(z))
    v = r(100_000)
    out["sum"], out["mean"], out["norm"], out["dot"] = _hash(v.sum()), _hash(v.mean()), _hash(v.norm()), _hash(v @ v)
    m = r(100, 61706)
    out["cosine"] = _hash(F.cosine_similarity(m[:, None, :50], m[None, :, :50], dim=2))
    out["torch.svd"] = _hash(torch.linalg.svdvals(m[:, :500]))
    torch.manual_seed(0)  # inside the caller's forked RNG state
    out["torch.pca_lowrank.seeded"] = _hash(torch.pca_lowrank(m[:, :500], q=10, center=True, niter=2)[1])
    n = rng.standard_normal((100, 500)).astype(np.float32)
    out["np.sum32"], out["np.mean32"], out["np.std32"] = _hash(n.sum(0)), _hash(n.mean(0)), _hash(n.std(0))
    out["np.matmul32"] = _hash(n @ n.T)
    out["np.matmul64"] = _hash(n.astype(np.float64) @ n.T.astype(np.float64))
    out["np.svd64"] = _hash(np.linalg.svd(n.astype(np.float64), compute_uv=False))
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    p = PCA(n_components=10, random_state=0).fit_transform(n.astype(np.float64))
    out["sklearn.PCA"] = _hash(np.abs(p))
    out["sklearn.KMeans"] = _hash(KMeans(4, n_init=4, random_state=0).fit_predict(p))
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(400, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84), torch.nn.ReLU(), torch.nn.Linear(84, 10))
    with torch.no_grad():
        for prm in net.parameters():
            prm.copy_(r(*prm.shape) * 0.1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    xb = r(32, 1, 28, 28)
    yb = torch.from_numpy(rng.integers(0, 10, 32))
    for _ in range(20):
        opt.zero_grad()
        F.cross_entropy(net(xb), yb).backward()
        opt.step()
    out["lenet.20steps"] = _hash(torch.cat([q.detach().flatten() for q in net.parameters()]))


def _project(out: dict[str, str]) -> None:
    """The project's own functions on small fixed inputs: what a round of each method computes."""
    import numpy as np
    import torch

    from lcfed.data.generated import leaf_synthetic
    from lcfed.data.partition import make_partition
    from lcfed.data.sources import Scaling
    from lcfed.learning.clustering import assign_by_cosine, cluster_means, kmeans_labels
    from lcfed.learning.local_update import DeviceData, LocalWork, Proximal, batch_rng, evaluate, local_update
    from lcfed.learning.models import build_network
    from lcfed.learning.similarity import fit_projector, sq_dist_matrix, sq_l2_matrix
    from lcfed.learning.vectorized import StepBatcher

    rng = np.random.default_rng([0x5EED, 1])
    images = rng.integers(0, 256, (96, 1, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 96)
    scaling = Scaling.fit(images, np.arange(64))
    out["data.scaling"] = _hash(np.array(scaling.mean + scaling.std))
    x = scaling.apply(images)
    out["data.scaled"] = _hash(x)
    features = rng.standard_normal((50, 60)).astype(np.float32)
    fscale = Scaling.fit(features, np.arange(50))
    out["data.scaling.features"] = _hash(np.array(fscale.mean + fscale.std))
    part = make_partition(np.repeat(np.arange(10), 30), scheme="dirichlet", num_devices=6, alpha=0.3, min_samples=5,
                          seed=0)
    out["data.dirichlet"] = _hash(np.concatenate([np.sort(idx) for idx in part.train] + list(part.test)))
    synth = leaf_synthetic(24, clusters=3, samples=480)
    out["data.leaf_synthetic"] = _hash(np.concatenate([synth.x.ravel(), synth.y.astype(np.float32)]))
    y = torch.from_numpy(labels)
    dev = DeviceData(x[:64], y[:64], x[64:], y[64:])
    finals = []
    for name, shape in (("lenet5", (1, 28, 28)), ("cnn", (3, 32, 32)), ("mlp", (60,))):
        net, w0 = build_network(name, shape, 10, seed=0)
        out[f"model.{name}.init"] = _hash(w0)
        if name == "lenet5":
            data = dev
        else:
            xs = torch.from_numpy(rng.standard_normal((40, *shape)).astype(np.float32))
            ys = torch.from_numpy(rng.integers(0, 10, 40))
            data = DeviceData(xs[:32], ys[:32], xs[32:], ys[32:])
        target = w0 + 0.01 * torch.from_numpy(rng.standard_normal(w0.shape[0]).astype(np.float32))
        prox = (Proximal(target, 1.0), Proximal(target[: w0.shape[0] // 2], 0.1, slice(0, w0.shape[0] // 2)))
        steps = 10 if name != "cnn" else 2
        res = local_update(net, w0, data, LocalWork(lr=0.05, batch_size=32, steps=steps), batch_rng(0, 3, 1), prox)
        out[f"local.{name}.sgd"] = _hash(np.append(res.weights.numpy(), np.float32(res.loss)))
        ev = evaluate(net, res.weights, data.x_test, data.y_test)
        out[f"eval.{name}"] = _hash(np.array([ev.correct, ev.total, ev.loss_sum]))
        if name == "lenet5":
            finals.append(res.weights)
            batcher = StepBatcher(net, [0])
            loss, grad = batcher.loss_and_grad(0, w0, dev.x_train[:32], dev.y_train[:32])
            out["vectorized.lenet5.grad"] = _hash(np.append(grad.numpy(), np.float32(loss)))
    models = torch.from_numpy(rng.standard_normal((20, finals[0].shape[0])).astype(np.float32)) * 0.05 + finals[0]
    proj = fit_projector(models, 10)
    out["similarity.projector"] = _hash(proj.components)
    codes = proj(models)
    out["similarity.project"] = _hash(codes)
    labels5 = kmeans_labels(codes, 5, seed=0)
    out["clustering.kmeans"] = _hash(labels5)
    centers = cluster_means(models, labels5, models[:5].clone())
    out["clustering.means"] = _hash(centers)
    out["clustering.assign"] = _hash(assign_by_cosine(codes, proj(centers)))
    out["similarity.sq_dist"] = _hash(sq_dist_matrix(models))
    out["similarity.sq_l2"] = _hash(sq_l2_matrix(codes, proj(centers)))
    many = torch.from_numpy(rng.standard_normal((700, 10)))
    out["clustering.kmeans.700"] = _hash(kmeans_labels(many, 8, seed=1))
    sym = many[:40].T @ many[:40]
    out["linalg.eigh64"] = _hash(torch.linalg.eigh(sym)[0])
    out["linalg.svd32"] = _hash(torch.linalg.svd(models[:, :300], full_matrices=False)[1])
    out["linalg.qr32"] = _hash(torch.linalg.qr(models[:8, :300].T).R.abs())
    from scipy.cluster.hierarchy import linkage
    from sklearn.cluster import kmeans_plusplus

    out["scipy.linkage"] = _hash(linkage(many[:60].numpy(), method="average"))
    out["sklearn.kmeans_plusplus"] = _hash(kmeans_plusplus(many[:200].numpy(), 6, random_state=0)[1])
    gen = torch.Generator().manual_seed(0)
    out["torch.rng"] = _hash(torch.cat([torch.randn(1000, generator=gen), torch.rand(1000, generator=gen),
                                        torch.randperm(1000, generator=gen).float()]))
    f64 = rng.standard_normal(4096) * 3
    f32 = f64.astype(np.float32)
    out["np.transcendental"] = _hash(np.concatenate([np.exp(f64), np.log1p(np.abs(f64)), np.power(np.abs(f64), -0.6),
                                                     np.tanh(f64), np.exp(f32), np.log(np.abs(f32) + 1)]))


def compute(threads: int = 1) -> Fingerprint:
    """This process's fingerprint under the kernels in force, with ``threads`` intra-op threads (a run's
    ``engine.torch_threads``); torch's global RNG state and thread count are left as they were."""
    import torch
    from threadpoolctl import threadpool_limits

    kernels: dict[str, str] = {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:  # numpy's BLAS on one thread, as the portable profile runs it (its sums follow the thread count)
        with torch.random.fork_rng(devices=[]), threadpool_limits(limits=1, user_api="blas"):
            _generic(kernels)
            _project(kernels)
    finally:
        torch.set_num_threads(before)
    return Fingerprint(kernels, machine(threads))


def machine(threads: int = 1) -> dict[str, str]:
    """What decides the bits besides the code: the CPU, the kernel settings in force, the libraries."""
    out = {"cpu": numerics.cpu_model(), "cpu_isa": numerics.cpu_isa(), "cpu_vendor": numerics.cpu_vendor(),
           "threads": str(threads), "python": platform.python_version()}
    out.update(numerics.kernel_settings())
    for lib in LIBRARIES:
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = "missing"
    return out


def _cache_key(threads: int) -> str:
    facts = {**machine(threads), "flags": " ".join(sorted(numerics.cpu_flags())), "version": str(VERSION)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE) or "~/.cache/lcfed").expanduser() / "fingerprints"


_lock = threading.Lock()
_computed: dict[int, Fingerprint] = {}


def for_process(threads: int = 1) -> Fingerprint:
    """This process's fingerprint: from memory, else from the disk cache, else computed (and cached).
    An unwritable cache only costs the computation."""
    with _lock:
        if threads in _computed:
            return _computed[threads]
        path = cache_dir() / f"{_cache_key(threads)}.json"
        fp = _read(path)
        if fp is None:
            lock, locked = FileLock(str(path.with_suffix(".lock"))), True
            try:  # one process computes, the others (a pool's actors starting together) wait and read it
                path.parent.mkdir(parents=True, exist_ok=True)
                lock.acquire(timeout=120)
            except (OSError, Timeout):
                locked = False
            try:
                fp = _read(path) if locked else None
                if fp is None:
                    fp = compute(threads)
                    if locked:
                        _write(path, fp)
            finally:
                if locked:
                    lock.release()
        _computed[threads] = fp
        return fp


def _read(path: Path) -> Fingerprint | None:
    try:
        return Fingerprint.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, fp: Fingerprint) -> None:
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(fp.to_dict(), f, indent=1)
        os.replace(f.name, path)  # atomic: a reader sees the old file or the whole new one
    except OSError:
        pass  # an unwritable cache only costs the next process the computation


def references() -> list[Fingerprint]:
    """The reference fingerprints the project ships (``lcfed/numerics/fingerprints/*.json``), by name."""
    out = []
    for entry in sorted(files("lcfed.numerics").joinpath("fingerprints").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            out.append(Fingerprint.from_dict(json.loads(entry.read_text())))
    return out


def report(mine: Fingerprint, refs: list[Fingerprint]) -> Iterator[str]:
    """Lines comparing ``mine`` with each reference: equal, or the kernels that differ (and the library
    versions that differ, which explain most such differences)."""
    for ref in refs:
        where = f"{ref.name} ({ref.machine.get('cpu', '?')}; {ref.digest})"
        if ref.digest == mine.digest:
            yield f"  same as {where}"
            continue
        diff = mine.differing(ref)
        libs = [f"{k} {ref.machine.get(k)} there, {mine.machine.get(k)} here" for k in ("python", *LIBRARIES)
                if ref.machine.get(k) != mine.machine.get(k)]
        line = f"  differs from {where}: {len(diff)} kernel{'s' if len(diff) != 1 else ''} ({', '.join(diff[:8])}"
        line += ", ...)" if len(diff) > 8 else ")"
        if libs:
            line += "; versions: " + ", ".join(libs)
        yield line


def matching(mine: Fingerprint, refs: list[Fingerprint]) -> list[str]:
    """The names of the references ``mine`` equals."""
    return [r.name for r in refs if r.digest == mine.digest]

