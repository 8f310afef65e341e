"""What a job ships: its runtime environment and the files Ray's own rules upload (``--dry-run``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tune_jobs.jobs.client import JobsError

# Gitignore-style, as Ray matches them against each path relative to the working directory: a
# pattern without "/" matches at any depth (sub/.env too); a matched directory is not entered.
#: never shipped: secrets and credentials (a job's working dir is readable by all it runs; Ray's
#: token in it would hand over the cluster)
SECRET_EXCLUDES = [
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".ray", "auth_token", ".aws", ".ssh", ".netrc", ".git-credentials",
    # other clouds' and tools' credentials: GCP service-account keys, Kubernetes, boto, Azure, Docker, package
    # registries, Terraform state and variables
    "*.env", "credentials.json", "*-credentials.json", "*_credentials.json", "service-account*.json",
    "client_secret*.json", ".kube", ".boto", ".azure", ".docker", "/.config/gcloud", ".pypirc", ".npmrc",
    ".htpasswd", "*.tfstate", "*.tfstate.*", "*.tfvars", "*.jks", "*.keystore", "*.kdbx",
    # files named like secrets
    "secret", "secrets", "secret.*", "secrets.*", "*.secret", "*.secrets",
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

_log = logging.getLogger(__name__)


def _entrypoint(argv: Sequence[str]) -> str:
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise JobsError("no entrypoint: put the command after `--`, e.g. lcfed submit -- lcfed run --engine ray")
    return shlex.join(args)


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
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE  # Ray when a job ships, not with the parser
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes  # (the same)

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
