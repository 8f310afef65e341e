"""Clustering cost per round (the LCFed paper's Fig. 3): FeSEM, CGPFL, IFCA and LCFed, no training.

Each method's real Strategy is built from a config with the real LeNet-5 layout (d = dim(ω) =
61,706), fed synthetic device messages (random models scattered around a few true centers; LCFed's
codes = the broadcast projector applied to them), and driven through its hooks: ``init``,
``configure``/``aggregate`` for round 0 (the cold start: k-means, k-means++, the first PCA fit), then
the steady-state round 1, whose ``aggregate`` is timed (median of ``--repeats``). Every participant
takes part (m devices per round), as in Fig. 3. Torch runs on ``--threads`` threads (1 = what the
Ray ServerActor uses, ``engine.torch_threads``).

Measured per method and scale (m devices, K clusters):

- ``aggregate`` wall: the whole server step (clustering + cluster means + Φ for LCFed).
- clustering wall: the similarity + assignment step alone, called with the same inputs as inside
  ``aggregate`` (FeSEM ``assign_by_l2(models, Ω)``; CGPFL ``assign_by_cosine(models, Ω)``; LCFed
  ``assign_by_cosine(codes, center codes)`` + the center codes' update, plus a refit round's PCA
  fit and projections amortized over R; IFCA none on the server).
- IFCA's clustering runs on the devices: each participant evaluates all K models on its whole
  training set (``ifca.cluster_losses``). It is timed for one device holding n̄ random samples and
  counted as m x that time (device-side compute summed over the round; on a real deployment the
  devices run in parallel, so the round's wall share is one device's time).
- bytes per round: down = ``RoundPlan.down_bytes`` of a steady round (LCFed: the extra broadcast of
  a new M after a fit is amortized over the refit period), up = ``tensor_bytes`` of the messages.

Counted FLOPs per steady round (multiply and add count 1 each; d = 61,706, d_φ = embedding size,
D = rank, S = S_d models sampled for the PCA, R = rounds per PCA fit, n̄ = mean training samples
per device, F = forward FLOPs of one LeNet-5 sample, counted layer by layer below):

- FeSEM clustering   3 m K d                     (‖w_i − Ω_k‖²: d subtractions, squares, additions)
- CGPFL clustering   2 m K d + 3 (m + K) d       (dot products; row norms and scaling)
- LCFed clustering   2 m K D + 3 (m + K) D       (cosine on D-dim codes)
                     + m D                       (center codes kept as the mean of the members' codes:
                                                  M is affine; without them, 2 K D d + K d each round)
                     + [2 S d + 2 S² d + 9 S³ + 2 D S d + 2 m D d + 2 K D d] / R
                       (a PCA fit through the S x S Gram matrix: centring, Gram, symmetric eigh with
                       vectors (~9 S³, Golub & Van Loan), the D directions; in a refit round the
                       server also projects all m uploads, whose codes used the old M, and the K
                       centers)
- IFCA clustering    0 on the server;  m K n̄ F on the devices
- aggregation (all)  m d + K d (cluster means); LCFed adds 2 m d_φ (Φ); IFCA's means are weighted: 2 m d
  (as implemented, ``cluster_means`` is a dense one-hot matmul: 2 K m d multiply-adds, which is what
  the measured ``aggregate`` walls pay; the formula above is the necessary work)

Also measured: LCFed's assignment step alone at m = 10,000, K = 100, D = 50 (``assign_by_cosine``
on codes; target < 10 ms) and the PCA fit (``fit_projector``) of 100 LeNet-5 models at D = 50
(target < 1 s). Target at m = 1,000: LCFed's server clustering cost >= 100x below FeSEM's.

    python benchmarks/clustering_cost.py [--quick] [--scales 100:10,1000:100] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcfed.config import load_config  # noqa: E402
from lcfed.learning.clustering import assign_by_cosine, cluster_means  # noqa: E402
from lcfed.learning.local_update import DeviceData  # noqa: E402
from lcfed.learning.models import Network, build_network  # noqa: E402
from lcfed.learning.similarity import fit_projector  # noqa: E402
from lcfed.methods import METHODS  # noqa: E402
from lcfed.methods.base import Federation, Message, Strategy  # noqa: E402
from lcfed.methods.fedavg import ModelMessage  # noqa: E402
from lcfed.methods.fesem import assign_by_l2  # noqa: E402
from lcfed.methods.ifca import IFCAMessage, cluster_losses  # noqa: E402
from lcfed.methods.lcfed import LCFedMessage  # noqa: E402

METHOD_NAMES = ("fesem", "cgpfl", "ifca", "lcfed")
INPUT_SHAPE = (1, 28, 28)
TRAIN_SAMPLES = 56_000  # MNIST's 70,000 samples x (1 - test_fraction 0.2), spread over the m devices


# --- analytic counts ---------------------------------------------------------------------------


def forward_flops(net: Network) -> int:
    """FLOPs of one sample's forward pass, layer by layer: conv 2·C_in·k_h·k_w·C_out·H_out·W_out, linear 2·in·out."""
    total = 0

    def hook(mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(mod, nn.Conv2d):
            k_h, k_w = mod.kernel_size
            total += 2 * (mod.in_channels // mod.groups) * k_h * k_w * out[0].numel()
        elif isinstance(mod, nn.Linear):
            total += 2 * mod.in_features * mod.out_features

    handles = [m.register_forward_hook(hook) for m in net.module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        net.module(torch.zeros(1, *INPUT_SHAPE))
    for h in handles:
        h.remove()
    return total


def pca_fit_flops(s: int, d: int, rank: int) -> float:
    """``fit_projector`` through the Gram matrix: centring, S x S Gram, eigh with vectors, D directions."""
    return 2.0 * s * d + 2.0 * s * s * d + 9.0 * s**3 + 2.0 * rank * s * d


def clustering_flops(method: str, m: int, k: int, d: int, rank: int, s_d: int, refit: int, n_bar: float, fwd: int,
                     codes_kept: bool = True) -> dict[str, float]:
    """The steady-round counts of the module docstring: server clustering, device clustering, aggregation."""
    if method == "fesem":
        server, device = 3.0 * m * k * d, 0.0
    elif method == "cgpfl":
        server, device = 2.0 * m * k * d + 3.0 * (m + k) * d, 0.0
    elif method == "lcfed":
        centers = m * rank if codes_kept else 2.0 * k * rank * d + k * d
        per_fit = pca_fit_flops(s_d, d, rank) + 2.0 * m * rank * d + (2.0 * k * rank * d if codes_kept else 0.0)
        server, device = 2.0 * m * k * rank + 3.0 * (m + k) * rank + centers + per_fit / refit, 0.0
    elif method == "ifca":
        server, device = 0.0, float(m) * k * n_bar * fwd
    else:
        raise ValueError(method)
    return {"server": server, "device": device}


def aggregation_flops(method: str, m: int, k: int, d: int, d_emb: int) -> float:
    base = float(m * d + k * d)
    if method == "lcfed":
        return base + 2.0 * m * d_emb
    if method == "ifca":
        return base + m * d
    return base


# --- building strategies and messages ----------------------------------------------------------


def make_strategy(name: str, m: int, k: int, net_init: tuple[Network, torch.Tensor], args: argparse.Namespace, *extra: str) -> Strategy:
    net, init = net_init
    over = [f"method.name={name}", f"data.num_devices={m}", "train.participation=1.0", f"method.num_clusters={k}",
            "model.name=lenet5", "tracking.enabled=false"]
    if name == "lcfed":
        over += [f"method.rank={args.rank}", f"method.sample_size={min(args.sample_size, m)}"]
    cfg = load_config(None, [*over, *extra])
    fed = Federation(num_devices=m, train_sizes=np.full(m, max(1, int(TRAIN_SAMPLES / m)), dtype=np.int64),
                     groups=np.zeros(m, dtype=np.int64), spec=net.spec, init=init, num_classes=10, seed=0)
    return METHODS[name].strategy(cfg, fed)


def synthetic_models(init: torch.Tensor, m: int, groups: int, rnd: int) -> tuple[torch.Tensor, np.ndarray]:
    """m flat models scattered around ``groups`` true centers (same centers every round, fresh noise)."""
    g = torch.Generator().manual_seed(1234)
    centers = init + 0.05 * torch.randn(groups, init.numel(), generator=g)
    labels = np.arange(m) % groups
    noise = torch.Generator().manual_seed(1000 + rnd)
    models = centers[torch.from_numpy(labels)] + 0.01 * torch.randn(m, init.numel(), generator=noise)
    return models, labels


def messages(name: str, models: torch.Tensor, labels: np.ndarray, k: int, sizes: np.ndarray, payload: Any) -> list[Message]:
    out: list[Message] = []
    proj = getattr(payload, "projector", None) if name == "lcfed" else None
    codes = proj(models) if proj is not None else None
    for i in range(models.shape[0]):
        w, n = models[i].clone(), int(sizes[i])
        if name == "lcfed":
            out.append(LCFedMessage(i, n, 1.0, w, None if codes is None else codes[i].clone()))
        elif name == "ifca":
            out.append(IFCAMessage(i, n, 1.0, w, int(labels[i] % k)))  # the device's own argmin, synthesized
        else:
            out.append(ModelMessage(i, n, 1.0, w))
    return out


def timed(row: dict[str, Any], key: str, fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` into ``row[key]`` (returned), median process CPU time into ``row[key + '_cpu']``.

    The CPU time is the steadier figure on a shared machine (it does not count time spent waiting
    for a core); with several torch threads it adds up their times.
    """
    walls, cpus = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    row[key], row[key + "_cpu"] = statistics.median(walls), statistics.median(cpus)
    return row[key]


# --- one (method, m, K) cell -------------------------------------------------------------------


def measure_cell(name: str, m: int, k: int, net_init: tuple[Network, torch.Tensor], args: argparse.Namespace) -> dict[str, Any]:
    net, init = net_init
    d, d_emb = net.spec.size, net.spec.embedding_size
    groups = min(k, 10)  # a few true centers; K may exceed them (IFCA/LCFed clusters may stay empty)
    strat = make_strategy(name, m, k, net_init, args)
    sizes = strat.fed.train_sizes

    # round 0: the cold start (initial clustering, first PCA fit), timed once
    state = strat.init()
    plan0 = strat.configure(state, 0)
    models0, labels = synthetic_models(init, m, groups, 0)
    msgs0 = messages(name, models0, labels, k, sizes, plan0.payload)
    del models0
    t0 = time.perf_counter()
    state1, _ = strat.aggregate(state, plan0, msgs0)
    cold = time.perf_counter() - t0
    del msgs0

    # round 1: the steady state every later round repeats
    plan1 = strat.configure(state1, 1)
    models1, _ = synthetic_models(init, m, groups, 1)
    msgs1 = messages(name, models1, labels, k, sizes, plan1.payload)
    row: dict[str, Any] = {"method": name, "m": m, "K": k, "dim": d, "cold_start_s": cold}
    timed(row, "aggregate_s", lambda: strat.aggregate(state1, plan1, msgs1), args.repeats)
    n_bar = float(np.mean(sizes))
    fwd = forward_flops(net)
    refit = args.refit_period
    codes_kept = getattr(state1, "center_codes", None) is not None
    flops = clustering_flops(name, m, k, d, args.rank, min(args.sample_size, m), refit, n_bar, fwd, codes_kept)
    row.update(clustering_flops_server=flops["server"], clustering_flops_device=flops["device"],
               aggregation_flops=aggregation_flops(name, m, k, d, d_emb), n_bar=n_bar, forward_flops=fwd)

    # the clustering step alone, with the inputs aggregate uses (the uploads already stacked)
    if name in ("fesem", "cgpfl"):
        centers = state1.centers
        assign = assign_by_l2 if name == "fesem" else assign_by_cosine
        timed(row, "clustering_s", lambda: assign(models1, centers), args.repeats)
    elif name == "lcfed":
        proj, centers = state1.projector, state1.centers
        codes = torch.stack([mm.code for mm in msgs1 if isinstance(mm, LCFedMessage) and mm.code is not None])
        kept = getattr(state1, "center_codes", None)

        def lcfed_step() -> None:
            # assignment on the codes, then the center codes' update (or, without kept codes, M Ω)
            if kept is not None:
                cluster_means(codes, assign_by_cosine(codes, kept), kept)
            else:
                assign_by_cosine(codes, proj(centers))

        timed(row, "clustering_s", lcfed_step, args.repeats)
        row["center_codes_kept"] = kept is not None
        # a refit round: new PCA of S_d sampled models + projecting every upload, amortized over R
        s_d = min(args.sample_size, m)
        sample = models1[:s_d]
        fit = timed(row, "pca_fit_s", lambda: fit_projector(sample, args.rank), max(1, args.repeats // 2))
        project = timed(row, "refit_project_s", lambda: (proj(models1), proj(centers)), max(1, args.repeats // 2))
        row["clustering_amortized_s"] = row["clustering_s"] + (fit + project) / refit
        row["clustering_amortized_s_cpu"] = row["clustering_s_cpu"] + (row["pca_fit_s_cpu"] + row["refit_project_s_cpu"]) / refit
        # the new M's broadcast goes to every participant once per fit
        extra_down = plan1.down_bytes - strat.configure(state1, 2).down_bytes
        row["refit_down_bytes"] = extra_down
    else:  # IFCA: the devices evaluate K models each; time one average device, sum over m
        n = max(1, round(n_bar))
        x = torch.rand(n, *INPUT_SHAPE)
        y = torch.randint(0, 10, (n,))
        data = DeviceData(x, y, x[:1], y[:1])
        centers = plan1.payload
        one = timed(row, "device_clustering_one_s", lambda: cluster_losses(net, centers, data), args.repeats)
        row.update(clustering_s=0.0, clustering_s_cpu=0.0, device_clustering_total_s=one * m,
                   device_clustering_total_s_cpu=row["device_clustering_one_s_cpu"] * m)

    steady_down = strat.configure(state1, 2).down_bytes
    row["down_bytes"] = steady_down + (row.get("refit_down_bytes", 0) / refit if name == "lcfed" else 0)
    row["down_bytes_steady"] = steady_down
    row["up_bytes"] = Strategy.upload_bytes(msgs1)
    return row


# --- micro-benchmarks --------------------------------------------------------------------------


def micro(args: argparse.Namespace, net_init: tuple[Network, torch.Tensor]) -> dict[str, Any]:
    _, init = net_init
    g = torch.Generator().manual_seed(7)
    m, k, rank = args.assign_m, 100, args.rank
    codes, center_codes = torch.randn(m, rank, generator=g), torch.randn(k, rank, generator=g)
    out: dict[str, Any] = {"assign_m": m, "assign_K": k, "assign_D": rank, "pca_models": 100, "pca_D": rank,
                           "all_cores": os.cpu_count()}
    assign_by_cosine(codes, center_codes)  # warm-up
    timed(out, "assign_s", lambda: assign_by_cosine(codes, center_codes), max(args.repeats, 5) * 4)
    models = init + 0.05 * torch.randn(100, init.numel(), generator=g)
    fit_projector(models, rank)
    timed(out, "pca_fit_s", lambda: fit_projector(models, rank), args.repeats)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    timed(out, "pca_fit_s_all_cores", lambda: fit_projector(models, rank), args.repeats)
    torch.set_num_threads(threads)
    return out


# --- report ------------------------------------------------------------------------------------


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}{unit}"
    return f"{n:.0f}{unit}"


def plot(rows: Sequence[dict[str, Any]], scales: Sequence[tuple[int, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fesem": "tab:red", "cgpfl": "tab:orange", "ifca": "tab:purple", "lcfed": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.2
    x = np.arange(len(scales))
    panels = [
        ("clustering FLOPs / round", lambda r: r["clustering_flops_server"] or r["clustering_flops_device"]),
        ("clustering wall s / round", lambda r: r.get("clustering_amortized_s", r["clustering_s"]) or r.get("device_clustering_total_s", 0.0)),
        ("bytes / round (up + down)", lambda r: r["up_bytes"] + r["down_bytes"]),
    ]
    for ax, (title, value) in zip(axes, panels, strict=True):
        for j, name in enumerate(METHOD_NAMES):
            vals = [next(value(r) for r in rows if r["method"] == name and (r["m"], r["K"]) == s) for s in scales]
            hatch = "//" if name == "ifca" and "bytes" not in title else None
            label = f"{name} (device side)" if hatch else name
            ax.bar(x + (j - 1.5) * width, vals, width, color=colors[name], hatch=hatch, label=label)
        ax.set_yscale("log")
        ax.set_xticks(x, [f"m={m}, K={k}" for m, k in scales])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(METHOD_NAMES), fontsize=9, frameon=False)
    fig.suptitle("Clustering cost per round, LeNet-5 (d = 61,706); LCFed's PCA fit amortized over its refit period")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="100:10,1000:100", help="m:K pairs, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the Ray ServerActor uses engine.torch_threads = 1)")
    ap.add_argument("--rank", type=int, default=50, help="LCFed's D")
    ap.add_argument("--sample-size", type=int, default=100, help="LCFed's S_d, models in the PCA (capped at m)")
    ap.add_argument("--refit-period", type=int, default=100,
                    help="rounds per PCA fit R (Alg. 1 fits M once per run; 100 = a 100-round run)")
    ap.add_argument("--assign-m", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="m=100/K=10 only, 2 repeats (smoke run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.scales, args.repeats = "100:10", 2
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()  # the machine may be shared: say how busy it was
    scales = [(int(a), int(b)) for a, b in (s.split(":") for s in args.scales.split(","))]
    net_init = build_network("lenet5", INPUT_SHAPE, 10, 0)

    rows = []
    for m, k in scales:
        for name in METHOD_NAMES:
            rows.append(measure_cell(name, m, k, net_init, args))
            r = rows[-1]
            print(f"  measured {name} m={m} K={k}: aggregate {r['aggregate_s'] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    mic = micro(args, net_init)

    print(f"Clustering cost per steady round, LeNet-5 d={rows[0]['dim']:,}, torch threads={args.threads}, "
          f"LCFed D={args.rank}, S_d={args.sample_size}, PCA fit amortized over R={args.refit_period} rounds")
    hdr = (f"{'m':>5} {'K':>4} {'method':<7} {'clust FLOPs':>11} {'vs FeSEM':>9} {'clust ms':>9} {'vs FeSEM':>9} "
           f"{'aggregate ms':>12} {'vs FeSEM':>9} {'cold s':>7} {'up B':>8} {'down B':>8}")
    print(hdr)
    for m, k in scales:
        cell = [r for r in rows if (r["m"], r["K"]) == (m, k)]
        base = next(r for r in cell if r["method"] == "fesem")
        for r in cell:
            fl = r["clustering_flops_server"] or r["clustering_flops_device"]
            wall = r.get("clustering_amortized_s", r["clustering_s"]) or r.get("device_clustering_total_s", 0.0)
            side = "*" if r["method"] == "ifca" else " "
            r["clustering_ratio_flops"] = base["clustering_flops_server"] / fl if fl else float("inf")
            r["clustering_ratio_wall"] = (base["clustering_s"] / wall) if wall else float("inf")
            cpu = r.get("clustering_amortized_s_cpu", r["clustering_s_cpu"]) or r.get("device_clustering_total_s_cpu", 0.0)
            r["clustering_ratio_cpu"] = (base["clustering_s_cpu"] / cpu) if cpu else float("inf")
            r["aggregate_ratio"] = base["aggregate_s"] / r["aggregate_s"]
            print(f"{m:>5} {k:>4} {r['method']:<7} {human(fl):>10}{side} {r['clustering_ratio_flops']:>8.1f}x "
                  f"{wall * 1e3:>8.1f}{side} {r['clustering_ratio_wall']:>8.1f}x {r['aggregate_s'] * 1e3:>12.1f} "
                  f"{r['aggregate_ratio']:>8.1f}x {r['cold_start_s']:>7.2f} {human(r['up_bytes']):>8} {human(r['down_bytes']):>8}")
    print("  * IFCA: device-side clustering (every participant evaluates K models on its data), summed over m devices;"
          " 'vs FeSEM' = how many times cheaper than FeSEM's server step (<1 = costlier)")
    lc = [r for r in rows if r["method"] == "lcfed"]
    for r in lc:
        print(f"  LCFed m={r['m']}: steady clustering {r['clustering_s'] * 1e3:.2f} ms, PCA fit of S_d models "
              f"{r['pca_fit_s'] * 1e3:.0f} ms + projecting m uploads and K centers {r['refit_project_s'] * 1e3:.0f} ms per refit, "
              f"new-M broadcast {human(r['refit_down_bytes'], 'B')} per refit")

    targets: list[dict[str, Any]] = []

    def target(name: str, value: float, limit: float, below: bool, text: str) -> None:
        ok = value < limit if below else value >= limit
        targets.append({"name": name, "value": value, "target": f"{'<' if below else '>='} {limit:g}", "met": ok})
        print(f"{text}  {'OK' if ok else 'MISSED'}")

    target("assign_ms", mic["assign_s"] * 1e3, 10.0, True,
           f"assignment m={mic['assign_m']:,} K={mic['assign_K']} D={mic['assign_D']}: {mic['assign_s'] * 1e3:.2f} ms "
           f"(CPU {mic['assign_s_cpu'] * 1e3:.2f} ms)  (target < 10 ms)")
    target("pca_fit_s", mic["pca_fit_s"], 1.0, True,
           f"PCA fit of 100 LeNet-5 models, D={mic['pca_D']}: {mic['pca_fit_s']:.3f} s (CPU {mic['pca_fit_s_cpu']:.3f} s) "
           f"on {args.threads} thread(s), "
           f"{mic['pca_fit_s_all_cores']:.3f} s on {mic['all_cores']}  (target < 1 s)")
    for r in (r for r in lc if r["m"] >= 1000):
        target(f"lcfed_vs_fesem_flops_m{r['m']}", r["clustering_ratio_flops"], 100.0, False,
               f"LCFed vs FeSEM at m={r['m']}, K={r['K']}: clustering {r['clustering_ratio_flops']:.0f}x fewer FLOPs  (target >= 100x)")
        target(f"lcfed_vs_fesem_wall_m{r['m']}", r["clustering_ratio_wall"], 100.0, False,
               f"LCFed vs FeSEM at m={r['m']}, K={r['K']}: clustering {r['clustering_ratio_wall']:.0f}x less wall, "
               f"{r['clustering_ratio_cpu']:.0f}x less CPU time (whole aggregate: {r['aggregate_ratio']:.1f}x)  (target >= 100x)")

    print(f"load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "clustering_cost.png"
    plot(rows, scales, png)
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "loadavg_start": load0, "loadavg_end": os.getloadavg()}
    (out / "clustering_cost.json").write_text(json.dumps({"args": vars(args), "meta": meta, "rows": rows, "micro": mic, "targets": targets}, indent=2) + "\n")
    print(f"wrote {out / 'clustering_cost.json'} and {png}")


if __name__ == "__main__":
    main()
