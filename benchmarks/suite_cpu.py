"""Where a command's CPU time goes, by kind of process: runs the command (default: the CI suite, ``make test``)
and samples every process of this machine once a second from /proc, each process's CPU time counted once (its
last sample), and counts the processes started, by what they are: the test processes, ``lcfed`` commands and
other Python children, Ray's workers (device, server and trial actors, idle workers), Ray's daemons (GCS,
raylet, dashboard and its agents, log monitor), MLflow tracking servers, moto's S3 server, the rest.

A process that lives less than the sampling period may be missed; Ray's worker processes name themselves
``ray::<what they run>`` (a worker's CPU before it took its first task counts as ``ray::IDLE``).

    python benchmarks/suite_cpu.py [--] [COMMAND ...]      # default: make test
"""

from __future__ import annotations

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


def sample(seen: dict[int, tuple[str, float]], me: int) -> None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
        pid = int(entry.name)
        if cmd or pid in seen:
            seen[pid] = (kind_of(cmd) if cmd else seen[pid][0], cpu)


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    command = argv or ["make", "test"]
    before: dict[int, tuple[str, float]] = {}
    sample(before, os.getpid())
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.wait(1.0):
            sample(seen, os.getpid())

    thread = threading.Thread(target=poll, daemon=True)
    start = time.monotonic()
    thread.start()
    code = subprocess.call(command)
    wall = time.monotonic() - start
    done.set()
    thread.join()
    sample(seen, os.getpid())
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
