"""Workload W1 on Flower's simulation engine vs our in-process runner and our Ray engine.

W1 (as in ``overhead.py``): 100 devices from a 5,000-sample subset of MNIST, Dirichlet(0.1),
LeNet-5, FedAvg with 25 devices per round x 5 local steps x batch 32 (SGD, lr 0.01), 30 rounds,
1 torch thread per worker, 2 workers, evaluation of every device after the last round.

- Ours: ``overhead.measure`` (in-process on 1 thread = the plain loop, in-process on its default
  worker threads = one per CPU, Ray with 2 device actors on the private Ray lcfed starts, and the same
  on a head already running, ``ray start --head`` as ``lcfed head`` starts it, from a driver process
  of its own), timed from before the engine's imports and start-up to the end of its shutdown; the
  Ray rows say where their wall went (:attr:`RayEngine.timings`: Ray's start or attach, data,
  placement group, shards, actors, close, Ray's shutdown; then the rounds).
- Flower: ``flower_w1.py`` in its own venv (``--venv``, created here on first use with
  ``flwr[simulation]`` and torch 2.14.1 / torchvision 0.29.1; Flower pins its own Ray), run by
  ``flwr.simulation.run_simulation`` with 100 supernodes and 2 Ray actors of 1 CPU. Its ClientApp
  imports our LeNet-5 and ``local_update`` and trains the same devices in the same rounds on the
  same partition (spec file written here with our code), so both do the same work. Flower's total
  wall is timed inside its process the same way as ours (from before importing Flower; torch and
  numpy already imported); the wall of the whole subprocess (interpreter start and all imports
  included) is reported too.

Round time = mean over rounds after the first (the last includes the evaluation). Targets: our
total wall <= 0.5x Flower's (0.35x on the running head); Ray round time <= 1.15x in-process.

    python benchmarks/flower_overhead.py --data-dir ~/.cache/lcfed [--rounds 30] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402
from sampling import BackgroundSampler  # noqa: E402
from scale import TreeMemory  # noqa: E402

from lcfed.config import ExperimentConfig  # noqa: E402
from lcfed.methods.base import select_devices  # noqa: E402
from lcfed.run.setup import prepare  # noqa: E402
from lcfed.run.sources import load  # noqa: E402

TORCH_PINS = ("torch==2.14.1", "torchvision==0.29.1")


# --- Flower's venv -----------------------------------------------------------------------------


def pip_install(py: Path, version: str, log: Path) -> tuple[bool, str]:
    """Install flwr[simulation]==version (+ our torch pins); return (ok, pip's error lines)."""
    cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", f"flwr[simulation]=={version}", *TORCH_PINS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
    # pip's "(from versions: ...)" lists every release: keep the reason, not the list
    errors = [re.sub(r" \(from versions:.*\)", "", line) for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    return proc.returncode == 0, "\n".join(errors)


def ensure_flower_venv(venv: Path, version: str, fallback: str | None, base_python: str, log: Path) -> dict[str, Any]:
    """The venv's python and the Flower version in it, creating/installing it once (stamp file)."""
    py, stamp = venv / "bin" / "python", venv / ".installed"
    wanted = [version] + ([fallback] if fallback and fallback != version else [])
    if stamp.is_file():
        done: dict[str, Any] = json.loads(stamp.read_text())
        if done.get("flwr") in wanted:
            return done
    if not py.exists():
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    info: dict[str, Any] = {"requested": version, "failures": {}}
    t0 = time.perf_counter()
    for v in wanted:
        print(f"installing flwr[simulation]=={v} into {venv} (log: {log}) ...", file=sys.stderr, flush=True)
        ok, errors = pip_install(py, v, log)
        if ok:
            info.update(flwr=v, install_s=time.perf_counter() - t0)
            stamp.write_text(json.dumps(info, indent=2) + "\n")
            return info
        info["failures"][v] = errors
        print(f"flwr=={v} did not install:\n{errors}", file=sys.stderr, flush=True)
    sys.exit(f"flower_overhead: Flower could not be installed: {json.dumps(info['failures'], indent=2)}")


# --- the shared workload -----------------------------------------------------------------------


def write_spec(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """Our W1 partition, samples, init and per-round selections, for the Flower app to use as is."""
    cfg = cast(ExperimentConfig, overhead.w1(args, "local"))
    ds = load(cfg)
    setup = prepare(cfg, ds)
    part, fed = setup.partition, setup.federation
    m = fed.num_devices

    def flat(groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(groups).astype(np.int64), np.cumsum([0] + [len(g) for g in groups]).astype(np.int64)

    train_idx, train_off = flat([np.asarray(part.train[d]) for d in range(m)])
    test_idx, test_off = flat([np.asarray(part.test[d]) for d in range(m)])
    selections = np.array([select_devices(m, cfg.train.participation, cfg.seed, r) for r in range(cfg.train.rounds)])
    np.savez(
        path, x=setup.scaling.apply(ds.x).numpy(), y=np.asarray(ds.y, dtype=np.int64), train_idx=train_idx, train_off=train_off,
        test_idx=test_idx, test_off=test_off, init=fed.init.numpy(), selections=selections, num_devices=m,
        rounds=cfg.train.rounds, seed=cfg.seed, lr=cfg.train.lr, batch_size=cfg.train.batch_size,
        local_steps=int(cfg.train.local_steps or 0), torch_threads=cfg.engine.torch_threads, actors=args.actors,
        model=cfg.model.name, input_shape=np.array(ds.input_shape), num_classes=fed.num_classes,
    )
    return {"devices": m, "per_round": int(selections.shape[1]), "samples": len(ds.y)}


def run_flower(py: Path, spec: Path, out_dir: Path) -> dict[str, Any]:
    out = out_dir / "flower_w1.out.json"
    log = out_dir / "flower_w1.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(ROOT), LCFED_FLOWER_SPEC=str(spec), LCFED_FLOWER_OUT=str(out))
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen([str(py), str(HERE / "flower_w1.py")], cwd=str(ROOT), env=env, stdout=f, stderr=subprocess.STDOUT)
        with TreeMemory(psutil.Process(proc.pid), 0.2) as mem:
            rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0 or not out.is_file():
        tail = log.read_text().splitlines()[-30:]
        sys.exit(f"flower_overhead: the Flower run failed (exit {rc}); last lines of {log}:\n" + "\n".join(tail))
    res = json.loads(out.read_text())
    rounds = res["round_s"][1:] or res["round_s"]
    return {"engine": "flower", "round_s": float(np.mean(rounds)), "round_s_std": float(np.std(rounds)),
            "wall_s": res["wall_s"], "process_wall_s": wall, "until_round0_s": res.get("startup_s"), "round0_s": res["round_s"][0],
            "peak_rss_mb": mem.peak_rss * 1024, "acc_mean": res.get("acc_mean"), "evaluated": res.get("evaluated"),
            "train_loss": res.get("train_loss", []),
            "versions": {k: res[k] for k in ("flwr", "ray", "torch")}}


class _LossRecorder(overhead.PeakRSS):
    """overhead's per-round observer, also keeping each round's training loss (to compare with Flower's)."""

    losses: list[float] = []

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        super().on_round(rnd, metrics, stats)
        _LossRecorder.losses.append(float(metrics["train_loss"]))


def ours(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """``overhead.measure``, with this process tree's memory sampled the same way as Flower's and the
    per-round training losses recorded (``measure`` builds its observer from ``overhead.PeakRSS``)."""
    _LossRecorder.losses = []
    plain, overhead.PeakRSS = overhead.PeakRSS, _LossRecorder  # type: ignore[misc]
    try:
        with TreeMemory(psutil.Process(os.getpid()), 0.2) as mem:
            row = overhead.measure(args, engine)
    finally:
        overhead.PeakRSS = plain  # type: ignore[misc]
    return {**row, "peak_rss_mb_at_rounds": row["peak_rss_mb"], "peak_rss_mb": mem.peak_rss * 1024,
            "train_loss": list(_LossRecorder.losses)}


class Trees(BackgroundSampler):
    """Peak RSS (MB) of several process trees together (a driver and the head whose raylet runs its actors)."""

    def __init__(self, pids: list[int], every: float) -> None:
        self.pids, self.every, self.peak = pids, every, 0.0
        super().__init__()

    def sample(self) -> None:
        total = 0.0
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                total += overhead.tree_rss_mb(psutil.Process(pid))
        self.peak = max(self.peak, total)


def ours_on_head(args: argparse.Namespace) -> dict[str, Any]:
    """W1 on a Ray head that is already running (``ray start --head`` of 2 CPUs, as ``lcfed head`` starts it), from
    a driver process of its own that attaches as ``lcfed run --engine ray`` does; timed as :func:`ours`. Peak RSS:
    the driver's and the head's process trees together (the actors are the head's raylet's children)."""
    from tests.raycluster import LocalCluster

    # the user's HOME for the head and the driver, as `lcfed head` and `lcfed run` have it: both find this machine's
    # kernel fingerprint in ~/.cache/lcfed (the test cluster gives each node a HOME of its own, where the first run
    # would compute it again, ~4 s)
    cluster = LocalCluster.start(args.actors, [], dashboard=False, object_store_mb=256, env={"HOME": str(Path.home())})
    try:
        assert cluster.head is not None
        cmd = [sys.executable, str(Path(__file__).resolve()), "--on-head", "--data-dir", args.data_dir, "--dataset",
               args.dataset, "--subset", str(args.subset), "--rounds", str(args.rounds), "--actors", str(args.actors)]
        proc = subprocess.Popen(cmd, env=cluster.client_env(Path.home(), RAY_ADDRESS=cluster.gcs), cwd=str(ROOT), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with Trees([cluster.head.proc.pid, proc.pid], 0.2) as mem:
            out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"flower_overhead: the run on the head failed ({proc.returncode}):\n{err[-3000:]}")
        row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return {**row, "engine": "ray-head", "peak_rss_mb": mem.peak}
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    overhead.add_w1_arguments(ap)
    ap.add_argument("--venv", default=str(HERE / ".flower-venv"), help="Flower's own venv (created on first use)")
    ap.add_argument("--flwr-version", default="1.42.0")
    ap.add_argument("--flwr-fallback", default="1.41.0", help="tried when --flwr-version does not install ('' = none)")
    ap.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable), help="interpreter for the venv")
    ap.add_argument("--quick", action="store_true", help="2 rounds (smoke run; start-ups dominate)")
    ap.add_argument("--on-head", action="store_true", help=argparse.SUPPRESS)  # the driver of ours_on_head
    args = ap.parse_args()
    if args.on_head:
        print(json.dumps(ours(args, "ray-head")))
        return
    if args.quick:
        args.rounds = 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    load0 = os.getloadavg()  # the machine may be shared: say how busy it was
    venv = Path(args.venv)
    install = ensure_flower_venv(venv, args.flwr_version, args.flwr_fallback or None, args.python, out / "flower_install.log")
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "w1_spec.npz"
        shape = write_spec(args, spec)
        rows = [ours(args, "local-1"), ours(args, "local"), ours(args, "ray"), ours_on_head(args),
                run_flower(venv / "bin" / "python", spec, out)]
    plain, local, ray_row, head_row, flower = rows
    print(f"W1 ({args.dataset} subset {args.subset}, {shape['devices']} devices, {shape['per_round']}/round x 5 steps x batch 32, "
          f"{args.rounds} rounds, {args.actors} workers); Flower {flower['versions']['flwr']} (Ray {flower['versions']['ray']})")
    print(f"{'engine':<8} {'s/round':>9} {'vs loop':>9} {'wall s':>8} {'vs Flower':>10} {'peak RSS MB':>12} {'acc':>7}")
    for r in rows:
        print(f"{r['engine']:<8} {r['round_s']:>9.4f} {r['round_s'] / plain['round_s']:>9.2f} {r['wall_s']:>8.1f} "
              f"{r['wall_s'] / flower['wall_s']:>10.2f} {r['peak_rss_mb']:>12.0f} {r['acc_mean']:>7.4f}")
    for r in (ray_row, head_row):  # where the wall went: the engine's start-up phases, the rounds, the shutdown
        parts = {**r["timings"], "rounds": r["rounds_s"]}
        rest = r["wall_s"] - sum(parts.values())
        print(f"{r['engine']} wall {r['wall_s']:.1f} s = " + " + ".join(f"{k} {v:.2f}" for k, v in parts.items())
              + f" + other {rest:.2f}")
    print(f"Flower: subprocess wall (interpreter + imports included) {flower['process_wall_s']:.1f} s; "
          f"{flower['until_round0_s']:.1f} s until round 0 is configured; round 0 (its Ray and actors start meanwhile) "
          f"{flower['round0_s']:.1f} s")
    # the same work: the same devices, batches and init give the same losses round by round
    diff = max((abs(a - b) for r in (plain, ray_row, head_row, flower) for a, b in zip(local["train_loss"], r["train_loss"], strict=True)),
               default=float("nan"))
    print(f"same work: largest per-round train-loss difference from the in-process run {diff:.2e} "
          f"(over {len(local['train_loss'])} rounds); final acc {local['acc_mean']:.4f} / {ray_row['acc_mean']:.4f} / "
          f"{flower['acc_mean']:.4f}")
    targets = []
    for r in (plain, local, ray_row, head_row):
        ratio = r["wall_s"] / flower["wall_s"]
        goal = 0.35 if r is head_row else 0.5
        targets.append({"name": f"{r['engine']}_wall_vs_flower", "value": ratio, "target": f"<= {goal}", "met": ratio <= goal})
    for base in (plain, local):
        ratio = ray_row["round_s"] / base["round_s"]
        targets.append({"name": f"ray_round_vs_{base['engine']}", "value": ratio, "target": "<= 1.15", "met": ratio <= 1.15})
    for t in targets:
        print(f"{t['name']}: {t['value']:.2f}  (target {t['target']})  {'OK' if t['met'] else 'MISSED'}")
    print(f"load average at start {load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")

    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
            "cpus": os.cpu_count(), "loadavg_start": load0, "loadavg_end": os.getloadavg(), "flower_install": install}
    (out / "flower_overhead.json").write_text(json.dumps({"args": vars(args), "meta": meta, "rows": rows, "targets": targets,
                                                         "max_train_loss_diff": diff},
                                                         indent=2) + "\n")
    print(f"wrote {out / 'flower_overhead.json'}")


if __name__ == "__main__":
    main()
