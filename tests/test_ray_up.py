"""``ray up`` executed: ``cluster.yaml`` as an on-prem cluster (:mod:`actors.onprem`) on machines of this one
(:mod:`tests.onprem`: namespaces, each with its own sshd, network, process table and ``/home/ray``).

The fast tests check the derived config in-process. The ``slow`` test runs the header of ``cluster.yaml`` as
written, except its ``aws`` lines and these on-prem changes: the derived config's path for ``cluster.yaml``,
``--yes`` where ``ray up`` / ``ray down`` would ask, ``file://`` storage on a disk every machine mounts for the
S3 bucket, and fewer rounds and trials (2 cores). Around it, what an on-prem cluster needs (docs/tutorials/onprem.md):
autoscaler v1 (``RAY_UP_enable_autoscaler_v2=0``), the MLflow server stopped before ``ray down``, and ``ray stop``
on each worker after it (the local provider's ``ray down`` stops the head only).
"""

from __future__ import annotations

import copy
import os
import secrets
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from actors.onprem import SHARED_KEYS, node_environment, onprem_config, worker_type
from lcfed.tracking import mlflow_key
from tests.onprem import BIN, Machines, launcher_env
from tests.raycluster import ROOT, alive
from tests.test_cluster_yaml_commands import header_commands

LAUNCHER = yaml.safe_load((ROOT / "cluster.yaml").read_text())
ROUNDS, TRIALS = 3, 2


def test_the_onprem_config_is_cluster_yamls_commands_on_the_local_provider():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = onprem_config(LAUNCHER, "10.0.0.2", ["10.0.0.3", "10.0.0.4"], ssh_user="root",
                           ssh_private_key="/k", cluster_name="x")
    validate_config(prepare_config(copy.deepcopy(config)))  # what `ray up` does with it
    for key in SHARED_KEYS[1:]:
        assert config[key] == LAUNCHER[key], key
    assert "docker" not in config and "available_node_types" not in config
    assert config["provider"] == {"type": "local", "head_ip": "10.0.0.2", "worker_ips": ["10.0.0.3", "10.0.0.4"]}
    # the directory the head's container mounted for the MLflow store
    assert config["initialization_commands"] == ["mkdir -p /home/ray/lcfed-mlflow"]


def test_each_machine_stands_in_for_its_node_types_container():
    assert worker_type(LAUNCHER) == "gpu_worker"
    head, worker = node_environment(LAUNCHER, "head"), node_environment(LAUNCHER, "gpu_worker")
    assert head == {"RAY_AUTH_MODE": "token", "RAY_OVERRIDE_RESOURCES": '{"CPU": 6, "GPU": 0}'}
    assert worker["RAY_OVERRIDE_RESOURCES"] == '{"CPU": 4, "GPU": 1}'


def _onprem(words: list[str], config: Path, storage: str) -> list[str]:
    """A header command for the on-prem cluster (the module docstring lists the changes)."""
    words = [str(config) if w == "cluster.yaml" else w.replace("s3://<bucket>", storage) for w in words]
    if words[:2] in (["ray", "up"], ["ray", "down"]):
        words.insert(2, "--yes")
    if "lcfed" in words[1:]:  # the submitted command
        words += ["--set", f"train.rounds={ROUNDS}"] + (["--num-samples", str(TRIALS)] if "sweep" in words else [])
    return words


def _wait_http(machines: Machines, url: str, env: dict[str, str]) -> None:
    code = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=3)"
    for _ in range(60):
        if subprocess.run(machines.launcher([str(BIN / "python"), "-c", code]), env=env,
                          capture_output=True).returncode == 0:
            return
        time.sleep(1)
    raise RuntimeError(f"{url} not forwarded")


def _ray_left(machines: Machines) -> dict[str, dict[int, str]]:
    """Each machine's processes other than its sshd's."""
    return {n: {p: c for p, c in machines.processes(n).items() if not c.startswith("sshd")} for n in machines.nodes}


@pytest.mark.slow  # ~7 min here (2 cores)
@pytest.mark.cluster
@pytest.mark.subprocess
@pytest.mark.timeout(1500)
def test_ray_up_submit_a_run_and_a_sweep_then_ray_down_leaves_nothing(tmp_path: Path):
    for tool in ("sshd", "rsync", "unshare", "nsenter", "ip"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            pytest.skip(f"needs {tool}")
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces)")
    wtype = worker_type(LAUNCHER)
    machines = Machines.start({"head": node_environment(LAUNCHER, LAUNCHER["head_node_type"]),
                               "w1": node_environment(LAUNCHER, wtype), "w2": node_environment(LAUNCHER, wtype)})
    base, forwards = machines.base, []
    # ray stop's targets, by name, on this machine outside the cluster: they must outlive every ray stop
    decoys = []
    for name in ("raylet", "gcs_server"):
        shutil.copy("/bin/sleep", base / name)
        decoys.append(subprocess.Popen([str(base / name), "3600"], start_new_session=True))
    try:
        repo = base / "repo"  # what `ray up` syncs: this checkout's files, as git would list them
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for f in filter(None, files):
            if (ROOT / f).is_file():
                (repo / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, repo / f)
        (repo / "data").mkdir()
        (repo / "data" / "head-only.txt").write_text("a dataset\n")
        config = base / "cluster.yaml"
        config.write_text(yaml.safe_dump(onprem_config(
            LAUNCHER, machines.ips["head"], [machines.ips["w1"], machines.ips["w2"]], ssh_user="root",
            ssh_private_key=str(machines.key), cluster_name=f"lcfed-{secrets.token_hex(3)}")))
        env = launcher_env(base, PYTHONPATH=str(repo))  # the code under test, where lcfed runs here

        def run(words: list[str], timeout: float = 600) -> str:
            out = subprocess.run(machines.launcher(words, repo), env=env, capture_output=True, text=True,
                                 timeout=timeout, stdin=subprocess.DEVNULL)
            assert out.returncode == 0, f"{shlex.join(words)} exited {out.returncode}:\n{out.stdout[-4000:]}" \
                                        f"\n{out.stderr[-4000:]}"
            return out.stdout + out.stderr

        said: list[tuple[list[str], str]] = []
        times: dict[str, float] = {}
        skipped = []
        for words in header_commands():
            if words[0] == "aws":
                skipped.append(words)
                continue
            words = _onprem(words, config, f"file://{base / 'storage'}")
            began = time.monotonic()
            if words[:2] == ["ray", "dashboard"]:  # "keep running"
                forwards.append(subprocess.Popen(machines.launcher(words, repo), env=env, start_new_session=True,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                port = words[words.index("--port") + 1] if "--port" in words else "8265"
                _wait_http(machines, f"http://127.0.0.1:{port}/" + ("health" if port == "5000" else ""), env)
            elif words[:2] == ["ray", "down"]:
                for proc in forwards:  # the port-forwards end with the session
                    os.killpg(proc.pid, 15)
                    proc.wait(timeout=30)
                # on-prem: nothing ends the head's MLflow server (on AWS the instance goes); its watchdog stops
                # the server when its starter is gone
                run(["ray", "exec", str(config), "kill $(cat ~/lcfed-mlflow/server.pid)"])
                said.append((words, run(words)))
                # on-prem: `ray down` ran `ray stop` on the head only and marked the workers terminated
                for worker in ("w1", "w2"):
                    machines.ssh(worker, "ray stop")
            else:
                said.append((words, run(words)))
            times[shlex.join(words[:5])] = time.monotonic() - began
            if words[:2] == ["ray", "up"]:  # the head's autoscaler starts both workers (min_workers)
                for _ in range(300):
                    status = run(["ray", "exec", str(config), "ray status"])
                    if " 3 local.cluster.node" in status:
                        break
                    time.sleep(2)
                assert " 3 local.cluster.node" in status and "0.0/14.0 CPU" in status and "0.0/2.0 GPU" in status, \
                    status[-3000:]
        assert {w[1] for w in skipped} == {"iam", "s3"}
        print("\n" + "\n".join(f"  {k}: {v:.0f} s" for k, v in times.items()))

        (run_out,) = [out for words, out in said if words[:2] == ["lcfed", "submit"] and "run" in words]
        assert "SUCCEEDED" in run_out and "samples sent by the driver" in run_out, run_out[-3000:]
        (sweep_out,) = [out for words, out in said if words[:2] == ["lcfed", "submit"] and "sweep" in words]
        assert f'"trials": {TRIALS}' in sweep_out and '"errors": 0' in sweep_out, sweep_out[-3000:]
        # the dataset reached the head only
        assert (base / "head/home/.cache/lcfed/head-only.txt").is_file()
        assert not any((base / w / "home/.cache/lcfed/head-only.txt").exists() for w in ("w1", "w2"))

        # the runs, from the MLflow store the header copies off the head
        with tarfile.open(repo / "cluster-mlflow.tgz") as tar:
            tar.extractall(base / "copy", filter="data")
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{base / 'copy/lcfed-mlflow/mlflow.db'}")
        experiments = {e.name: e.experiment_id for e in client.search_experiments()}
        (demo,) = client.search_runs([experiments["lcfed-demo"]])
        assert demo.info.status == "FINISHED" and mlflow_key("acc_mean") in demo.data.metrics
        sweep = client.search_runs([experiments["lcfed-digits"]])
        children = [r for r in sweep if "mlflow.parentRunId" in r.data.tags]
        assert len(sweep) == TRIALS + 1 and len(children) == TRIALS
        assert all(r.info.status == "FINISHED" and mlflow_key("acc_mean") in r.data.metrics for r in children)

        # after `ray down`: no process of the cluster on any machine (ssh sessions close within ControlPersist)
        for _ in range(60):
            left = _ray_left(machines)
            if not any(left.values()):
                break
            time.sleep(1)
        assert not any(left.values()), left
        assert all(alive(d.pid) for d in decoys), "a ray stop reached outside its machine"
    finally:
        for proc in forwards:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
        machines.stop()
        for decoy in decoys:
            decoy.kill()
            decoy.wait(timeout=30)
