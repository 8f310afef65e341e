"""``cluster.yaml`` passes Ray's own cluster-launcher validation, offline (no AWS credentials).

``prepare_config`` merges the file with Ray's AWS defaults exactly as ``ray up`` does before it
talks to AWS (including prepending ``setup_commands`` to the head's and the workers' own setup
commands); ``validate_config`` checks the result against the autoscaler's JSON schema. A broken
copy must fail, so the test would notice a validator that accepts anything. The other tests pin
what the cluster must do for lcfed: where torch builds go, token auth in every container, a CPU
head that GPU demand cannot land on, MLflow on the head's loopback, S3 access on every node.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from tests.test_cluster_yaml_commands import makefile_pins

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"
TORCH_PINS = tuple(f"{name}=={makefile_pins()[name]}" for name in ("torch", "torchvision"))  # `make setup`'s build
PROJECT_INSTALL = "pip install -q -e ~/lcfed"


def _load() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _validate(config: dict[str, Any]) -> dict[str, Any]:
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def _head_and_workers(config: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    types = config["available_node_types"]
    head = config["head_node_type"]
    return types[head], [t for name, t in types.items() if name != head]


def _torch_installs(commands: list[str]) -> list[int]:
    return [i for i, cmd in enumerate(commands) if "torch==" in cmd]


def test_cluster_yaml_is_valid_for_ray_up():
    prepared = _validate(_load())
    assert prepared["provider"]["type"] == "aws"
    head, workers = _head_and_workers(prepared)
    assert head["max_workers"] == 0
    assert len(workers) == 1 and workers[0]["resources"].get("GPU", 0) >= 1
    assert workers[0]["min_workers"] == 0 < workers[0]["max_workers"] <= prepared["max_workers"]


def test_every_node_type_runs_the_same_pinned_gpu_ami():
    config = _load()
    region = config["provider"]["region"]
    images = {name: t["node_config"].get("ImageId", "") for name, t in config["available_node_types"].items()}
    # an explicit ami-<17 hex> on every type: neither Ray's outdated built-in default nor "latest_dlami"
    assert all(re.fullmatch(r"ami-[0-9a-f]{17}", image) for image in images.values()), images
    assert len(set(images.values())) == 1, images
    text = CLUSTER_YAML.read_text()
    assert "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" in text and region == "us-west-2"


def test_token_auth_is_in_every_container_and_the_token_is_mounted():
    config = _load()
    run_options = config["docker"]["run_options"]  # shared by the head's and the workers' containers
    assert "--env RAY_AUTH_MODE=token" in run_options
    assert not any("RAY_AUTH_MODE" in opt for opt in config["docker"].get("worker_run_options", []))
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert "RAY_AUTH_MODE=token ray start" in " ".join(config[key])
    assert "RAY_AUTH_MODE=disabled" not in CLUSTER_YAML.read_text()


def test_head_is_cpu_only_and_gpu_workers_declare_their_gpus():
    config = _load()
    head, workers = _head_and_workers(config)
    assert head["resources"]["GPU"] == 0  # no GPU ask (device actors, --gpus-per-trial) can land here
    assert 0 < head["resources"]["CPU"] <= 8  # m5.2xlarge: room for drivers, trial/server bundles
    assert head["node_config"]["InstanceType"] == "m5.2xlarge"
    assert config["docker"]["head_image"].endswith("-py311") and config["docker"]["worker_image"].endswith("-gpu")
    (gpu,) = workers
    assert gpu["resources"] == {"CPU": 4, "GPU": 1} and gpu["node_config"]["InstanceType"] == "g5.xlarge"


def test_cpu_torch_on_the_head_cuda_torch_on_the_workers_each_installed_once():
    config = _load()
    assert not _torch_installs(config["setup_commands"])  # Ray prepends these to both lists below
    prepared = prepare_config(copy.deepcopy(config))
    head_setup, worker_setup = prepared["head_setup_commands"], prepared["worker_setup_commands"]
    _, workers = _head_and_workers(prepared)
    assert all("worker_setup_commands" not in t for t in workers)  # would replace the merged list

    (h,) = _torch_installs(head_setup)
    assert all(pin in shlex.split(head_setup[h]) for pin in TORCH_PINS) and CPU_INDEX in head_setup[h]
    (w,) = _torch_installs(worker_setup)
    assert all(pin in shlex.split(worker_setup[w]) for pin in TORCH_PINS)
    assert "download.pytorch.org" not in worker_setup[w]  # PyPI's default Linux wheels: the CUDA build

    # the project after torch, so its `torch>=...` is already satisfied and pulls no second build
    assert head_setup.index(PROJECT_INSTALL + "'[search]'") > h and worker_setup.index(PROJECT_INSTALL) > w
    assert any("boto3" in cmd for cmd in head_setup)  # the autoscaler's AWS calls
    assert config["file_mounts"]["~/lcfed"] == "."
    assert ".venv" in config["rsync_exclude"] and ".gitignore" in config["rsync_filter"]


def test_mlflow_server_runs_on_the_head_bound_to_loopback():
    config = _load()
    start = " ".join(config["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token ray start --head" in start and "--dashboard-host=127.0.0.1" in start
    assert "lcfed mlflow-server --host 127.0.0.1 --port 5000 --store-dir ~/lcfed-mlflow" in start
    assert "0.0.0.0" not in start and "hostname -I" not in start
    assert "mlflow" not in " ".join(config["worker_start_ray_commands"])


def test_mlflow_store_host_dir_is_created_by_the_commands_ray_up_runs_for_the_head():
    # `ray up` runs the TOP-LEVEL initialization_commands on the head; a node type's own list is
    # used only for workers the autoscaler starts. Docker would create a missing bind-mount source
    # as root, which the container's `ray` user could not write.
    config = _load()
    mounts = [opt.split()[1].split(":")[0] for opt in config["docker"]["head_run_options"] if opt.startswith("-v ")]
    assert "/home/ubuntu/lcfed-mlflow" in mounts
    init = " ".join(config["initialization_commands"])
    assert all(src in init for src in mounts)
    head, _ = _head_and_workers(config)
    assert "initialization_commands" not in head


def test_every_node_has_an_instance_profile_for_the_s3_sweep_storage():
    config = _load()
    profiles = [t["node_config"].get("IamInstanceProfile") for t in config["available_node_types"].values()]
    assert all(p and (p.get("Name") or p.get("Arn")) for p in profiles), profiles
    assert all(p == profiles[0] for p in profiles)
    text = CLUSTER_YAML.read_text()
    assert "s3://<bucket>/lcfed-sweeps" in text and "iam:PassRole" in text


def test_no_dataset_is_synced_to_every_node():
    config = _load()
    assert set(config["file_mounts"]) == {"~/lcfed", "~/.ray/auth_token"}
    assert not config.get("cluster_synced_files")
    assert "/data/" in (CLUSTER_YAML.parent / ".gitignore").read_text().split()  # kept out of ~/lcfed
    assert "ray rsync-up cluster.yaml ./data/ /home/ray/.cache/lcfed/" in CLUSTER_YAML.read_text()


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda c: c.pop("provider"), id="missing-provider"),
        pytest.param(lambda c: c.__setitem__("max_workers", "four"), id="max_workers-not-int"),
        pytest.param(lambda c: c["available_node_types"]["gpu_worker"]["resources"].__setitem__("GPU", "one"),
                     id="gpu-count-not-int"),
        pytest.param(lambda c: c["available_node_types"]["head"]["resources"].__setitem__("GPU", -1),
                     id="negative-gpu-count"),
        pytest.param(lambda c: c["available_node_types"]["gpu_worker"].__setitem__("min_worker", 1),
                     id="misspelled-node-field"),
        pytest.param(lambda c: c["docker"].__setitem__("run_option", ["--env RAY_AUTH_MODE=token"]),
                     id="misspelled-docker-field"),
    ],
)
def test_broken_copies_fail_validation(breakage):
    config = prepare_config(_load())
    breakage(config)
    with pytest.raises(jsonschema.ValidationError):
        validate_config(config)


def test_unprepared_copy_without_provider_is_rejected():
    config = _load()
    del config["provider"]
    with pytest.raises((KeyError, jsonschema.ValidationError)):
        _validate(config)
