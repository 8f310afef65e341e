"""The in-process runner is the reference; the Ray engine must reproduce it number for number."""

from __future__ import annotations

import os
import pickle
import threading
from dataclasses import replace

import numpy as np
import pytest
import ray

from actors.hosts import Hosts
from actors.liveness import ActorStartError, get, start_failure
from actors.nodes import alive_nodes_info, nodes_without
from actors.placement import NodeResources, cluster_layout, fits, pool_layout
from actors.ray_engine import RayEngine, run_ray
from lcfed.config import EngineConfig
from lcfed.data import DataError
from lcfed.data.cache import file_version, read_rows
from lcfed.engines import run_closed
from lcfed.engines.hosted import HostedDevices
from lcfed.engines.local import open_local, run_local
from lcfed.errors import ConfigError
from lcfed.run import checkpoint
from lcfed.run.setup import partitioned, prepare
from lcfed.run.shards import FileShard
from lcfed.run.sources import load
from tests.conftest import same_history, same_metrics, tiny_config
from tune_jobs.run_command import placement_line


def test_in_process_run_is_deterministic_whatever_its_worker_threads_and_the_seed_changes_it():
    """LCFed's case of the test below; the same numbers twice, whatever the threads (one run of each, not two
    of one); another seed, other numbers."""
    one = run_local(tiny_config("engine.workers=1"))
    three = run_local(tiny_config("engine.workers=3"))
    same_metrics(one.history, three.history)
    assert one.final["acc_mean"] > 0.3
    assert one.assignment is not None and one.assignment.min() >= 0
    other = run_local(tiny_config("seed=1"))
    assert one.history[-1]["train_loss"] != other.history[-1]["train_loss"]


@pytest.mark.parametrize("method", ["ifca", "perfedavg", "fedper", "dcpfl"])  # lcfed: the test above
def test_worker_threads_do_not_change_the_numbers(method):
    extra = ["train.rounds=7", "method.t_start=2"] if method == "dcpfl" else []
    one = run_local(tiny_config(f"method.name={method}", "engine.workers=1", *extra))
    three = run_local(tiny_config(f"method.name={method}", "engine.workers=3", *extra))
    same_metrics(one.history, three.history)


def test_hosted_devices_train_on_several_threads():
    cfg = tiny_config("method.name=fedavg")
    setup = prepare(cfg)
    hosted = HostedDevices(setup, range(8), workers=3)
    try:
        seen = []
        plain = hosted.strategy.local

        def local(ctx, *args):
            seen.append((threading.current_thread().name, id(ctx.net)))
            return plain(ctx, *args)

        hosted.strategy.local = local
        msgs = hosted.train(0, range(8), setup.federation.init, {})
    finally:
        hosted.close()
    assert [m.device for m in msgs] == list(range(8))
    threads = {t for t, _ in seen}
    assert len(threads) >= 2 and all(t.startswith("lcfed-device") for t in threads)
    # one model skeleton per thread, never shared between two threads
    assert len({n for _, n in seen}) == len(threads)


def test_pool_layout():
    eng = EngineConfig(kind="ray")
    lay = pool_layout(eng, 10, cpus=2, gpus=0)
    assert [len(b) for b in lay.blocks] == [5, 5] and lay.gpus_per_actor == 0 and lay.cpus_per_actor == 1
    one_each = pool_layout(EngineConfig(kind="ray", devices_per_actor=1), 8, cpus=2, gpus=2)
    assert len(one_each.blocks) == 8 and one_each.cpus_per_actor == 0.25 and one_each.gpus_per_actor == 0.25
    fixed = pool_layout(EngineConfig(kind="ray", num_actors=4, gpus_per_actor=0.125), 10, cpus=16, gpus=1)
    assert [len(b) for b in fixed.blocks] == [3, 3, 3, 1] and fixed.gpus_per_actor == 0.125
    assert sorted(d for b in fixed.blocks for d in b) == list(range(10))


HEAD = NodeResources(cpus=2, gpus=0)
GPU_WORKER = NodeResources(cpus=1, gpus=1)


def test_cluster_layout_puts_actors_on_gpu_workers_sharing_their_gpus():
    # CPU head + 3 x (1 CPU, 1 GPU): 2 actors per GPU planned (6), 8 devices -> 4 blocks of 2;
    # each worker holds ceil(4/3) = 2 of them: CPU 1/2, GPU 1/2 each
    lay = cluster_layout(EngineConfig(kind="ray"), 8, [HEAD, GPU_WORKER, GPU_WORKER, GPU_WORKER])
    assert [len(b) for b in lay.blocks] == [2, 2, 2, 2] and (lay.cpus_per_actor, lay.gpus_per_actor) == (0.5, 0.5)
    assert lay.bundles()[0] == {"CPU": 0.5, "GPU": 0.5}
    assert fits(lay, [HEAD, GPU_WORKER, GPU_WORKER, GPU_WORKER]) and not fits(lay, [HEAD, GPU_WORKER])
    # a stated total caps the ask: 1 GPU -> 2 actors of half a GPU, one per worker, a whole CPU each
    one = cluster_layout(EngineConfig(kind="ray", gpus=1), 8, [HEAD, GPU_WORKER, GPU_WORKER, GPU_WORKER])
    assert len(one.blocks) == 2 and (one.cpus_per_actor, one.gpus_per_actor) == (1.0, 0.5)
    # explicit CPU-only: the GPU workers' and the head's CPUs all count (5 slots; 8 devices in blocks of 2)
    cpu = cluster_layout(EngineConfig(kind="ray", gpus_per_actor=0), 8, [HEAD, GPU_WORKER, GPU_WORKER, GPU_WORKER])
    assert len(cpu.blocks) == 4 and (cpu.cpus_per_actor, cpu.gpus_per_actor) == (1.0, 0.0)


def test_cluster_layout_asks_for_stated_gpus_before_any_gpu_node_exists():
    # an autoscaling cluster with only its head up: the pending GPU ask is what starts a worker
    lay = cluster_layout(EngineConfig(kind="ray", gpus=1), 8, [NodeResources(8, 0)])
    assert len(lay.blocks) == 2 and (lay.cpus_per_actor, lay.gpus_per_actor) == (1.0, 0.5)
    assert not fits(lay, [NodeResources(8, 0)]) and fits(lay, [NodeResources(8, 0), NodeResources(4, 1)])
    # nothing stated, no GPU anywhere: CPU actors, one per CPU
    cpu = cluster_layout(EngineConfig(kind="ray"), 10, [NodeResources(2, 0), NodeResources(2, 0)])
    assert [len(b) for b in cpu.blocks] == [3, 3, 3, 1] and (cpu.cpus_per_actor, cpu.gpus_per_actor) == (1.0, 0.0)
    many = cluster_layout(EngineConfig(kind="ray", devices_per_actor=1), 8, [NodeResources(2, 0)])
    assert len(many.blocks) == 8 and many.cpus_per_actor == 0.25 and fits(many, [NodeResources(2, 0)])


def test_unplaceable_pool_on_a_private_ray_fails_at_once(ray_cluster):
    from actors.nodes import PlacementError, alive_nodes, place_pool

    lay = cluster_layout(EngineConfig(kind="ray", num_actors=3, gpus_per_actor=1), 3, alive_nodes())
    with pytest.raises(PlacementError, match=r"asked for 3 device actor\(s\) x \{CPU: 0.6666, GPU: 1\}.*1 alive node"):
        place_pool(lay, timeout_s=300, can_grow=False)


@ray.remote
def _bad_config() -> None:
    raise ConfigError("method.mu", -1, "must be >= 0")


def test_config_error_crosses_ray_intact(ray_cluster):
    with pytest.raises(ConfigError, match="method.mu: got -1; must be >= 0") as info:
        ray.get(_bad_config.remote())
    assert (info.value.field, info.value.value) == ("method.mu", -1)


def test_the_private_ray_processes_a_run_watches_are_there_and_alive(ray_cluster):
    """What actors/liveness.py watches (the raylet and GCS of a private Ray, by Ray's process types) exists
    under a private Ray, so a lost one would be seen (the kill itself: tests/test_lifecycle.py, slow)."""
    from actors.liveness import ESSENTIAL, check_cluster, lost_processes

    live = {kind for kind, _ in ray._private.worker._global_node.live_processes()}
    assert set(ESSENTIAL) <= live, live
    assert lost_processes() == []
    check_cluster()


class KillAt:
    """Observer that kills an actor of the running federation after a given round."""

    def __init__(self, engine: RayEngine, rnd: int, which: str) -> None:
        self.engine, self.rnd, self.which = engine, rnd, which

    def on_start(self, cfg, fed) -> None: ...
    def on_end(self, result) -> None: ...

    def on_round(self, rnd, metrics, stats) -> None:
        if rnd == self.rnd:
            target = self.engine.hosts.server if self.which == "server" else self.engine.hosts.devices[1]
            ray.kill(target)


def test_ray_engine_matches_in_process_on_a_testbed_of_a_table(ray_cluster, tmp_path):
    """The driver reads the file and relabels the groups once; each actor reads its rows of the cache file."""
    from tests.test_data_formats import write_blobs

    write_blobs(tmp_path / "blobs.csv")
    cfg = tiny_config("data.dataset=file", "data.path=blobs.csv", f"data.data_dir={tmp_path}", "model.name=mlp",
                      "data.partition=iid", "data.testbed=label_permuted", "data.testbed_groups=2",
                      "data.num_devices=6", "method.name=ifca", "method.num_clusters=2", "train.rounds=2")
    local = run_local(cfg)
    remote = run_ray(cfg.replace(**{"engine.kind": "ray", "engine.num_actors": 2}))
    assert len(local.history) == len(remote.history) == 2
    for a, b in zip(local.history, remote.history, strict=True):
        assert {k: v for k, v in a.items() if k != "round_seconds"} == {k: v for k, v in b.items() if k != "round_seconds"}


class ChangeFileAndKill(KillAt):
    """Rewrites the file the actors read their rows of (a newer mtime), then kills an actor."""

    def on_round(self, rnd, metrics, stats) -> None:
        if rnd == self.rnd:
            path = self.engine.hosts.file[0]
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        super().on_round(rnd, metrics, stats)


def test_each_actor_reads_its_rows_of_a_cached_file_with_the_same_numbers_and_lost_actors_restart(ray_cluster, tmp_path):
    """With the dataset's cache file in reach of every node, the driver sends each device actor row numbers,
    not samples, and the actor reads its rows there: the same numbers as in-process (the driver sending the
    samples, engine.data_reads=driver: tests/test_multinode.py). A subset's rows map into the file's.

    Lost actors, in the same Ray run: a lost device actor is restarted and reads its rows again, a lost server
    actor is restarted, and each time the run replays from the last checkpoint to the same numbers (from the start
    without one: the generated-data test below); the checkpoint holds the device states a part per actor. A device
    actor lost after its file changed is not restarted (its rows would be another version's): the run stops with
    the data error."""
    digits = load(tiny_config())
    np.savez(tmp_path / "digits.npz", x=digits.x, y=digits.y)
    cfg = tiny_config("data.dataset=file", "data.path=digits.npz", f"data.data_dir={tmp_path}", "engine.num_actors=2",
                      "data.holdout_fraction=0.25", "data.val_fraction=0.2", "data.subset=1500")
    local = run_closed(reference := open_local(cfg))
    ckpt = tmp_path / "ckpt"
    engine = RayEngine(cfg.replace(**{"engine.kind": "ray", "checkpoint.every": 1, "checkpoint.dir": str(ckpt)}))
    try:
        # the actors' pixel counts add up to the scaling the driver would fit (it reads no sample)
        assert engine.setup.scaling == reference.setup.scaling
        shards = ray.get(engine.hosts.shard_refs)
        with pytest.warns(UserWarning, match="restarting lost hosts"):
            remote = engine.run([KillAt(engine, 0, "device"), KillAt(engine, 1, "server")])
        parts = checkpoint.load(ckpt / "latest.pt").device_states.parts
        blocks = [set(b) for b in engine.layout.blocks]
        with pytest.warns(UserWarning, match="restarting lost hosts"), \
                pytest.raises(DataError, match="changed since the run read it"):
            engine.run([ChangeFileAndKill(engine, 1, "device")])
    finally:
        engine.close()
    same_history(local.history, remote.history)
    assert [(f["replayed_from"], f["error"].split(" (")[0]) for f in remote.failures] == [
        (1, "lost device actor 1"), (2, "lost server actor")]
    assert len(parts) >= 2 and all(sum(set(p.devices) <= b for b in blocks) == 1 for p in parts)
    assert remote.placement["data_reads"] == "nodes"
    assert placement_line(remote.placement).endswith("read on the nodes")
    # no sample went through the object store: rows, labels and the partition (~10 %)
    assert all(isinstance(s, FileShard) for s in shards)
    rows = sum(len(s.rows) for s in shards)
    assert rows == 1500 and sum(len(pickle.dumps(s)) for s in shards) < rows * digits.x[0].nbytes / 10


def test_a_node_reads_only_the_version_of_the_file_the_driver_partitioned(ray_cluster, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(12, dtype=np.uint8).reshape(6, 2))
    version = file_version(str(path))
    assert read_rows(str(path), version, np.array([1, 4])).tolist() == [[2, 3], [8, 9]]
    node = [n["NodeID"] for n in alive_nodes_info()]
    assert nodes_without(str(path), version, node) == []  # the driver's node is not asked: it sees the driver's file
    with pytest.MonkeyPatch.context() as mp:  # asked as another node would be, it sees it; another version or path not
        mp.setattr("ray.runtime_context.RuntimeContext.get_node_id", lambda self: "elsewhere")
        assert nodes_without(str(path), version, node) == []
        assert nodes_without(str(path), (*version[:2], "0" * 16), node) == node  # same size and mtime, other bytes
        assert nodes_without(str(path), (version[0], version[1] + 1, version[2]), node) == node
        assert nodes_without(str(tmp_path / "elsewhere.npy"), version, node) == node
    os.utime(path, ns=(version[1] + 10**9, version[1] + 10**9))
    with pytest.raises(DataError, match="changed since the run read it"):
        read_rows(str(path), version, np.array([1]))
    path.unlink()
    with pytest.raises(DataError, match="engine.data_reads=driver"):
        read_rows(str(path), version, np.array([1]))


def test_an_actor_that_cannot_start_is_its_error_not_a_lost_node(ray_cluster, tmp_path):
    """A device actor whose node cannot read its rows dies in its creation: the driver gets the DataError's text
    (the CLI's one line), not Ray's ActorDiedError taken for a lost process; another error names the actor."""
    ds = load(tiny_config())
    part, _ = partitioned(tiny_config(), ds)
    gone = FileShard.cut(replace(ds, x_file=str(tmp_path / "x.npy")), part, range(2), (1, 1, "0"))
    layout = pool_layout(EngineConfig(), 2, 1, 0)
    _server, actor = Hosts.generate(replace(layout, blocks=layout.blocks[:1]), [gone])
    with pytest.raises(DataError, match=r"x.npy: cannot be read here .*engine.data_reads=driver"):
        get(actor.pixel_counts.remote([]))
    died = ray.exceptions.RayActorError(actor_init_failed=True, error_msg=(
        "The actor died because of an error raised in its creation task, \x1b[36mray::DeviceActor.__init__()\x1b[39m "
        "(pid=1, ip=10.0.0.2)\n  File \"x.py\", line 1, in __init__\nValueError: no such model: lenet7"))
    failure = start_failure(died)
    assert isinstance(failure, ActorStartError)
    assert str(failure) == "DeviceActor could not start: ValueError: no such model: lenet7"
    assert start_failure(ray.exceptions.RayActorError()) is None  # died otherwise: a restart may cure it


#: generated data, built on the actors' nodes: 1,000 devices (40,000 samples) over 2 actors, so the input
#: scaling's chunks of 8,192 training rows straddle the actors; known groups, a validation split, newcomers;
#: each evaluation on a sample of the devices (all 1,000 would be most of the run)
NODE_LOCAL = ("data.dataset=leaf_synthetic", "data.partition=natural", "model.name=mlp", "data.num_devices=1000",
              "data.synthetic_clusters=3", "data.val_fraction=0.2", "data.holdout_fraction=0.01",
              "method.name=ifca", "method.num_clusters=3", "train.participation=0.01", "train.rounds=4",
              "train.eval_devices=60", "train.final_eval_devices=50", "engine.num_actors=2")


def test_generated_data_is_built_on_the_actors_nodes_with_the_same_numbers(ray_cluster):
    cfg = tiny_config(*NODE_LOCAL)
    local = run_closed(reference := open_local(cfg))
    engine = RayEngine(cfg.replace(**{"engine.kind": "ray"}))
    try:
        assert engine.node_local  # the driver generated nothing: it partitioned the actors' labels
        assert list(engine.timings) == ["ray_attach", "placement", "data_on_nodes", "actors"]  # where the start went
        held = engine.holdings()["device_actors"]
        remote = engine.run([KillAt(engine, 1, "device")])  # and a lost actor generates its devices again
    finally:
        engine.close()
    assert "close" in engine.timings and "ray_shutdown" not in engine.timings  # the test's Ray is not the engine's
    assert engine.setup.scaling == reference.setup.scaling  # the chunk sums of two actors add up to the same bits
    same_history(local.history, remote.history)
    assert np.array_equal(local.assignment, remote.assignment)
    same_metrics([local.final], [remote.final])  # the sampled final evaluation and the newcomers' scores too
    assert "acc_new_mean" in local.final
    (failure,) = remote.failures
    assert failure["replayed_from"] == 0 and "device actor 1" in failure["error"]  # no checkpoint: from the start
    assert [h["data_devices"] for h in held] == [list(b) for b in engine.layout.blocks]
    assert sum(h["data_rows"] for h in held) == 40_000
