"""Resource asks against what a cluster can ever hold (:mod:`actors.feasibility`), computed by hand on the
repository's ``cluster.yaml``: a head {CPU 6, GPU 0} and at most 4 ``gpu_worker`` {CPU 4, GPU 1}. No Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actors.connect import ClusterError
from actors.feasibility import Ask, Bundle, cluster_from, in_flight, judge, load_cluster
from tests.raycluster import ROOT
from tune_jobs.cli import main
from tune_jobs.feasible import check_entrypoint

CLUSTER = load_cluster(ROOT / "cluster.yaml")
HEAD, GPU_WORKER = Bundle(6, 0), Bundle(4, 1)
#: one trial of `lcfed sweep --gpus-per-trial 1` with 2 device actors: its driver's bundle and the actors'
TRIAL = Ask("a trial", (Bundle(0.5), Bundle(1, 0.5), Bundle(1, 0.5)))


def test_the_node_types_of_cluster_yaml():
    assert (CLUSTER.head.name, CLUSTER.head.size, CLUSTER.head.max_workers) == ("head", HEAD, 0)
    assert [(t.name, t.size, t.max_workers) for t in CLUSTER.workers] == [("gpu_worker", GPU_WORKER, 4)]
    assert CLUSTER.max_workers == 4 and CLUSTER.largest().name == "gpu_worker"


def test_an_ask_that_needs_a_gpu_waits_for_the_gpu_worker_type():
    # the head has no GPU: both 0.5-GPU bundles go on one new gpu_worker (GPU 0.5 + 0.5 = 1), the driver's on the head
    verdict = judge(TRIAL, CLUSTER)
    assert verdict.error is None and verdict.waits_for == ("gpu_worker",)
    assert verdict.line == ("a trial (1 x {CPU: 0.5} + 2 x {CPU: 1, GPU: 0.5}) fits only once the autoscaler adds "
                            "1 x gpu_worker {CPU: 4, GPU: 1}")
    assert judge(TRIAL, CLUSTER, [HEAD, GPU_WORKER]).fits_now  # with a GPU worker up it fits now
    # 3 bundles of GPU 0.5 need 2 workers (1.5 GPUs)
    assert judge(Ask("x", (Bundle(1, 0.5),) * 3), CLUSTER).waits_for == ("gpu_worker",)
    assert "adds 2 x gpu_worker" in judge(Ask("x", (Bundle(1, 0.5),) * 3), CLUSTER).line
    assert judge(Ask("x", (Bundle(2),) * 3), CLUSTER).fits_now  # CPU-only: the head's 6 CPUs hold 3 x 2


def test_a_bundle_no_node_type_holds_is_refused_naming_it_and_the_largest_type():
    verdict = judge(Ask("a trial", (Bundle(0.5), Bundle(1, 2))), CLUSTER)
    assert verdict.error is not None and "\n" not in verdict.error
    assert verdict.error.startswith("a trial asks for a bundle {CPU: 1, GPU: 2} that no node can hold")
    assert "the largest node type is gpu_worker {CPU: 4, GPU: 1}" in verdict.error
    assert judge(Ask("x", (Bundle(8),)), CLUSTER).error is not None  # more CPUs than any node: 6 and 4
    assert judge(Ask("x", (Bundle(8),)), CLUSTER, [Bundle(16)]).fits_now  # a live node that large holds it


def test_bundles_that_each_fit_but_not_all_together_are_refused():
    # 5 whole GPUs: each bundle fits a gpu_worker, but max_workers is 4
    verdict = judge(Ask("the federation", (Bundle(1, 1),) * 5), CLUSTER)
    assert verdict.error is not None and "more than the cluster holds at its largest" in verdict.error
    assert "(the head {CPU: 6}; at most 4 workers of gpu_worker {CPU: 4, GPU: 1} x 4;" in verdict.error
    assert judge(Ask("x", (Bundle(1, 1),) * 4), CLUSTER).waits_for == ("gpu_worker",)
    # two workers already up count against max_workers: 2 more, so 4 GPUs in all
    assert judge(Ask("x", (Bundle(1, 1),) * 4), CLUSTER, [HEAD, GPU_WORKER, GPU_WORKER]).line.count("2 x gpu_worker") == 1
    assert judge(Ask("x", (Bundle(1, 1),) * 5), CLUSTER, [HEAD, GPU_WORKER, GPU_WORKER]).error is not None
    # STRICT_PACK: all on one node; {CPU 3} + {CPU 2, GPU 1} = {CPU 5, GPU 1} fits no type (the worker has 4 CPUs)
    assert judge(Ask("x", (Bundle(3), Bundle(2, 1)), "STRICT_PACK"), CLUSTER).error is not None
    assert judge(Ask("x", (Bundle(2), Bundle(2, 1)), "STRICT_PACK"), CLUSTER).waits_for == ("gpu_worker",)


def test_trials_in_flight_at_max_workers():
    # each gpu_worker holds one trial's two 0.5-GPU bundles; the head holds the drivers' {CPU 0.5}
    assert in_flight(TRIAL, CLUSTER) == 4
    assert in_flight(Ask("x", (Bundle(0.5), Bundle(1, 0.25), Bundle(1, 0.25))), CLUSTER) == 8  # 2 per worker: 4 CPUs
    assert in_flight(Ask("x", (Bundle(1, 2),)), CLUSTER) == 0


def test_a_cluster_config_without_resources_or_head_is_not_judged():
    with pytest.raises(ValueError, match="states no resources"):
        cluster_from({"head_node_type": "h", "available_node_types": {"h": {"node_config": {}}}})
    with pytest.raises(ValueError, match="head_node_type"):
        cluster_from({"available_node_types": {"h": {"resources": {"CPU": 1}}}})


def _lcfed(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    # no launcher config in this HOME; a Ray started would leave its session under RAY_TMPDIR, in tmp_path
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "RAY_TMPDIR": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "tune_jobs", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.subprocess
def test_a_sweep_no_node_type_holds_is_refused_in_one_line_before_anything_starts(tmp_path):
    """2 GPUs per trial in one device actor: a bundle {CPU: 1, GPU: 2}, and cluster.yaml's GPU workers have 1."""
    storage = tmp_path / "tune"
    proc = _lcfed(tmp_path, "sweep", "--space", "mu_lambda.yaml", "--cluster", str(ROOT / "cluster.yaml"),
                        "--gpus-per-trial", "2", "--trial-engine", "ray", "--storage", str(storage), "--no-track",
                        "--json", str(tmp_path / "s.json"))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and not proc.stdout, (proc.stdout, err)
    assert err.startswith("lcfed: cluster error: a trial asks for a bundle {CPU: 1, GPU: 2} that no node can hold")
    assert "the largest node type is gpu_worker {CPU: 4, GPU: 1}" in err, err
    # nothing made, no Ray (its session directory would be under RAY_TMPDIR); the time it takes is in the
    # issue's note (a timed assertion would measure the machine's load, not the product)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # 10 devices on 5 whole-GPU actors: each fits a gpu_worker, but there are at most 4
    run = _lcfed(tmp_path, "run", "--engine", "ray", "--cluster", str(ROOT / "cluster.yaml"), "--no-track",
                    "--set", "data.num_devices=10", "--set", "engine.num_actors=5", "--set", "engine.gpus_per_actor=1")
    err = run.stderr.strip()
    assert run.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("lcfed: cluster error: the federation asks for 5 x {CPU: 1, GPU: 1}, more than the cluster "
                          "holds at its largest (the head {CPU: 6}; at most 4 workers of gpu_worker {CPU: 4, GPU: 1} "
                          "x 4;"), err


def test_submit_checks_a_run_or_sweep_entrypoint_before_shipping(tmp_path, monkeypatch):
    monkeypatch.delenv("LCFED_CLUSTER", raising=False)
    sweep = ["--", "lcfed", "sweep", "--space", "mu_lambda.yaml", "--gpus-per-trial", "2", "--trial-engine", "ray"]
    with pytest.raises(ClusterError, match=r"a trial asks for a bundle \{CPU: 1, GPU: 2\}"):
        check_entrypoint(sweep, str(tmp_path), str(ROOT / "cluster.yaml"))
    assert "LCFED_CLUSTER" not in os.environ  # a file of this machine: not the job's
    check_entrypoint([*sweep[:-3], "1"], str(tmp_path), str(ROOT / "cluster.yaml"))  # 1 GPU a trial fits a worker
    check_entrypoint(["--", "lcfed", "methods"], str(tmp_path), str(ROOT / "cluster.yaml"))  # no ask: nothing to check


def test_check_prints_the_plan_on_a_cluster(capsys, monkeypatch):
    # main() exports --cluster as $LCFED_CLUSTER; set here so that monkeypatch removes it after the test (a delenv of
    # an unset variable restores nothing): left set, it would steer the trial engine of later sweeps in this process
    monkeypatch.setenv("LCFED_CLUSTER", "")
    path = str(ROOT / "cluster.yaml")
    assert main(["check", "--cluster", path, "--gpus-per-trial", "1", "--set", "engine.num_actors=2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"cluster {path}: head head {{CPU: 6}}; workers gpu_worker {{CPU: 4, GPU: 1}} x 4 (max_workers 4)",
        "a trial (1 x {CPU: 0.5} + 2 x {CPU: 1, GPU: 0.5}) fits only once the autoscaler adds 1 x gpu_worker "
        "{CPU: 4, GPU: 1}",
        # lcfed run sizes a federation to the GPUs up: at 4 workers, 2 actors take one GPU each
        "the federation (2 x {CPU: 1, GPU: 1}) fits only once the autoscaler adds 2 x gpu_worker {CPU: 4, GPU: 1}",
        "trials (ray trial engine, --gpus-per-trial 1) per node: head 0, gpu_worker 1",
        "trials in flight at max_workers: 4"]
