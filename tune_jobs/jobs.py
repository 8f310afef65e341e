"""``lcfed submit`` and ``lcfed job ...``: run lcfed commands on a Ray cluster as Ray jobs.

A job ships this working directory to the cluster (``runtime_env.working_dir``) and runs an
entrypoint such as ``lcfed run --engine ray ...`` there, so a laptop can drive a GPU cluster
through the Ray Job Submission API (the dashboard's HTTP port, usually port-forwarded).

Ray 2.60 clusters use token authentication by default. Ray's client only sends the token when
``RAY_AUTH_MODE=token`` is set in this process, so we read the token ourselves (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, as Ray does) and pass it as an explicit
``Authorization`` header; a cluster without auth ignores it. That header is the key to the
cluster (anyone holding it runs code there), so it never goes over plain ``http://`` to another
machine unless ``--allow-insecure-token`` says so.

What is shipped is matched by Ray's own rules (gitignore-style ``excludes`` relative to the
working directory, plus ``.gitignore``/``.rayignore``); ``--dry-run`` lists it without a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import ipaddress
import logging
import math
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lcfed.logs import quiet_logger
from tune_jobs.options import add_actions, examples

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Gitignore-style, as Ray matches them against each path relative to the working directory: a
# pattern without "/" matches at any depth (sub/.env too); a matched directory is not entered.
#: never shipped: secrets and credentials (a job's working dir is readable by all it runs; Ray's
#: token in it would hand over the cluster)
SECRET_EXCLUDES = [
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".ray", "auth_token", ".aws", ".ssh", ".netrc", ".git-credentials",
]
#: never shipped: local state: checkpoints, tracking-outage dumps, data (/data: root only, lcfed/data is
#: code), environments, stores, outputs, bundles, caches
STATE_EXCLUDES = [
    "*.pt", "*.pth", "*.ckpt", "checkpoints", "ckpts", "unlogged-metrics-*.json",
    "/data", "*-ubyte", "*-ubyte.gz", "*.npz",
    ".venv", "venv", ".tox", ".nox", ".git", "mlruns", "mlartifacts", "*.db", "outputs", ".devbundle",
    "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
]
DEFAULT_EXCLUDES = [*SECRET_EXCLUDES, *STATE_EXCLUDES]
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
EXIT_USAGE = 2
#: env vars through which Ray's own client would override an explicit address
_ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")

_log = logging.getLogger(__name__)

UNREACHABLE_FIX = (
    "Start a cluster first: on this machine `lcfed head start` (job server on http://127.0.0.1:8265); "
    "on AWS `ray up cluster.yaml`, then keep `ray dashboard cluster.yaml` running to port-forward "
    "8265 to 127.0.0.1. Or point at the right job server with --address http://HOST:PORT or RAY_ADDRESS."
)


class JobsError(Exception):
    """A job command cannot proceed (unreachable cluster, bad token, unknown job); exit code 2."""


def resolve_address(address: str | None = None) -> str:
    """The job server URL: ``--address``, else ``$RAY_API_SERVER_ADDRESS``/``$RAY_ADDRESS``, else the default.

    A bare ``host:port`` gets ``http://``; ``auto`` (meaningful to ``ray.init`` only) is ignored.
    """
    candidates = [address, *(os.environ.get(name) for name in _ADDRESS_ENV)]
    value = next((c.strip() for c in candidates if c and c.strip() and c.strip() != "auto"), DEFAULT_ADDRESS)
    if "://" not in value:
        value = f"http://{value}"
    parsed = urlparse(value)
    try:
        port_ok = parsed.port is None or 0 < parsed.port < 65536
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise JobsError(f"--address {value}: must be the job server's http(s)://HOST:PORT "
                        f"(default {DEFAULT_ADDRESS}; also read from $RAY_ADDRESS)")
    return value.rstrip("/")


def read_token() -> str | None:
    """The Ray auth token this client should present, or None (auth disabled / no token).

    Same sources and order as Ray: ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``. ``RAY_AUTH_MODE=disabled`` sends none.
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if token := os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return token
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), "~/.ray/auth_token"):
        if path and (p := Path(path).expanduser()).is_file():
            token = p.read_text().strip()
            if token:
                return token
    return None


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (also as ``::ffff:127.x``): traffic that never leaves this machine."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def check_token_transport(url: str, allow_insecure: bool = False) -> None:
    """Refuse to send the auth token in clear text to another machine (before any connection).

    Over plain http anyone on the path reads the bearer token and owns the cluster; loopback (an SSH
    port-forward) and https are fine, and so is having no token to send.
    """
    parsed = urlparse(url)
    if parsed.scheme == "https" or allow_insecure or is_loopback(parsed.hostname or "") or not read_token():
        return
    raise JobsError(
        f"--address {url}: refusing to send the Ray auth token over plain http to a non-loopback host; "
        "use an https:// address, an SSH port-forward (`ray dashboard cluster.yaml`, then --address "
        "http://127.0.0.1:8265), or pass --allow-insecure-token to send it anyway"
    )


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer <token>`` when a token is available (see :func:`read_token`)."""
    token = read_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the address and the fix, if nothing listens at the job server's port."""
    parsed = urlparse(address)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise JobsError(f"cannot reach the Ray job server at {address} ({reason}).\n{UNREACHABLE_FIX}") from None


@contextlib.contextmanager
def _explicit_address() -> Iterator[None]:
    """Hide the address env vars while the client is built: Ray lets them override ``address``."""
    saved = {name: os.environ.pop(name) for name in _ADDRESS_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def make_client(address: str | None = None, allow_insecure_token: bool = False) -> Any:
    """A connected :class:`ray.job_submission.JobSubmissionClient` for the resolved address."""
    url = resolve_address(address)
    check_token_transport(url, allow_insecure_token)
    check_reachable(url)
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        with _explicit_address():
            return JobSubmissionClient(url, headers=auth_headers())
    except AuthenticationError as exc:
        raise JobsError(f"the Ray job server at {url} rejected the auth token: {_auth_fix()}\n{exc}") from None
    except ConnectionError as exc:
        raise JobsError(f"cannot reach the Ray job server at {url} ({exc}).\n{UNREACHABLE_FIX}") from None


def _auth_fix() -> str:
    where = "$RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else "~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH)"
    return (
        f"the token read from {where} must be the cluster's own: run `ray get-auth-token` on the head node "
        "(cluster.yaml mounts your local ~/.ray/auth_token there, so both match)"
    )


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VAL`` strings -> dict (for the job's ``runtime_env.env_vars``)."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise JobsError(f"--env {pair!r}: expected KEY=VALUE with KEY a shell variable name")
        env[key] = value
    return env


def build_runtime_env(
    working_dir: str | Path, env: dict[str, str], excludes: Sequence[str] = (), includes: Sequence[str] = ()
) -> dict[str, Any]:
    """The job's runtime_env: this working directory (minus secrets and local state) and env vars.

    ``includes`` re-admit files the excludes would drop (gitignore negation, last match wins); a file
    inside an excluded directory stays out, since Ray does not enter that directory.
    """
    wd = Path(working_dir).expanduser().resolve()
    if not wd.is_dir():
        raise JobsError(f"--working-dir {working_dir}: not a directory")
    for pattern in includes:
        if not pattern.strip() or pattern.startswith("!"):
            raise JobsError(f"--include {pattern!r}: expected a gitignore-style pattern such as .env.example")
    patterns = [*DEFAULT_EXCLUDES, *excludes, *(f"!{p}" for p in includes)]
    return {"working_dir": str(wd), "excludes": patterns, "env_vars": dict(env)}


@dataclasses.dataclass
class UploadPlan:
    """What Ray would zip from a working directory, and what the excludes kept out."""

    files: list[tuple[str, int]]  # (path relative to the working dir, bytes), sorted
    left_out: list[str]  # excluded paths (directories end with "/"), not entered
    by_default: list[str]  # those of left_out that lcfed's DEFAULT_EXCLUDES match
    outside: list[str] = dataclasses.field(default_factory=list)  # files reached through a link to outside the dir

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)


def plan_upload(runtime_env: dict[str, Any]) -> UploadPlan:
    """Walk the working directory with Ray's own packaging walk and matcher (``_dir_travel``,
    ``_get_excludes``, .gitignore/.rayignore as the job client honours them), collecting what its
    zip would hold (files and empty directories) instead of zipping it."""
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    root = Path(runtime_env["working_dir"]).absolute()
    real_root = root.resolve()
    matches = _get_excludes(root, list(runtime_env.get("excludes", [])))
    by_default = _get_excludes(root, DEFAULT_EXCLUDES)
    plan = UploadPlan([], [], [])

    def rel(path: Path) -> str:
        return path.relative_to(root).as_posix()

    def excluded(path: Path) -> bool:  # first in Ray's list, so it sees every path the walk reaches
        if not matches(path):
            return False
        name = rel(path) + ("/" if path.is_dir() else "")
        plan.left_out.append(name)
        if by_default(path):
            plan.by_default.append(name)
        return True

    def collect(path: Path) -> None:  # the same test as Ray's zip handler
        if path.is_file():
            plan.files.append((rel(path), path.stat().st_size))
            if not path.resolve().is_relative_to(real_root):  # Ray zips what a link points to
                plan.outside.append(rel(path))
        elif path.is_dir() and next(path.iterdir(), None) is None:
            plan.files.append((rel(path) + "/", 0))

    include_gitignore = os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    _dir_travel(root, [excluded], collect, include_gitignore=include_gitignore, logger=_log)
    plan.files.sort()
    plan.left_out.sort()
    plan.by_default.sort()
    plan.outside.sort()
    return plan


def refuse_outside_links(plan: UploadPlan) -> None:
    """A symbolic link in the working dir would ship the file it points to (``creds ->
    ~/.aws/credentials``): refuse links that leave the directory, naming them and the fix."""
    if plan.outside:
        names = ", ".join(plan.outside[:5]) + (", ..." if len(plan.outside) > 5 else "")
        raise JobsError(f"--working-dir: {len(plan.outside)} file(s) reached through a symbolic link to outside the "
                        f"directory would be uploaded ({names}); remove the link or pass --exclude for each")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _left_out_line(plan: UploadPlan, show: int = 4) -> str:
    names = ", ".join(plan.by_default[:show]) + (", ..." if len(plan.by_default) > show else "")
    return f"{len(plan.by_default)} path(s) left out by the secret/state defaults" + (f": {names}" if names else "")


def dry_run(runtime_env: dict[str, Any], entrypoint: Sequence[str]) -> int:
    """Print what ``lcfed submit`` would upload, and what it leaves out; no cluster is contacted."""
    plan = plan_upload(runtime_env)
    refuse_outside_links(plan)
    print(f"lcfed: dry run, nothing sent: would ship {runtime_env['working_dir']}")
    for path, size in plan.files:
        print(f"{_size(size):>10}  {path}")
    print(f"lcfed: {len(plan.files)} file(s), {_size(plan.total_bytes)} before compression")
    print(f"lcfed: {len(plan.by_default)} path(s) left out by the secret/state defaults"
          + "".join(f"\n  - {name}" for name in plan.by_default))
    if user := sorted(set(plan.left_out) - set(plan.by_default)):
        print(f"lcfed: {len(user)} more left out by --exclude: {', '.join(user[:8])}{', ...' if len(user) > 8 else ''}")
    if [a for a in entrypoint if a != "--"]:
        print(f"lcfed: would run: {_entrypoint(entrypoint)}")
    return 0


def _entrypoint(argv: Sequence[str]) -> str:
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise JobsError("no entrypoint: put the command after `--`, e.g. lcfed submit -- lcfed run --engine ray")
    return shlex.join(args)


def _status_name(status: Any) -> str:
    return str(getattr(status, "value", status))


def follow(client: Any, job_id: str, logs: bool = True, poll_s: float = 2.0) -> str:
    """Stream the job's logs (or just its status changes) until it ends; return the final status."""
    if logs:
        try:
            asyncio.run(_tail(client, job_id))
        except Exception as exc:  # websocket dropped: fall back to polling the status
            print(f"lcfed: log stream interrupted ({exc}); polling the status instead", file=sys.stderr)
    last = ""
    while True:
        status = _status_name(client.get_job_status(job_id))
        if status != last and not logs:
            print(f"{datetime.datetime.now():%H:%M:%S} job {job_id}: {status}", flush=True)
        last = status
        if status in TERMINAL:
            return status
        time.sleep(poll_s)


async def _tail(client: Any, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Print :class:`JobsError` and job-server errors as one line each and exit 2, not a traceback."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        try:
            import ray.job_submission  # noqa: F401  (importing ray configures its logger: quiet it after)

            with quiet_logger("ray"):  # the Ray client's per-file packaging chatter; real failures still raise
                return fn(args)
        except JobsError as exc:
            print(f"lcfed: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except RuntimeError as exc:  # what JobSubmissionClient raises for a non-200 answer (e.g. unknown job)
            print(f"lcfed: job server error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except OSError as exc:  # connection lost mid-command (requests' errors are OSErrors too)
            print(f"lcfed: lost the Ray job server ({exc}).\n{UNREACHABLE_FIX}", file=sys.stderr)
            return EXIT_USAGE

    return run


@_guarded
def cmd_submit(args: argparse.Namespace) -> int:
    """Submit the entrypoint; with --wait follow it and exit 0 only if it SUCCEEDED."""
    for flag, value in (("--entrypoint-num-cpus", args.entrypoint_num_cpus),
                        ("--entrypoint-num-gpus", args.entrypoint_num_gpus)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise JobsError(f"{flag} {value}: must be >= 0 (resources reserved for the entrypoint)")
    runtime_env = build_runtime_env(args.working_dir, parse_env(args.env), args.exclude, args.include)
    if args.dry_run:
        return dry_run(runtime_env, args.entrypoint)
    entrypoint = _entrypoint(args.entrypoint)
    plan = plan_upload(runtime_env)
    refuse_outside_links(plan)
    client = make_client(args.address, args.allow_insecure_token)
    print(f"lcfed: shipping {runtime_env['working_dir']}: {len(plan.files)} file(s), {_size(plan.total_bytes)}; "
          f"{_left_out_line(plan)} (--dry-run lists all)", flush=True)
    job_id = client.submit_job(
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        submission_id=args.submission_id,
        entrypoint_num_cpus=args.entrypoint_num_cpus,
        entrypoint_num_gpus=args.entrypoint_num_gpus,
    )
    where = f" --address {client.get_address()}" if args.address else ""
    print(f"lcfed: submitted job {job_id} to {client.get_address()}: {entrypoint}", flush=True)
    print(f"  status: lcfed job status {job_id}{where}\n  logs:   lcfed job logs {job_id} --follow{where}\n"
          f"  stop:   lcfed job stop {job_id}{where}", flush=True)
    if not args.wait:
        return 0
    try:
        status = follow(client, job_id, logs=not args.no_logs)
    except KeyboardInterrupt:
        print(f"\nlcfed: stopped following; job {job_id} keeps running (lcfed job stop {job_id}{where})",
              file=sys.stderr)
        return 130
    info = client.get_job_info(job_id)
    print(f"lcfed: job {job_id} {status}" + (f": {info.message}" if info.message and status != "SUCCEEDED" else ""))
    return 0 if status == "SUCCEEDED" else 1


@_guarded
def cmd_job_status(args: argparse.Namespace) -> int:
    """Print the job's status, message, entrypoint and times."""
    info = make_client(args.address, args.allow_insecure_token).get_job_info(args.job_id)
    print(f"{args.job_id}: {_status_name(info.status)}")
    if info.message:
        print(f"  message:    {info.message}")
    print(f"  entrypoint: {info.entrypoint}")
    for label, ms in (("started", info.start_time), ("ended", info.end_time)):
        if ms:
            print(f"  {label + ':':<11} {datetime.datetime.fromtimestamp(ms / 1000):%Y-%m-%d %H:%M:%S}")
    return 0


@_guarded
def cmd_job_logs(args: argparse.Namespace) -> int:
    """Print the job's logs so far, or follow them until it ends (--follow)."""
    client = make_client(args.address, args.allow_insecure_token)
    if args.follow:
        try:
            status = follow(client, args.job_id, logs=True)
        except KeyboardInterrupt:
            return 130
        print(f"lcfed: job {args.job_id} {status}", file=sys.stderr)
        return 0
    print(client.get_job_logs(args.job_id), end="")
    return 0


@_guarded
def cmd_job_stop(args: argparse.Namespace) -> int:
    """Ask the cluster to stop the job (SIGTERM to its driver, then SIGKILL)."""
    stopped = make_client(args.address, args.allow_insecure_token).stop_job(args.job_id)
    print(f"lcfed: {'stopping' if stopped else 'not running (already ended):'} job {args.job_id}")
    return 0


@_guarded
def cmd_job_list(args: argparse.Namespace) -> int:
    """One line per job on the cluster: id, status, start time, entrypoint."""
    jobs = make_client(args.address, args.allow_insecure_token).list_jobs()
    jobs.sort(key=lambda j: j.start_time or 0)
    print(f"{'JOB ID':<32} {'STATUS':<10} {'STARTED':<19} ENTRYPOINT")
    for job in jobs:
        started = f"{datetime.datetime.fromtimestamp(job.start_time / 1000):%Y-%m-%d %H:%M:%S}" if job.start_time else ""
        entry = job.entrypoint if len(job.entrypoint) <= 80 else job.entrypoint[:77] + "..."
        print(f"{job.submission_id or job.job_id or '':<32} {_status_name(job.status):<10} {started:<19} {entry}")
    return 0


def _address_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        metavar="URL",
        help=f"Ray job server (dashboard) URL (default: $RAY_ADDRESS or {DEFAULT_ADDRESS})",
    )
    p.add_argument(
        "--allow-insecure-token",
        action="store_true",
        help="send the Ray auth token even over plain http:// to a non-loopback host (refused by default: "
        "anyone on the path could read it; use https or an SSH port-forward to 127.0.0.1)",
    )


def add_parser(sub: Any) -> None:
    """Register ``lcfed submit`` and ``lcfed job {status,logs,stop,list}`` on the CLI's subparsers."""
    submit = sub.add_parser(
        "submit",
        help="run an lcfed command on a Ray cluster as a Ray job (ships this directory)",
        description="Submit COMMAND (after `--`) as a Ray job, shipping the working directory; "
        "by default follow its logs and exit 0 only if it SUCCEEDED.",
        epilog=examples(
            "lcfed submit -- lcfed run --config configs/demo.yaml --engine ray --set engine.address=auto "
            "--set tracking.uri=http://127.0.0.1:5000",
            "lcfed submit --dry-run -- lcfed methods      # what would be shipped",
            "lcfed submit --no-wait --address http://head:8265 -- lcfed sweep --space mu_lambda.yaml"),
    )
    _address_arg(submit)
    submit.add_argument("--working-dir", default=".", metavar="DIR",
                        help="directory shipped to the cluster as the job's working directory (default: .)")
    submit.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                        help="environment variable for the job (repeatable)")
    submit.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                        help="extra gitignore-style pattern not to ship (repeatable); always left out: "
                        f"{' '.join(DEFAULT_EXCLUDES)}, and what .gitignore/.rayignore list")
    submit.add_argument("--include", action="append", default=[], metavar="PATTERN",
                        help="ship files matching PATTERN even if an exclude matches them, e.g. .env.example "
                        "(repeatable; not inside an excluded directory)")
    submit.add_argument("--dry-run", action="store_true",
                        help="list the files that would be shipped (and what the defaults leave out), then exit "
                        "without contacting the cluster")
    submit.add_argument("--submission-id", metavar="ID", help="job id to use (default: generated by Ray)")
    submit.add_argument("--entrypoint-num-cpus", type=float, metavar="N",
                        help="CPUs reserved for the job's driver (default: 0)")
    submit.add_argument("--entrypoint-num-gpus", type=float, metavar="N",
                        help="GPUs reserved for the job's driver (default: 0)")
    wait = submit.add_mutually_exclusive_group()
    wait.add_argument("--wait", dest="wait", action="store_true", default=True,
                      help="follow the job until it ends; exit 0 if it SUCCEEDED, 1 otherwise (default)")
    wait.add_argument("--no-wait", dest="wait", action="store_false", help="return once the job is submitted")
    submit.add_argument("--no-logs", action="store_true", help="while waiting, print status changes instead of logs")
    submit.add_argument("entrypoint", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the command to run on the cluster, after `--`")
    submit.set_defaults(func=cmd_submit)

    job = sub.add_parser("job", help="inspect and control Ray jobs (status, logs, stop, list)",
                         description="Inspect and control the Ray jobs on a cluster (`lcfed submit` starts them).",
                         epilog=examples("lcfed job list", "lcfed job logs JOB_ID --follow"))
    job_sub = add_actions(job, "job_command")
    for name, func, text, description, example in (
        ("status", cmd_job_status, "status, message and times of a job",
         "Print a job's status, its status message, its entrypoint and its start and end times.",
         "lcfed job status JOB_ID"),
        ("logs", cmd_job_logs, "a job's output (driver stdout/stderr)",
         "Print a job's output (its driver's stdout and stderr); --follow until it ends.",
         "lcfed job logs JOB_ID --follow"),
        ("stop", cmd_job_stop, "stop a running job",
         "Stop a running job: its driver gets SIGTERM, so an lcfed run ends at the end of its current round.",
         "lcfed job stop JOB_ID --address http://head:8265"),
    ):
        p = job_sub.add_parser(name, help=text, description=description, epilog=examples(example))
        p.add_argument("job_id", metavar="JOB_ID")
        _address_arg(p)
        if name == "logs":
            p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
        p.set_defaults(func=func)
    ls = job_sub.add_parser("list", help="all jobs on the cluster",
                            description="List every job on the cluster: id, status, start time, entrypoint.",
                            epilog=examples("lcfed job list", "lcfed job list --address http://head:8265"))
    _address_arg(ls)
    ls.set_defaults(func=cmd_job_list)
