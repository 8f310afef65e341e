"""The README's quick start as a newcomer runs it: a clean clone, then every command of its two blocks in order,
as written, each timed (``make test`` excepted: it is CI's, docs/tests.md times it). ``mlflow ui`` is timed until
it answers at its address, then stopped. Prints a line per command and the total, install included.

    python benchmarks/quickstart.py [--keep DIR] [--warm-cache]

The clone is of this checkout's HEAD (commit first); ``--keep`` leaves it at DIR (default: a temporary directory,
removed). The install starts from empty uv and pip caches, as a newcomer's does; ``--warm-cache`` uses the
machine's, as a second clone on it would.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands(readme: str) -> list[str]:
    """The commands of the README's ``## Quick start`` bash blocks, comments stripped."""
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.splitlines():
            cmd = line.split("#", 1)[0].strip()
            if cmd:
                commands.append(cmd)
    return commands


def ui_ready_seconds(cmd: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> float:
    """Start ``cmd`` (an ``mlflow ui``), wait until its address answers, stop it; the seconds it took."""
    proc = subprocess.Popen(shlex.split(cmd), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < timeout:
            try:
                with urllib.request.urlopen("http://127.0.0.1:5000/health", timeout=2):
                    return time.perf_counter() - t0
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"{cmd}: exited with {proc.returncode} before answering") from None
                time.sleep(0.5)
        raise SystemExit(f"{cmd}: no answer at 127.0.0.1:5000 within {timeout:.0f} s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the UI's server and its workers
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", help="clone into this directory and keep it")
    ap.add_argument("--warm-cache", action="store_true", help="install from the machine's uv and pip caches")
    args = ap.parse_args()
    commands = [c for c in quick_start_commands((ROOT / "README.md").read_text()) if c != "make test"]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lcfed-quickstart-"))
    clone = work / "lcfed"
    total = 0.0
    env = dict(os.environ)
    if not args.warm_cache:  # empty caches, beside the clone (one filesystem: uv links from its cache)
        env.update(UV_CACHE_DIR=str(work / "uv-cache"), PIP_CACHE_DIR=str(work / "pip-cache"))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        for cmd in commands:
            if " ui " in f" {cmd} ":
                took = ui_ready_seconds(cmd, clone, env)
                what = "until it answers"
            else:
                t0 = time.perf_counter()
                done = subprocess.run(cmd, shell=True, cwd=clone, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
                took = time.perf_counter() - t0
                if done.returncode:
                    print(done.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{cmd}: exit {done.returncode} after {took:.0f} s")
                what = ""
            total += took
            print(f"{took:7.1f} s  {cmd}" + (f"  ({what})" if what else ""), flush=True)
        print(f"{total:7.1f} s  in all ({total / 60:.1f} min), install included")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
