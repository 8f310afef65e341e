"""A cluster launcher config's node types on Ray's fake multi-node provider: its autoscaler, run on one machine.

Ray's autoscaler can run without a cloud: ``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE``
with ``provider: {type: fake_multinode}`` in FILE. Its monitor then adds a "node" (a raylet on this machine
with the node type's declared resources: logical GPUs on a CPU machine) where demand asks for one, and
removes it after ``idle_timeout_minutes``. :func:`fake_autoscaling_config` derives FILE from ``cluster.yaml``
(the node types, their ``resources``, ``min_workers`` / ``max_workers``, the cluster's ``max_workers``,
``upscaling_speed`` and ``idle_timeout_minutes``), so what runs is the launcher config's own shape, not a copy
written beside it. The head itself starts with its type's resources (``ray start --num-cpus ... --num-gpus ...``).

The monitor does not fill in defaults (``ray up`` does, with ``prepare_config``), and the fake provider's
``example.yaml`` defaults are not in Ray's wheel, so the config is complete here. The provider names the head's
type ``ray.head.default`` (its tag for the head it did not start) and starts workers against ``gcs_address``
(else ``<this machine>:6379``), so both are set. Nothing here imports Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the node type the fake provider tags its head with (``FAKE_HEAD_NODE_TYPE``)
FAKE_HEAD_TYPE = "ray.head.default"

#: the environment the head's ``ray start`` needs: the fake provider, and a monitor loop of 1 s (Ray's
#: ``AutoscalingCluster`` sets the same; the default is 5 s)
FAKE_ENV = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}


def fake_autoscaling_config(launcher: Mapping[str, Any], gcs_address: str, *,
                            idle_timeout_minutes: float | None = None,
                            object_store_memory: int | None = None) -> dict[str, Any]:
    """The autoscaling config of ``launcher`` (a parsed ``cluster.yaml``) for the fake provider of a head whose
    GCS is at ``gcs_address``: the same node types with the same resources and worker bounds, the head's type
    renamed :data:`FAKE_HEAD_TYPE`. ``idle_timeout_minutes`` replaces the launcher's (a test waits seconds, not
    ten minutes); ``object_store_memory`` (bytes) sizes each worker's object store (Ray's default is 30% of
    this machine's memory per node). ValueError where a node type states no ``resources`` (the fake provider
    starts a node with what its type declares, nothing is detected)."""
    types = launcher.get("available_node_types")
    head = launcher.get("head_node_type")
    if not isinstance(types, Mapping) or head not in types:
        raise ValueError("the cluster config has no available_node_types with its head_node_type")
    total = int(launcher.get("max_workers", 2))  # Ray's default
    node_types: dict[str, Any] = {}
    for name, spec in types.items():
        spec = spec or {}
        resources = spec.get("resources")
        if not isinstance(resources, Mapping) or "CPU" not in resources:
            raise ValueError(f"node type {name!r} states no resources (resources: {{CPU: ..., GPU: ...}})")
        if name == head:
            node_types[FAKE_HEAD_TYPE] = {"resources": dict(resources), "node_config": {}, "max_workers": 0}
            continue
        declared = dict(resources)
        if object_store_memory is not None:
            declared["object_store_memory"] = int(object_store_memory)
        node_types[str(name)] = {"resources": declared, "node_config": {},
                                 "min_workers": int(spec.get("min_workers", 0)),
                                 "max_workers": int(spec.get("max_workers", total))}
    idle = launcher.get("idle_timeout_minutes", 5) if idle_timeout_minutes is None else idle_timeout_minutes
    return {
        "cluster_name": str(launcher.get("cluster_name", "default")),
        "max_workers": total,
        "upscaling_speed": float(launcher.get("upscaling_speed", 1.0)),
        "idle_timeout_minutes": float(idle),
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "available_node_types": node_types,
        "head_node_type": FAKE_HEAD_TYPE,
        "auth": {}, "docker": {},
        # nothing to run on a fake node: it is a raylet started by the monitor, with this machine's files
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
    }

