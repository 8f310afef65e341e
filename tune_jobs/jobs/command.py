"""The ``lcfed submit`` and ``lcfed job ...`` commands: submit, follow, status, logs, stop, list."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from lcfed.logs import quiet_logger
from tune_jobs.jobs.client import DEFAULT_ADDRESS, EXIT_USAGE, TERMINAL, UNREACHABLE_FIX, JobsError, make_client
from tune_jobs.jobs.upload import (
    DEFAULT_EXCLUDES,
    _entrypoint,
    _left_out_line,
    _size,
    build_runtime_env,
    dry_run,
    parse_env,
    plan_upload,
    refuse_outside_links,
)
from tune_jobs.options import add_actions, examples


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
    if args.cluster:  # the job's ask against the cluster's node types, before anything is shipped
        from tune_jobs.feasible import check_entrypoint

        check_entrypoint(list(args.entrypoint), args.working_dir, args.cluster)
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
    _add_submit(sub)
    _add_job(sub)


def _add_submit(sub: Any) -> None:
    """``lcfed submit [options] -- COMMAND``."""
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
    submit.add_argument("--cluster", metavar="FILE",
                        help="the cluster launcher config (cluster.yaml): an `lcfed run` or `lcfed sweep` entrypoint "
                        "whose resource ask none of its node types holds is refused here, before anything is shipped")
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


def _add_job(sub: Any) -> None:
    """``lcfed job {status,logs,stop,list}``."""
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
