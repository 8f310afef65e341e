"""``cluster.yaml``'s autoscaler, executed on Ray's fake multi-node provider (:mod:`actors.fake_autoscaler`).

The derived autoscaling config is checked in-process (its node types are ``cluster.yaml``'s as
:mod:`actors.feasibility` reads them; Ray's schema accepts it). The ``slow`` test runs the autoscaler: a head with
no worker, a sweep with ``--gpus-per-trial 0.5`` submitted to it through the Jobs API; GPU workers
added, the trials' device actors on them with fractional GPUs, the numbers of ``lcfed run`` in-process, and the
workers removed once idle.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import mlflow
import pytest
import yaml
from ray.autoscaler._private.util import validate_config

from actors.fake_autoscaler import FAKE_HEAD_TYPE, fake_autoscaling_config
from actors.feasibility import cluster_from, load_cluster
from lcfed.config import to_dict
from lcfed.engines.local import run_local
from lcfed.tracking import mlflow_key
from tests import autoscaling
from tests.conftest import tiny_config
from tests.raycluster import BIN, ROOT
from tune_jobs.feasible import trial_engine_nodes

LAUNCHER = yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_the_fake_autoscaling_config_has_cluster_yamls_node_types():
    config = fake_autoscaling_config(LAUNCHER, "10.0.0.1:6390", idle_timeout_minutes=0.25, object_store_memory=2**27)
    validate_config(copy.deepcopy(config))  # Ray's autoscaler schema, as the monitor checks it
    assert config["provider"]["type"] == "fake_multinode" and config["provider"]["gcs_address"] == "10.0.0.1:6390"
    assert config["head_node_type"] == FAKE_HEAD_TYPE and config["idle_timeout_minutes"] == 0.25
    # what actors.feasibility judges against: the same head, worker types and bounds as cluster.yaml's
    derived, original = cluster_from(config), load_cluster(ROOT / "cluster.yaml")
    assert derived.head.size == original.head.size and derived.max_workers == original.max_workers
    assert [(t.name, t.size, t.max_workers) for t in derived.workers] == \
        [(t.name, t.size, t.max_workers) for t in original.workers]
    for name, spec in LAUNCHER["available_node_types"].items():
        if name != LAUNCHER["head_node_type"]:
            fake = config["available_node_types"][name]
            assert fake["resources"] == {**spec["resources"], "object_store_memory": 2**27}
            assert fake["min_workers"] == spec["min_workers"]
    assert config["upscaling_speed"] == LAUNCHER["upscaling_speed"]
    assert fake_autoscaling_config(LAUNCHER, "x:1")["idle_timeout_minutes"] == LAUNCHER["idle_timeout_minutes"]


def test_a_node_type_without_resources_cannot_be_faked():
    broken = copy.deepcopy(LAUNCHER)
    del broken["available_node_types"]["gpu_worker"]["resources"]
    with pytest.raises(ValueError, match="'gpu_worker' states no resources"):
        fake_autoscaling_config(broken, "x:1")


def test_a_head_whose_autoscaler_may_add_workers_counts_as_several_nodes(tmp_path, monkeypatch):
    from actors.placement import NodeResources

    head = [NodeResources(6, 0)]
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LCFED_CLUSTER", raising=False)
    assert trial_engine_nodes(head) == 1  # no launcher config known: a one-node Ray
    autoscaling.write(tmp_path / "ray_bootstrap_config.yaml", fake_autoscaling_config(LAUNCHER, "x:1"))
    assert trial_engine_nodes(head) == 2  # the launcher's config on its head: gpu_worker x 4 may come
    no_workers = copy.deepcopy(LAUNCHER)
    no_workers["available_node_types"]["gpu_worker"]["max_workers"] = 0
    autoscaling.write(tmp_path / "ray_bootstrap_config.yaml", fake_autoscaling_config(no_workers, "x:1"))
    assert trial_engine_nodes(head) == 1


IDLE_MINUTES = 0.25  # the derived config's idle timeout: workers go 15 s after their last trial


@pytest.mark.slow  # ~3 min; `make test` covers the derived config above and the feasibility arithmetic (test_feasibility)
@pytest.mark.cluster
@pytest.mark.subprocess
@pytest.mark.timeout(900)
def test_a_gpu_sweep_on_a_head_alone_scales_gpu_workers_up_and_back_down(tmp_path: Path):
    base = tiny_config("train.rounds=2", "engine.num_actors=1")
    config = autoscaling.write(tmp_path / "tiny.yaml", {**to_dict(base), "tracking": {"enabled": True}})
    space = autoscaling.write(tmp_path / "space.yaml", {"method.mu": {"grid": [0.0, 0.1]}})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cluster = autoscaling.start(IDLE_MINUTES)
    try:
        assert cluster.head is not None and autoscaling.workers(cluster) == []  # a head alone
        out = tmp_path / "sweep.json"
        # submitted through the Jobs API (`ray job submit`: a job without a working directory, see docs/cluster.md on
        # the fake provider), its driver on the head (HOME: the head's, with ~/ray_bootstrap_config.yaml)
        proc = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", cluster.dashboard, "--",
             "lcfed", "sweep", "--config", str(config), "--space", str(space), "--scheduler", "fifo",
             "--gpus-per-trial", "0.5", "--name", "auto", "--json", str(out),
             "--storage", f"file://{cluster.base / 'sweeps'}", "--set", f"tracking.uri={uri}",
             "--set", "tracking.experiment=autoscaler"],
            env=cluster.client_env(cluster.head.home, RAY_AUTH_MODE="token"), cwd=tmp_path, capture_output=True,
            text=True, timeout=600)
        said = proc.stdout + proc.stderr  # the job's log, tailed, then its status
        assert proc.returncode == 0 and "' succeeded" in said, said[-6000:]
        # told before any trial waited: which node type the autoscaler must add
        assert "fits only once the autoscaler adds 1 x gpu_worker {CPU: 4, GPU: 1}" in said
        summary = json.loads(out.read_text())
        assert summary["trials"] == 2 and summary["errors"] == 0 and summary["trial_engine"] == "ray"

        gone = autoscaling.wait_for_workers(cluster, 0, timeout=300)
        log = autoscaling.monitor_log(cluster)
        # the autoscaler added gpu_worker nodes with cluster.yaml's resources (logical GPUs), and removed them as idle
        added = {n["node_id"]: n for n in autoscaling.listed(cluster, "nodes", detail=True)
                 if n["node_id"] != autoscaling.FAKE_HEAD_ID}
        assert added and all(n["state"] == "DEAD" and n["end_time_ms"] for n in added.values())
        assert all(n["resources_total"].get("GPU") == 1 and n["resources_total"].get("CPU") == 4 for n in added.values())
        assert "node(s) of type gpu_worker" in log and "Launching 1 nodes, type gpu_worker" in log
        assert all(f"Terminating the node with id {n} and ip {n}. (idle)" in log for n in added)

        client = mlflow.MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("autoscaler")
        children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
        assert len(children) == 2
        for child in children:
            place = json.loads(Path(client.download_artifacts(child.info.run_id, "placement.json",
                                                              str(tmp_path))).read_text())
            actors = place["device_actors"]
            # on the workers the autoscaler added, each device actor with a fraction of a GPU
            assert actors and all(a["node_id"] in added for a in actors)
            assert all(a["node_gpus"] == 1 and 0 < a["gpus"] < 1 for a in actors)
            mu = float(child.data.params["method.mu"])
            ref = run_local(base.replace(**{"method.mu": mu}))
            for key in ("acc_mean", "acc_weighted", "train_loss", "test_loss"):
                assert child.data.metrics[mlflow_key(key)] == ref.final[key], (mu, key)
        print(f"\nautoscaler: workers {sorted(n[-5:] for n in added)}; all gone {gone:.0f} s after the job")
    finally:
        left = cluster.stop()
        assert not left or print(f"SIGKILLed {len(left)} straggler(s) of the autoscaling cluster")
