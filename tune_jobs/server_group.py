"""A server process in its own process group, and the watchdog that stops that group when its starter is gone.

``mlflow server`` starts uvicorn, which starts workers: signalling the leader alone leaves the workers
holding the port, so :func:`stop` signals the whole group. A watchdog process ties the group to its
starter: however the starter ends (a signal it handles, or ``kill -9``, which no handler sees), the
group is stopped and the port freed. Stdlib only, so ``lcfed mlflow-server`` loads nothing more for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

#: seconds the server's group gets to stop on SIGTERM before SIGKILL, when the watchdog stops it
WATCHDOG_GRACE_S = 10.0

#: The watchdog (stdlib only, run with ``python -I -S -c``): reads the server's process group id from
#: stdin, a pipe whose only write end its starter holds. EOF on that pipe means the starter is gone,
#: however it died (the kernel closes a SIGKILLed process's pipes): SIGTERM the group, SIGKILL what is
#: left after the grace period. ``q`` on the pipe means :func:`stop` took the server down itself.
#: (PR_SET_PDEATHSIG on ``mlflow server`` is not enough: its uvicorn child outlives a SIGKILL of it, and
#: the signal follows the thread, not the process, that started it.)
_WATCHDOG = """# lcfed mlflow-server watchdog
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
line = sys.stdin.buffer.readline()
if not line.strip().isdigit():
    sys.exit(0)
pgid = int(line)
if sys.stdin.buffer.read(1) == b"q":
    sys.exit(0)
def alive():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
for sig, wait in ((signal.SIGTERM, float(sys.argv[1])), (signal.SIGKILL, 5.0)):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        break
    deadline = time.monotonic() + wait
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not alive():
        break
"""


class ServerProcess(subprocess.Popen):  # type: ignore[type-arg]
    """The ``mlflow server`` process, with the watchdog that stops its group if we die first."""

    watchdog: subprocess.Popen[bytes] | None = None


def _start_watchdog() -> subprocess.Popen[bytes] | None:
    """Start the watchdog before the server (no window where a server exists unwatched); None on
    platforms without process groups."""
    if not hasattr(os, "killpg"):
        return None
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(WATCHDOG_GRACE_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # out of the terminal's reach: Ctrl-C / hangup of our group must not stop it
    )


def _watch(watchdog: subprocess.Popen[bytes] | None, pgid: int) -> None:
    if watchdog is None or watchdog.stdin is None:
        return
    try:
        watchdog.stdin.write(f"{pgid}\n".encode())
        watchdog.stdin.flush()
    except OSError:  # it died; stop() and our signal handlers still cover the normal exits
        pass


def _release_watchdog(proc: subprocess.Popen[Any]) -> None:
    """Tell the watchdog the server is down (``q``) and reap it."""
    watchdog = getattr(proc, "watchdog", None)
    if watchdog is None:
        return
    try:
        if watchdog.stdin is not None:
            watchdog.stdin.write(b"q")
            watchdog.stdin.close()
    except OSError:
        pass
    try:
        watchdog.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def spawn_watched(cmd: list[str], env: dict[str, str], stdout: Any) -> ServerProcess:
    """Start ``cmd`` in its own process group (stdout and stderr to ``stdout``, no stdin), with the
    watchdog started first, so that no moment exists where the server runs unwatched."""
    watchdog = _start_watchdog()
    try:
        proc = ServerProcess(
            cmd,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: stop() and the watchdog reach uvicorn's workers too
        )
    except BaseException:
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        raise
    proc.watchdog = watchdog
    _watch(watchdog, proc.pid)
    return proc


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(proc: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """Stop a server started by :func:`start_mlflow_server`: SIGTERM its group, SIGKILL if it lingers.

    Only that process group is signalled (never other MLflow servers on the machine). A group whose
    leader already exited is still stopped: uvicorn outlives a killed ``mlflow server`` and holds the port.
    """
    try:
        _stop_group(proc, timeout)
    finally:
        _release_watchdog(proc)


def _stop_group(proc: subprocess.Popen[Any], timeout: float) -> None:
    pgid = proc.pid  # start_new_session: the server leads its own group
    if proc.poll() is not None and not _group_alive(pgid):
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; its workers get what is left of the wait, then SIGKILL
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(pgid):
            return
