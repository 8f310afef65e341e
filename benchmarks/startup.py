"""What each kind of process the suite and the users start costs before it does any work.

- the CLI: ``lcfed --version``, ``lcfed --help`` (neither imports torch, Ray nor MLflow), and ``lcfed config``
  (the config layer, no torch) as whole processes, against a bare ``python -c pass`` and ``python -c 'import
  torch'`` (what every command that trains pays);
- a Ray worker: a private ``ray.init`` as lcfed starts it, then one device-actor-like actor that imports the Ray
  engine's host module (torch included) until it answers, then the shutdown;
- a tracking server: ``lcfed``'s ``start_mlflow_server`` until its health check answers, then its stop.

Each figure is the median (min-max) of ``--repeat`` runs, measured in this process around the child's whole
life. On a loaded machine the figures grow with the load: compare rows of one run.

    python benchmarks/startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LCFED = [sys.executable, "-m", "tune_jobs"]


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def command(argv: list[str]) -> Callable[[], object]:
    return lambda: subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=300)


def ray_actor() -> None:
    """A private Ray as lcfed starts it (ray_init_options), one actor that imports the host module, shut down."""
    code = ("import ray\n"
            "ray.init(address='local', num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024**2,"
            " log_to_driver=False)\n"
            "@ray.remote\nclass Host:\n    def ready(self):\n        import actors.hosts  # noqa: F401\n"
            "        return True\n"
            "assert ray.get(Host.remote().ready.remote())\nray.shutdown()\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=300)


def ray_only() -> None:
    code = ("import ray\nray.init(address='local', num_cpus=2, include_dashboard=False,"
            " object_store_memory=256 * 1024**2, log_to_driver=False)\nray.shutdown()\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=300)


def mlflow_server() -> None:
    from tests.raycluster import free_port
    from tune_jobs.mlflow_server import start_mlflow_server, stop

    with tempfile.TemporaryDirectory() as store:
        proc, _ = start_mlflow_server("127.0.0.1", free_port(), store)
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    rows = [
        ("python -c pass", command([sys.executable, "-c", "pass"])),
        ("python -c 'import torch'", command([sys.executable, "-c", "import torch"])),
        ("lcfed --version", command([*LCFED, "--version"])),
        ("lcfed --help", command([*LCFED, "--help"])),
        ("lcfed config", command([*LCFED, "config"])),
        ("lcfed methods", command([*LCFED, "methods"])),
        ("private Ray: init + shutdown", ray_only),
        ("private Ray + 1 actor importing the host module", ray_actor),
        ("MLflow tracking server: start until healthy + stop", mlflow_server),
    ]
    print(f"start-up costs, {args.repeat} runs each, median (min-max) seconds; load {os.getloadavg()[0]:.1f}")
    for name, fn in rows:
        t = timed(fn, args.repeat)
        print(f"  {name:<52} {statistics.median(t):6.2f}  ({min(t):.2f}-{max(t):.2f})")


if __name__ == "__main__":
    main()
