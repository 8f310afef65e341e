"""``lcfed head start|stop|status``: a local Ray head that listens on 127.0.0.1 only and stops cleanly.

``ray start --head`` on Linux binds its GCS to every interface even with ``--node-ip-address
127.0.0.1``; with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the head's own environment (Ray's
single-machine mode, as ``engine.address: null`` uses in-process) GCS, raylet, agents, dashboard
and workers all bind loopback. The head is ``ray start --head --block`` in a new session, so the
recorded process id is its group's leader: SIGTERM to it drains the node and takes down what it
started (seconds); what is left after the timeout gets SIGKILL, group-wide. Ray's address file is
removed when it names this head, so ``engine.address: auto`` never follows a dead one. The state
(process id, addresses, log) is ``$XDG_STATE_HOME/lcfed/head.json``; Ray's own output goes to
``head.log`` beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from actors.connect import LOOPBACK, answers, secure_token_file
from tune_jobs.jobs import auth_headers
from tune_jobs.options import add_actions, examples

#: the ports ``ray start`` would otherwise take from fixed defaults (another Ray on the machine collides)
AUX_PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                  "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 45.0  # Ray drains a node for up to 30 s on SIGTERM


class HeadError(Exception):
    """The head cannot be started or stopped as asked; the message says why (exit code 2)."""


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "lcfed"


def state_file() -> Path:
    return state_dir() / "head.json"


def address_file() -> Path:
    """Ray's address file, which ``ray start --head`` writes and ``address="auto"`` follows."""
    from ray._common.utils import get_ray_address_file  # Ray when a head command runs, not with the parser

    return Path(get_ray_address_file(None))


def read_state() -> dict[str, Any] | None:
    try:
        return dict(json.loads(state_file().read_text()))
    except (OSError, ValueError):
        return None


def _leader_alive(state: dict[str, Any]) -> bool:
    """The recorded process is alive and still a ``ray start`` (a reused pid is not ours)."""
    try:
        proc = psutil.Process(int(state["pid"]))
        return proc.status() != psutil.STATUS_ZOMBIE and "start" in proc.cmdline() and \
            proc.create_time() <= float(state["started"]) + 5
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False


def group(pgid: int) -> list[psutil.Process]:
    """The live processes of process group ``pgid`` (the head and everything it started)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def listening(pgid: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket in the group."""
    out = []
    for proc in group(pgid):
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    out.append((proc.name(), str(conn.laddr.ip), int(conn.laddr.port)))
    return sorted(out, key=lambda s: s[2])


def is_loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def _port_free(port: int, flag: str) -> None:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            raise HeadError(f"{flag} {port}: the port is in use on {LOOPBACK} (another Ray head? "
                            f"`lcfed head status`; or choose another {flag})") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _ray_binary() -> str:
    beside = Path(sys.executable).parent / "ray"  # the ray of lcfed's own environment
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise HeadError("the `ray` command is not installed in this environment (pip install 'ray[default]')")
    return found


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _ready(dashboard: str) -> bool:
    """The job server answers (the dashboard's HTTP API, with the token when there is one)."""
    req = urllib.request.Request(f"{dashboard}/api/version", headers=auth_headers())
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _names_us(state: dict[str, Any]) -> bool:
    """Ray's address file names this head (``ray start`` writes it last, after the job server is up)."""
    try:
        return address_file().read_text().strip() == state["gcs"]
    except OSError:
        return False


def running() -> dict[str, Any] | None:
    """The state of the head ``lcfed head start`` left running on this machine (its leader alive, its GCS
    answering); None when there is none. Not Ray's address file: any later ``ray start`` rewrites it."""
    state = read_state()
    if state is None or not _leader_alive(state) or not answers(str(state.get("gcs", "")), timeout=1.0):
        return None
    return state


def start(port: int, dashboard_port: int, num_cpus: int | None, num_gpus: int | None,
          timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Start the head, wait until its job server answers, record and return its state. A start that Ray gave
    up on after its fixed wait for the raylet (:data:`RAY_STARTUP_TIMEOUT`, seen on a loaded machine) is
    cleared away and tried once more."""
    state = read_state()
    if state is not None and _leader_alive(state):
        raise HeadError(f"a head started by lcfed is already running (pid {state['pid']}, GCS {state['gcs']}, "
                        f"job server {state['dashboard']}): `lcfed head stop` first")
    for value, flag in ((port, "--port"), (dashboard_port, "--dashboard-port")):
        _port_free(value, flag)
    secure_token_file()  # Ray would write ~/.ray/auth_token readable by every user
    try:
        return _start_once(port, dashboard_port, num_cpus, num_gpus, timeout)
    except _SlowStartup:
        print(f"lcfed: {RAY_STARTUP_TIMEOUT}, the machine being busy: starting the head once more",
              file=sys.stderr, flush=True)
    return _start_once(port, dashboard_port, num_cpus, num_gpus, timeout)  # a second one is the command's error


#: what ``ray start`` says when its raylet did not register within Ray's fixed 30 s
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"


class _SlowStartup(HeadError):
    """``ray start --head`` exited after Ray's own fixed wait for its raylet ran out."""


def _start_once(port: int, dashboard_port: int, num_cpus: int | None, num_gpus: int | None,
                timeout: float) -> dict[str, Any]:
    cmd = [_ray_binary(), "start", "--head", "--block", "--node-ip-address", LOOPBACK, "--port", str(port),
           "--dashboard-host", LOOPBACK, "--dashboard-port", str(dashboard_port), "--disable-usage-stats"]
    for flag in AUX_PORT_FLAGS:
        cmd += [flag, str(_free_port())]
    if num_cpus is not None:
        cmd += ["--num-cpus", str(num_cpus)]
    if num_gpus is not None:
        cmd += ["--num-gpus", str(num_gpus)]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    state_dir().mkdir(parents=True, exist_ok=True)
    log = state_dir() / "head.log"
    t0 = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    state: dict[str, Any] = {"pid": proc.pid, "gcs": f"{LOOPBACK}:{port}",
                             "dashboard": f"http://{LOOPBACK}:{dashboard_port}", "log": str(log), "started": t0}
    state_file().write_text(json.dumps(state, indent=1))
    deadline = time.monotonic() + timeout
    while not (_ready(state["dashboard"]) and _names_us(state)):
        if proc.poll() is not None:
            stop()  # what the failed start left in its process group (a GCS, agents), and the state
            tail = _tail(log)
            why = f"`ray start --head` exited with code {proc.returncode}; its log ({log}) ends:\n{tail}"
            raise _SlowStartup(why) if RAY_STARTUP_TIMEOUT in tail else HeadError(why)
        if time.monotonic() > deadline:
            stop()
            raise HeadError(f"the head's job server did not answer at {state['dashboard']} within {timeout:.0f} s "
                            f"(stopped again); its log: {log}")
        time.sleep(0.5)
    state["ready_s"] = round(time.time() - t0, 1)
    state_file().write_text(json.dumps(state, indent=1))
    return state


def stop(timeout: float = STOP_TIMEOUT_S) -> dict[str, Any] | None:
    """SIGTERM the head (it drains and stops what it started), SIGKILL what is left after ``timeout``;
    remove Ray's address file if it names this head, and the state. None if no head was recorded."""
    state = read_state()
    if state is None:
        return None
    pid = int(state["pid"])
    t0 = time.monotonic()
    killed = 0
    if _leader_alive(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout)
    left = group(pid)
    for proc in left:  # still there after the drain, or left by a leader that died
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed += 1
    psutil.wait_procs(left, timeout=10)
    if _names_us(state):
        address_file().unlink(missing_ok=True)
    state_file().unlink(missing_ok=True)
    return {**state, "stopped_s": round(time.monotonic() - t0, 1), "killed": killed}


# ---- the command ------------------------------------------------------------------------------------


def _one_line_errors(fn: Any) -> Any:
    """HeadError as one line and exit 2, as lcfed's other commands report bad input."""
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except HeadError as exc:
            print(f"lcfed: {exc}", file=sys.stderr)
            return 2
    return wrapped


def _check_start_args(args: argparse.Namespace) -> None:
    for flag, port in (("--port", args.port), ("--dashboard-port", args.dashboard_port)):
        if not 1024 <= port <= 65535:
            raise HeadError(f"{flag} {port}: must be a port in 1024-65535")
    if args.port == args.dashboard_port:
        raise HeadError(f"--port and --dashboard-port are both {args.port}: they must differ")
    for flag, value in (("--num-cpus", args.num_cpus), ("--num-gpus", args.num_gpus)):
        if value is not None and value < 0:
            raise HeadError(f"{flag} {value}: must be a whole number >= 0")


@_one_line_errors
def cmd_start(args: argparse.Namespace) -> int:
    _check_start_args(args)
    state = start(args.port, args.dashboard_port, args.num_cpus, args.num_gpus)
    sockets = listening(int(state["pid"]))
    where = "every socket on 127.0.0.1" if all(is_loopback(ip) for _, ip, _ in sockets) else \
        "WARNING: not every socket is on 127.0.0.1"
    print(f"lcfed: Ray head up in {state['ready_s']} s (pid {state['pid']}): GCS {state['gcs']}, "
          f"job server {state['dashboard']}; {len(sockets)} listening sockets, {where}")
    print("  submit:  lcfed submit -- lcfed run --config configs/demo.yaml --engine ray"
          + ("" if state["dashboard"] == "http://127.0.0.1:8265" else f"   (with --address {state['dashboard']})"))
    print(f"  attach:  lcfed run --engine ray attaches to it by default (--private-ray: a Ray of the run's own); "
          f"elsewhere --set engine.address={state['gcs']}")
    print(f"  stop:    lcfed head stop        log: {state['log']}")
    return 0


@_one_line_errors
def cmd_stop(args: argparse.Namespace) -> int:
    if not args.timeout >= 0:
        raise HeadError(f"--timeout {args.timeout}: must be >= 0 seconds")
    done = stop(args.timeout)
    if done is None:
        print(f"lcfed: no head started by lcfed is recorded ({state_file()}): nothing to stop")
        return 0
    how = f", {done['killed']} process(es) SIGKILLed after {args.timeout:.0f} s" if done["killed"] else ""
    print(f"lcfed: Ray head stopped in {done['stopped_s']} s (pid {done['pid']}, GCS {done['gcs']}){how}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state()
    if state is None or not _leader_alive(state):
        print("lcfed: no head started by lcfed is running" +
              (f" (stale record of pid {state['pid']}: `lcfed head stop` clears it)" if state else ""))
        return 1
    print(f"lcfed: Ray head running (pid {state['pid']}): GCS {state['gcs']}, job server {state['dashboard']}")
    for name, ip, port in listening(int(state["pid"])):
        print(f"  {ip}:{port:<6} {name}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``lcfed head {start,stop,status}`` on the CLI's subparsers."""
    head = sub.add_parser("head", help="a local Ray head on 127.0.0.1: start, stop, status",
                          description="A Ray head on this machine, every socket on 127.0.0.1, in its own process "
                          "group: `lcfed submit` and engine.address=auto reach it; `lcfed head stop` takes it "
                          "down in seconds and leaves no address file.",
                          epilog=examples("lcfed head start", "lcfed head start --port 6380 --dashboard-port 8266",
                                          "lcfed head stop"))
    acts = add_actions(head, "head_command")
    p = acts.add_parser("start", help="start the head in the background and wait until its job server answers",
                        description="Start `ray start --head --block` in its own process group, bound to "
                        "127.0.0.1, and wait until its job server answers.",
                        epilog=examples("lcfed head start", "lcfed head start --num-cpus 2 --num-gpus 0"))
    p.add_argument("--port", type=int, default=6379, help="GCS port (default: %(default)s)")
    p.add_argument("--dashboard-port", type=int, default=8265,
                   help="dashboard and job server port (default: %(default)s, where lcfed submit looks)")
    p.add_argument("--num-cpus", type=int, help="CPUs the head offers (default: all)")
    p.add_argument("--num-gpus", type=int, help="GPUs the head offers (default: those Ray detects)")
    p.set_defaults(func=cmd_start)
    s = acts.add_parser("stop", help="stop the head lcfed started",
                        description="SIGTERM the head (Ray drains it and stops what it started), SIGKILL what is "
                        "left after --timeout, and remove Ray's address file if it names this head.",
                        epilog=examples("lcfed head stop"))
    s.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S, help="seconds before SIGKILL (default: %(default)s)")
    s.set_defaults(func=cmd_stop)
    st = acts.add_parser("status", help="whether the head runs, and its listening sockets",
                         description="Print the head's addresses and every socket it listens on; exit 1 if none runs.",
                         epilog=examples("lcfed head status"))
    st.set_defaults(func=cmd_status)

