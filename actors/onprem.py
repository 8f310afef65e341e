"""``cluster.yaml`` as an on-prem cluster: Ray's local provider (``provider: {type: local}``) over SSH.

:func:`onprem_config` derives the launcher config for machines you already have (their addresses, an SSH user
and key) from ``cluster.yaml``, so ``ray up`` runs the same setup and start commands, file mounts and sync rules
as on AWS, not a second copy written beside them. What changes, and why:

- ``provider``: ``local`` with ``head_ip`` and ``worker_ips``; ``auth``: the given user and key.
- ``docker`` is dropped (no container runtime assumed). What the containers gave a node becomes the machine's
  environment instead (:func:`node_environment`): the ``--env`` of ``run_options`` (``RAY_AUTH_MODE=token``)
  and the node type's declared ``resources`` as ``RAY_OVERRIDE_RESOURCES`` (on AWS ``ray up`` hands them to
  ``ray start``; the local provider has one node type with no resources and detects them). The directories the
  head's container mounted (``head_run_options``' ``-v HOST:PATH``) are made by ``initialization_commands``.
- ``available_node_types`` / ``head_node_type`` are left out: Ray's local provider refuses them and makes its
  own single type; each address is one machine, workers are kept up (``min_workers`` = the worker count).

The machines' home must be ``/home/ray`` (the containers' home) for the header's paths to hold as written.
Nothing here imports Ray.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

#: keys of ``cluster.yaml`` taken over unchanged
SHARED_KEYS = ("cluster_name", "idle_timeout_minutes", "upscaling_speed", "file_mounts", "rsync_exclude",
               "rsync_filter", "setup_commands", "head_setup_commands", "worker_setup_commands",
               "head_start_ray_commands", "worker_start_ray_commands")


def _docker_option(options: Sequence[str], flag: str) -> list[str]:
    """The values of ``flag`` (``--env``, ``-v``) in docker run options, written either as one string
    (``"--env K=V"``) or as separate words."""
    words = [w for option in options for w in shlex.split(str(option))]
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == flag]


def node_environment(launcher: Mapping[str, Any], node_type: str) -> dict[str, str]:
    """What a machine of ``node_type`` needs in its login environment to stand in for that type's container:
    the containers' ``--env`` variables and ``RAY_OVERRIDE_RESOURCES`` (the type's declared resources, which
    the autoscaler and ``lcfed check`` plan with). KeyError for an unknown node type."""
    spec = launcher["available_node_types"][node_type]
    docker = launcher.get("docker") or {}
    env = dict(v.split("=", 1) for v in _docker_option(docker.get("run_options") or [], "--env"))
    if spec.get("resources"):
        env["RAY_OVERRIDE_RESOURCES"] = json.dumps(spec["resources"], sort_keys=True)
    return env


def worker_type(launcher: Mapping[str, Any]) -> str:
    """The one worker node type a local-provider cluster's workers stand in for. ValueError if there is not
    exactly one (the local provider has a single type)."""
    types = [t for t in launcher["available_node_types"] if t != launcher["head_node_type"]]
    if len(types) != 1:
        raise ValueError(f"an on-prem cluster has one worker type; {sorted(types)} given")
    return str(types[0])


def onprem_config(launcher: Mapping[str, Any], head_ip: str, worker_ips: Sequence[str], *, ssh_user: str,
                  ssh_private_key: str, cluster_name: str | None = None) -> dict[str, Any]:
    """The local-provider launcher config of ``launcher`` (a parsed ``cluster.yaml``) for the machine at
    ``head_ip`` and the workers at ``worker_ips``, reached as ``ssh_user`` with ``ssh_private_key``.
    ``cluster_name`` replaces the launcher's (Ray keys the launcher's state file and SSH sockets by it)."""
    config: dict[str, Any] = {k: launcher[k] for k in SHARED_KEYS if k in launcher}
    if cluster_name is not None:
        config["cluster_name"] = cluster_name
    docker = launcher.get("docker") or {}
    mounted = [v.split(":")[1] for v in _docker_option(docker.get("head_run_options") or [], "-v")]
    config["initialization_commands"] = [f"mkdir -p {shlex.quote(path)}" for path in mounted]
    config["provider"] = {"type": "local", "head_ip": head_ip, "worker_ips": list(worker_ips)}
    config["auth"] = {"ssh_user": ssh_user, "ssh_private_key": ssh_private_key}
    config["max_workers"] = len(worker_ips)
    return config
