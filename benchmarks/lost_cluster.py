"""How fast ``lcfed run --engine ray`` notices that its private Ray is gone: the raylet is killed (by its
process id, found among the run's children) once ``--after`` rounds are in MLflow; the script times the
kill to the ``lcfed: run failed`` line on stderr and to the process's exit, and reads the exit code and the
MLflow run's status and failure reason. Then ``--resume`` (the command the line gives) is run and timed.

    .venv/bin/python benchmarks/lost_cluster.py               # 8 devices, 15 rounds, raylet killed after 3
    .venv/bin/python benchmarks/lost_cluster.py --repeats 3

Before lcfed watched the private Ray's processes, the run was marked FAILED ~75 s after the kill (issue 28)
with only Ray's own 'Failed to connect to GCS within 60 seconds'.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import mlflow
import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _run(tmp: Path, rounds: int) -> tuple[subprocess.Popen[str], str]:
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    sets = ["data.num_devices=8", f"train.rounds={rounds}", "train.local_steps=2", "method.num_clusters=3",
            "method.rank=4", "engine.num_cpus=2", f"tracking.uri={uri}", "tracking.experiment=lost",
            "checkpoint.dir=ck"]
    args = [sys.executable, "-m", "tune_jobs", "run", "-q", "--engine", "ray"]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), uri


def _rounds_logged(client: Any) -> int:
    exp = client.get_experiment_by_name("lost")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    return len(client.get_metric_history(runs[0].info.run_id, "train_loss")) if runs else 0


def once(rounds: int, after: int) -> dict[str, Any]:
    """One run: its raylet killed after ``after`` rounds; the timings, exit code and MLflow status."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        proc, uri = _run(tmp, rounds)
        client = mlflow.MlflowClient(tracking_uri=uri)
        while proc.poll() is None and _rounds_logged(client) < after:
            time.sleep(0.2)
        raylet = next(c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "raylet")
        killed = time.monotonic()
        raylet.kill()
        line: dict[str, Any] = {}

        def read() -> None:
            assert proc.stderr is not None
            for text in proc.stderr:
                line.setdefault("stderr", []).append(text.rstrip("\n"))
                if text.startswith("lcfed: run failed"):
                    line.update(text=text.strip(), seconds=time.monotonic() - killed)

        reader = threading.Thread(target=read)
        reader.start()
        code = proc.wait(timeout=600)
        exited = time.monotonic() - killed
        reader.join()
        (run,) = client.search_runs([client.get_experiment_by_name("lost").experiment_id])
        reason = run.data.tags.get("failure_reason", "")
        command = shlex.split(reason[reason.index("`") + 1 : -1]) if "`" in reason else []
        t0 = time.monotonic()
        resumed = subprocess.run([sys.executable, "-m", "tune_jobs", *command[1:]], cwd=tmp, capture_output=True,
                                 text=True) if command else None
        return {"exit_code": code, "line_seconds": line.get("seconds"), "exit_seconds": exited,
                "status": run.info.status, "reason_is_the_line": line.get("text", "").endswith(reason) and bool(reason),
                "line": line.get("text"), "stderr": line.get("stderr", []), "resume_exit_code": resumed.returncode if resumed else None,
                "resume_seconds": time.monotonic() - t0 if resumed else None,
                "status_after_resume": client.get_run(run.info.run_id).info.status}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--after", type=int, default=3, help="rounds logged before the raylet is killed")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    load0 = os.getloadavg()[0]
    results = [once(args.rounds, args.after) for _ in range(args.repeats)]
    load1 = os.getloadavg()[0]
    print(f"{'exit':>4} {'line after kill':>16} {'exit after kill':>16} {'status':>8} {'reason = line':>14} "
          f"{'resume exit':>11} {'resume s':>9}")
    for r in results:
        line_s = f"{r['line_seconds']:.1f} s" if r["line_seconds"] is not None else "none"
        resume_s = f"{r['resume_seconds']:.1f}" if r["resume_seconds"] is not None else "-"
        print(f"{r['exit_code']:>4} {line_s:>16} {r['exit_seconds']:>14.1f} s {r['status']:>8} "
              f"{r['reason_is_the_line']!s:>14} {r['resume_exit_code']!s:>11} {resume_s:>9}")
    print(f"load average {load0:.1f} at the start, {load1:.1f} at the end (2 cores: above 2, timings are upper bounds)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "lost_cluster.json"
    out.write_text(json.dumps({"load": [load0, load1], "runs": results}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
