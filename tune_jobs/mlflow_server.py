"""``lcfed mlflow-server``: one MLflow tracking server that every run, trial and job logs to.

Local sqlite stores are fine for one process, but Tune trials and Ray jobs run in other working
directories and on other nodes; a tracking server gives them all one place to write (runs and,
through its artifact proxy, artifacts), and clients need no shared filesystem.

The server is bound to 127.0.0.1 by default: MLflow has no authentication, so it is reached
through an SSH port-forward (``ray dashboard`` style), never by opening it to the network.
:func:`start_mlflow_server` / :func:`stop` are the programmatic pair used by the tests and the
cluster head.

The server runs in its own process group (``mlflow server`` starts uvicorn, which starts workers). A
watchdog process ties that group to its starter: however the starter ends (a signal it handles, or
``kill -9``, which no handler sees), the group is stopped and the port freed
(:mod:`tune_jobs.server_group`: the group, the watchdog and :func:`stop`).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

from lcfed.config.tracking import uri_scheme
from lcfed.errors import require
from lcfed.logs import server_environment
from lcfed.run.output_paths import check_output_dir
from lcfed.tracking import resolve_tracking_uri
from tune_jobs.options import examples, verbosity_options
from tune_jobs.server_group import spawn_watched, stop  # stop: start_mlflow_server's pair, imported from here

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
EXIT_USAGE = 2
#: bind addresses that listen on every interface (anyone on the network can read and write runs)
ALL_INTERFACES = ("0.0.0.0", "::", "[::]")


class MlflowServerError(RuntimeError):
    """The server could not be started (port taken, process died, never became healthy)."""


def _url_host(host: str) -> str:
    """Where a local client reaches a server bound to ``host`` (wildcards -> loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def server_url(host: str, port: int) -> str:
    """The http URL clients use for a server bound to ``host:port``."""
    return f"http://{_url_host(host)}:{port}"


def absolute_store_uri(uri: str) -> str:
    """A backend-store URI with local paths made absolute (sqlite, file, bare paths)."""
    return resolve_tracking_uri(uri)


def absolute_artifacts_destination(dest: str) -> str:
    """An artifact destination with a local path made absolute; remote URIs (s3://...) kept."""
    parsed = urlparse(dest)
    if parsed.scheme == "file":
        return Path(parsed.path).expanduser().resolve().as_uri()
    if parsed.scheme and len(parsed.scheme) > 1:  # s3://, gs://, ... (one letter = Windows drive)
        return dest
    return str(Path(dest).expanduser().resolve())


def server_command(
    host: str,
    port: int,
    backend_store_uri: str,
    artifacts_destination: str,
    workers: int | None = None,
) -> list[str]:
    """The ``mlflow server`` command line (run with this interpreter, so the venv's MLflow)."""
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--host", host,
        "--port", str(port),
        "--backend-store-uri", backend_store_uri,
        "--registry-store-uri", backend_store_uri,  # MLflow's default, said (else it prints that it chose it)
        "--serve-artifacts",
        "--artifacts-destination", artifacts_destination,
    ]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    from lcfed.tracking.ui import app_flag  # its UI opens in model training, as `mlflow ui --app-name lcfed`'s

    return cmd + app_flag().split()


def server_env() -> dict[str, str]:
    """The server's environment: ours (MLflow's logging level as this process's verbosity set it), with
    MLflow's background job runner switched off and, but with ``-v``, Python's deprecation warnings off
    (:func:`lcfed.logs.server_environment`: Starlette's and FastAPI's, which the server prints at start).

    The job runner (used by GenAI features) spawns extra worker processes we never need.
    """
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **server_environment()}


def _bind_family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """True if ``host:port`` can be bound now (so a health check will not hit another server)."""
    with socket.socket(_bind_family(host), socket.SOCK_STREAM) as s:
        # as servers do: connections of a just-stopped server in TIME_WAIT must not count as "in use"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
            s.listen(1)
        except OSError:
            return False
    return True


def healthy(url: str, timeout: float = 2.0) -> bool:
    """True if ``GET {url}/health`` answers 200: the probe runs use (:func:`lcfed.tracking.store.server_healthy`)."""
    # here, as in absolute_store_uri (called first, so this costs nothing more): every `lcfed` command
    # imports this module for its parser, and lcfed.tracking loads torch
    from lcfed.tracking.store import server_healthy

    return server_healthy(url, timeout)


def _tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(text)


def wait_healthy(proc: subprocess.Popen[Any], url: str, timeout: float, log_path: Path | None = None) -> None:
    """Block until the server answers ``/health``; raise if it exits or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MlflowServerError(
                f"mlflow server exited with code {proc.returncode} before it became healthy\n{_tail(log_path)}"
            )
        if healthy(url):
            return
        time.sleep(0.5)
    raise MlflowServerError(f"mlflow server at {url} not healthy after {timeout:.0f} s\n{_tail(log_path)}")


def store_locations(
    store_dir: str | Path | None, backend_store_uri: str | None, artifacts_destination: str | None,
) -> tuple[Path, str, str]:
    """The store directory (default: the current one), the backend store URI (default: its
    ``mlflow.db``) and the artifact destination (default: its ``mlartifacts/``), local paths absolute."""
    base = Path(store_dir if store_dir is not None else Path.cwd()).expanduser().resolve()
    backend = absolute_store_uri(backend_store_uri or f"sqlite:///{base / 'mlflow.db'}")
    artifacts = absolute_artifacts_destination(artifacts_destination or str(base / "mlartifacts"))
    return base, backend, artifacts


def start_mlflow_server(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    store_dir: str | Path | None = None,
    *,
    backend_store_uri: str | None = None,
    artifacts_destination: str | None = None,
    workers: int | None = 1,
    timeout: float = 180.0,
    log: TextIO | Path | None = None,
) -> tuple[subprocess.Popen[Any], str]:
    """Start ``mlflow server`` in its own process group and wait until it is healthy.

    ``store_dir`` (default: the current directory) holds ``mlflow.db`` and ``mlartifacts/``;
    ``backend_store_uri`` / ``artifacts_destination`` override either. Output goes to ``log``
    (a path, an open file, or None = ``<store_dir>/mlflow-server.log``). Returns the process
    (stop it with :func:`stop`) and the URL clients use (``tracking.uri``).
    """
    base, backend, artifacts = store_locations(store_dir, backend_store_uri, artifacts_destination)
    if backend.startswith("sqlite:///"):
        Path(backend[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    if "://" not in artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
    if not port_free(host, port):
        raise MlflowServerError(
            f"{host}:{port} is already in use (another MLflow server?); pick another --port"
        )
    url = server_url(host, port)
    log_path: Path | None = None
    if log is None:
        base.mkdir(parents=True, exist_ok=True)
        log_path = base / "mlflow-server.log"
    elif isinstance(log, Path):
        log_path = log
    out: Any = open(log_path, "ab") if log_path is not None else log  # noqa: SIM115 (child keeps it)
    try:
        proc = spawn_watched(server_command(host, port, backend, artifacts, workers), server_env(), out)
    finally:
        if log_path is not None:
            out.close()
    try:
        wait_healthy(proc, url, timeout, log_path)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def _warn_binding(host: str, port: int) -> None:
    """Warn when the server is reachable from other machines: MLflow has no authentication."""
    if host in ALL_INTERFACES:
        bar = "!" * 78
        print(
            f"{bar}\nWARNING: binding the MLflow server to {host} exposes it on EVERY network interface.\n"
            "MLflow has no authentication: anyone who can reach port "
            f"{port} can read, change and delete your runs.\n"
            f"Prefer --host 127.0.0.1 and an SSH port-forward (ssh -L {port}:127.0.0.1:{port} HEAD).\n{bar}",
            file=sys.stderr,
        )
    elif host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        print(
            f"lcfed: note: the MLflow server on {host}:{port} is reachable from the network and has no "
            "authentication; restrict the port (security group / firewall).",
            file=sys.stderr,
        )


def _server_output() -> TextIO | None:
    """Our stderr for the server's log when it is a real file (a terminal); else None (a log file)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.stderr


#: backend stores ``mlflow server`` takes (besides a plain path)
BACKEND_SCHEMES = ("sqlite", "file", "postgresql", "mysql", "mssql")


def check_args(args: argparse.Namespace) -> None:
    """Every flag checked before anything is printed, created or started."""
    require(1 <= args.port <= 65535, "--port", args.port, "must be a TCP port in [1, 65535]")
    require(args.workers is None or args.workers >= 1, "--workers", args.workers, "must be >= 1 (server processes)")
    require(math.isfinite(args.timeout) and args.timeout > 0, "--timeout", args.timeout,
            "must be > 0 seconds (how long to wait for the server to answer /health)")
    check_output_dir(args.store_dir, "--store-dir")
    if args.backend_store_uri is not None:
        uri = args.backend_store_uri
        scheme = uri_scheme(uri)
        require(bool(uri.strip()) and (scheme == "" or scheme in BACKEND_SCHEMES), "--backend-store-uri", uri,
                f"must be a local path or a URI with scheme one of {list(BACKEND_SCHEMES)}")
    if args.artifacts_destination is not None and "://" not in args.artifacts_destination:
        check_output_dir(args.artifacts_destination, "--artifacts-destination")


def cmd_mlflow_server(args: argparse.Namespace) -> int:
    """Run the server in the foreground until Ctrl-C (or SIGTERM, SIGHUP); exit 2 if it cannot start."""
    check_args(args)
    _warn_binding(args.host, args.port)
    store_dir, backend, artifacts = store_locations(args.store_dir, args.backend_store_uri,
                                                    args.artifacts_destination)
    url = server_url(args.host, args.port)
    print(f"lcfed: starting MLflow server on {args.host}:{args.port}", flush=True)
    print(f"  backend store: {backend}\n  artifacts:     {artifacts}", flush=True)

    def _sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # same clean-up path as Ctrl-C

    # SIGHUP: the terminal closed (the server, in its own session, would not get it)
    handled = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)
    previous = {sig: signal.signal(sig, _sigterm) for sig in handled}
    proc: subprocess.Popen[Any] | None = None
    try:
        proc, url = start_mlflow_server(
            args.host, args.port, store_dir,
            backend_store_uri=backend, artifacts_destination=artifacts,
            workers=args.workers, timeout=args.timeout, log=_server_output(),
        )
        print(f"MLflow server ready: {url}", flush=True)
        print(f"  log runs to it with:  lcfed run ... --set tracking.uri={url}", flush=True)
        print(f"  or:                   export MLFLOW_TRACKING_URI={url}", flush=True)
        print("  Ctrl-C stops it.", flush=True)
        code = proc.wait()
        print(f"lcfed: MLflow server exited with code {code}", file=sys.stderr)
        return 1 if code else 0
    except MlflowServerError as exc:
        print(f"lcfed: cannot start the MLflow server: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nlcfed: stopping the MLflow server", file=sys.stderr)
        return 0
    finally:
        if proc is not None:
            stop(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_parser(sub: Any) -> None:
    """Register ``lcfed mlflow-server`` on the CLI's subparsers."""
    p = sub.add_parser(
        "mlflow-server",
        help="run an MLflow tracking server (127.0.0.1 by default) for runs, sweeps and cluster jobs",
        description="Start `mlflow server` with an absolute sqlite store and artifact directory, wait until "
        "it is healthy, print the tracking URI to use, and keep it in the foreground (Ctrl-C stops it).",
        epilog=examples(
            "lcfed mlflow-server --store-dir ~/lcfed-mlflow          # prints http://127.0.0.1:5000",
            "lcfed run --config configs/demo.yaml --set tracking.uri=http://127.0.0.1:5000"),
    )
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="interface to bind (default: %(default)s; reach it remotely via an SSH port-forward)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default: %(default)s)")
    p.add_argument("--store-dir", default=".", metavar="DIR",
                   help="directory for mlflow.db and mlartifacts/ (default: the current directory)")
    p.add_argument("--backend-store-uri", metavar="URI",
                   help="backend store (default: sqlite:///<store-dir>/mlflow.db; relative paths made absolute)")
    p.add_argument("--artifacts-destination", metavar="URI",
                   help="where proxied artifacts are stored (default: <store-dir>/mlartifacts; s3://... allowed)")
    p.add_argument("--workers", type=int, default=1,
                   help="server worker processes (default: %(default)s: one process answers a lab's runs and UI "
                        "and starts in a quarter of the time of MLflow's 4)")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="seconds to wait for GET /health before giving up (default: %(default)s)")
    verbosity_options(p, "the server's errors only, and the address to log to")
    p.set_defaults(func=cmd_mlflow_server)
