"""Where a command's CPU time goes, by kind of process: runs the command (default: the CI suite, ``make test``)
and samples every process of this machine once a second from /proc, each process's CPU time counted once (its
last sample), and counts the processes started, by what they are: the test processes, ``lcfed`` commands and
other Python children, Ray's workers (device, server and trial actors, idle workers), Ray's daemons (GCS,
raylet, dashboard and its agents, log monitor), MLflow tracking servers, moto's S3 server, the rest.

A process that lives less than the sampling period may be missed; Ray's worker processes name themselves
``ray::<what they run>`` (a worker's CPU before it took its first task counts as ``ray::IDLE``).

    python benchmarks/suite_cpu.py [--tree] [--] [COMMAND ...]      # default: make test

``--tree`` counts only the command's own processes (this process becomes their subreaper, so the daemons a
``ray start`` leaves behind stay in its tree): figures that hold while other work shares the machine.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # first match wins: (kind, words of the command line)
    ("Ray worker: device actor", ("ray::DeviceActor", "ray::DeviceHost")),
    ("Ray worker: server actor", ("ray::ServerActor", "ray::RayServer")),
    ("Ray worker: Tune trial", ("ray::ImplicitFunc", "ray::_Inner", "ray::run_trial")),
    ("Ray worker: other", ("ray::",)),
    ("Ray daemons (GCS, raylet, dashboard, agents, monitors)",
     ("gcs_server", "raylet", "dashboard", "ray/_private", "runtime_env", "ray start", "ray/autoscaler",
      "log_monitor", "ray-dashboard", "default_worker.py")),
    ("MLflow tracking server", ("mlflow server", "uvicorn", "gunicorn", "mlflow.server", "huey")),
    ("S3 server (moto)", ("moto",)),
    ("lcfed commands (python -m tune_jobs, .venv/bin/lcfed)", ("-m tune_jobs", "bin/lcfed ")),
    ("test processes (pytest and its xdist workers)", ("-m pytest", "exec(eval(sys.stdin.readline()))")),
    ("other Python", ("python",)),
)


def kind_of(cmdline: str) -> str:
    return next((kind for kind, words in KINDS if any(w in cmdline for w in words)), "other")


PR_SET_CHILD_SUBREAPER = 36


def sample(seen: dict[int, tuple[str, float]], me: int, tree: bool = False, keep: int = 0) -> None:
    """Each process's CPU so far; with ``tree``, only this process's descendants, and the orphans it inherited
    as their subreaper are reaped once counted (all but ``keep``, the command, which its caller waits for)."""
    procs: dict[int, tuple[int, str, float]] = {}
    zombies = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        procs[int(entry.name)] = (int(fields[1]), cmd, (int(fields[11]) + int(fields[12])) / TICK)  # utime + stime
        if tree and fields[0] == "Z" and int(fields[1]) == me and int(entry.name) != keep:
            zombies.append(int(entry.name))
    for pid, (_, cmd, cpu) in procs.items():
        if tree and not _descends(pid, me, procs):
            continue
        if cmd or pid in seen:
            seen[pid] = (kind_of(cmd) if cmd else seen[pid][0], cpu)
    for pid in zombies:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _descends(pid: int, ancestor: int, procs: dict[int, tuple[int, str, float]]) -> bool:
    for _ in range(64):
        parent = procs[pid][0] if pid in procs else 0
        if parent == ancestor:
            return True
        if parent <= 1:
            return False
        pid = parent
    return False


def main() -> int:
    argv = sys.argv[1:]
    tree = argv[:1] == ["--tree"]
    if tree:
        argv = argv[1:]
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    command = argv or ["make", "test"]
    before: dict[int, tuple[str, float]] = {}
    sample(before, os.getpid(), tree)
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()
    start = time.monotonic()
    child = subprocess.Popen(command)

    def poll() -> None:
        while not done.wait(1.0):
            sample(seen, os.getpid(), tree, child.pid)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    code = child.wait()
    wall = time.monotonic() - start
    done.set()
    thread.join()
    sample(seen, os.getpid(), tree)
    totals: Counter[str] = Counter()
    started: Counter[str] = Counter()
    for pid, (kind, cpu) in seen.items():
        totals[kind] += cpu - (before[pid][1] if pid in before else 0.0)
        started[kind] += pid not in before
    cpu_all = sum(totals.values())
    print(f"\n{' '.join(command)}: exit {code}, wall {wall:.0f} s, CPU {cpu_all:.0f} s on {os.cpu_count()} cores "
          f"({cpu_all / wall / (os.cpu_count() or 1):.0%} busy)")
    print(f"  {'CPU':>8}    {'share':>5}  {'processes':>9}  kind")
    for kind, cpu in totals.most_common():
        print(f"  {cpu:8.0f} s  {cpu / cpu_all:5.1%}  {started[kind]:9d}  {kind}")
    return code


if __name__ == "__main__":
    sys.exit(main())
