"""A watchdog process that closes a run as FAILED when the process logging it dies without closing it.

Separate from the observer because the sweep's parent run, ``lcfed compare`` and ``lcfed reproduce``
guard their own runs with it too. The watchdog imports MLflow only if it has a run to close.
"""

from __future__ import annotations

import subprocess
import sys

#: The guard (run as ``python -c``): blocks on stdin until its starter closes it (or dies, which closes
#: it too); ``q`` means the run was closed properly. Otherwise the run (and its RUNNING children) is
#: still open with nobody to close it: mark it FAILED with the reason. MLflow is imported only then.
_GUARD = """import sys
uri, run_id, hint = sys.argv[1], sys.argv[2], sys.argv[3]
if sys.stdin.buffer.read().endswith(b"q"):
    sys.exit(0)
import mlflow
client = mlflow.MlflowClient(tracking_uri=uri)
run = client.get_run(run_id)
children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
reason = ("the lcfed process ended without closing this run (killed, e.g. kill -9 or out of memory, "
          "or its Ray node died); the metrics logged until then are kept" + hint)
for r in [run, *children]:
    if r.info.status == "RUNNING":
        client.set_tag(r.info.run_id, "failure_reason", reason)
        client.set_terminated(r.info.run_id, "FAILED")
"""


class RunGuard:
    """A small process that marks a run FAILED, with the reason, if this process dies without closing
    it (``kill -9``, the OOM killer, Ray ending the driver when its raylet dies): no run stays RUNNING
    forever. :meth:`release` once the run is closed (or deliberately left open for a replay)."""

    def __init__(self, uri: str, run_id: str, hint: str = "") -> None:
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", _GUARD, uri, run_id, hint],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or a signal to our process group must not reach it
        )

    def release(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(b"q")
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, ValueError):
            pass
        except Exception:  # subprocess.TimeoutExpired: it has nothing left to do
            proc.kill()
