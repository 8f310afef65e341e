"""Sweep disk use: the same ``lcfed sweep`` with every checkpoint kept (``--keep-checkpoints`` = the rounds,
the behaviour before the setting existed) and with the default (2), each into a fresh storage directory.

Both are whole ``lcfed sweep`` commands in subprocesses (FIFO: every trial runs and checkpoints every
round) with MLflow tracking to a fresh sqlite store in a temp dir. Prints, per side, the bytes of the
sweep's Tune directory (as ``du -sb``; ``du -sh`` too), the checkpoints each trial kept and the wall time.

    .venv/bin/python benchmarks/sweep_disk.py            # 4 trials x 4 rounds of configs/digits_dirichlet.yaml
    .venv/bin/python benchmarks/sweep_disk.py --quick    # 2 trials x 3 rounds of configs/demo.yaml
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def du(path: Path) -> tuple[int, str]:
    """(bytes, human) of ``path`` as ``du -sb`` / ``du -sh`` count them."""
    exact = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    human = subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    return int(exact), human


def sweep(work: Path, label: str, keep: int, args: argparse.Namespace) -> None:
    storage = work / label
    cmd = [sys.executable, "-m", "tune_jobs.cli", "sweep", "--config", args.config, "--space", "mu_lambda.yaml",
           "--num-samples", str(args.trials), "--scheduler", "fifo", "--set", f"train.rounds={args.rounds}",
           "--set", f"tracking.uri=sqlite:///{work / 'mlflow.db'}", "--name", "disk", "--storage", str(storage),
           "--keep-checkpoints", str(keep)]
    t0 = time.monotonic()
    with open(work / f"{label}.log", "wb") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{label}: lcfed sweep exited {proc.returncode}; see {work / label}.log")
    nbytes, human = du(storage / "disk")
    kept = sorted(len(list(t.glob("checkpoint_*"))) for t in (storage / "disk").glob("run_trial*"))
    print(f"{label:<8} keep {keep:>2}: {nbytes / 1e6:7.1f} MB ({human}), checkpoints per trial {kept}, "
          f"{wall:.0f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/digits_dirichlet.yaml")
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--keep", type=int, default=2, help="the setting to compare with keeping every checkpoint")
    p.add_argument("--quick", action="store_true", help="2 trials x 3 rounds of configs/demo.yaml")
    args = p.parse_args()
    if args.quick:
        args.config, args.trials, args.rounds = "configs/demo.yaml", 2, 3
    print(f"{args.trials} trials x {args.rounds} rounds of {args.config}, --scheduler fifo", flush=True)
    with tempfile.TemporaryDirectory(prefix="lcfed-disk-") as tmp:
        work = Path(tmp)
        sweep(work, "every", args.rounds, args)
        sweep(work, "default", args.keep, args)


if __name__ == "__main__":
    main()
