"""Console lines of ``lcfed run`` (in-process and on Ray) and ``lcfed sweep`` at each verbosity: how many lines
a user reads, and how many of them Ray, Tune and MLflow printed by themselves.

Each command runs in a fresh process in a scratch directory (a sqlite tracking store there) on the demo
config cut to 8 devices and 3 rounds (``method.rank=4``); stdout and stderr are counted together, as a
terminal shows them (without one, progress is plain lines: docs/run.md).

    .venv/bin/python benchmarks/console_lines.py                      # -q, default, -v
    .venv/bin/python benchmarks/console_lines.py --levels default     # e.g. a checkout without -q / -v
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/console_lines.py --levels default,q

Prints a table (lines / of which library lines) and writes ``benchmarks/results/console_lines.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: lines Ray, Tune and MLflow print by themselves (docs/run.md, "How much a command prints")
CHATTER = re.compile(r"Token authentication is enabled|Started a local Ray instance|\d\d:\d\d:\d\d.*INFO |"
                     r"\d\d:\d\d:\d\d,\d+\s+(INFO|WARNING)|Configuration for experiment|View detailed results|"
                     r"tensorboard --logdir|🏃|🧪|\(\w+ pid=\d+\)|^[│╭├╰]")
FLAGS = {"q": ["-q"], "default": [], "v": ["-v"]}


def commands(work: Path, level: str) -> dict[str, list[str]]:
    base = ["--config", str(ROOT / "configs" / "demo.yaml"), "--set", "train.rounds=3", "--set", "data.num_devices=8",
            "--set", "method.rank=4", "--set", f"tracking.uri=sqlite:///{work / 'mlflow.db'}", *FLAGS[level]]
    return {"run (local)": ["run", *base],
            "run (ray)": ["run", *base, "--engine", "ray"],
            "sweep (2 trials)": ["sweep", *base, "--space", "mu_lambda.yaml", "--num-samples", "2", "--scheduler",
                                 "fifo", "--storage", str(work / f"tune-{level}"), "--name", f"lines-{level}"]}


def count(argv: list[str], work: Path) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "tune_jobs", *argv], cwd=work, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.environ.get(
                              "PYTHONPATH", str(ROOT))})
    lines = (proc.stdout + proc.stderr).splitlines()
    chatter = [line for line in lines if CHATTER.search(line)]
    return {"exit": proc.returncode, "lines": len(lines), "library_lines": len(chatter), "library": chatter}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="q,default,v", help="comma-separated: q, default, v (default: all three)")
    args = ap.parse_args()
    levels = [lvl.strip() for lvl in args.levels.split(",") if lvl.strip()]
    out: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="lcfed-lines-") as tmp:
        work = Path(tmp)
        for level in levels:
            for name, argv in commands(work, level).items():
                out.setdefault(name, {})[level] = count(argv, work)
    print(f"{'command':<18} " + " ".join(f"{lvl:>16}" for lvl in levels) + "   (lines, of which library lines)")
    for name, by_level in out.items():
        cells = []
        for lvl in levels:
            r = by_level[lvl]
            cells.append(f"{r['lines']:>5} ({r['library_lines']:>2})" + ("" if r["exit"] == 0 else f" rc={r['exit']}"))
        print(f"{name:<18} " + " ".join(f"{c:>16}" for c in cells))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "console_lines.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
