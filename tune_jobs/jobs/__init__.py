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

from tune_jobs.jobs.client import (
    DEFAULT_ADDRESS,
    UNREACHABLE_FIX,
    JobsError,
    auth_headers,
    check_reachable,
    check_token_transport,
    is_loopback,
    make_client,
    read_token,
    resolve_address,
)
from tune_jobs.jobs.command import add_parser, follow
from tune_jobs.jobs.upload import (
    DEFAULT_EXCLUDES,
    SECRET_EXCLUDES,
    STATE_EXCLUDES,
    UploadPlan,
    _entrypoint,
    build_runtime_env,
    dry_run,
    parse_env,
    plan_upload,
    refuse_outside_links,
)

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_EXCLUDES",
    "JobsError",
    "SECRET_EXCLUDES",
    "STATE_EXCLUDES",
    "UNREACHABLE_FIX",
    "UploadPlan",
    "_entrypoint",
    "add_parser",
    "auth_headers",
    "build_runtime_env",
    "check_reachable",
    "check_token_transport",
    "dry_run",
    "follow",
    "is_loopback",
    "make_client",
    "parse_env",
    "plan_upload",
    "read_token",
    "refuse_outside_links",
    "resolve_address",
]
