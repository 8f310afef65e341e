"""The ``engine`` section: how rounds execute (in-process, or on Ray with a pool of device actors), and the
rules of its fields (:func:`check_engine`): the actor pool's resources, each host's threads, memory and
numerics, against this machine's limits (:func:`machine_limits`). The engine names come from
:data:`lcfed.registry.ENGINES`, a table of names: checking a config imports no engine."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import psutil

from lcfed.errors import require
from lcfed.numerics import PROFILES
from lcfed.registry import ENGINES

__all__ = ["DATA_READS", "EngineConfig", "PLACEMENT_TIMEOUT_MAX_S", "THREADS_PER_CPU", "check_engine", "machine_limits",
           "threads_why"]


@dataclass(frozen=True)
class EngineConfig:
    """How rounds execute: in-process, or on Ray with a pool of device actors."""

    kind: str = "local"
    num_actors: int = 0
    devices_per_actor: int = 0
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = -1.0
    gpus: float = -1.0
    actors_per_gpu: int = 2
    placement_timeout_s: float = 300.0
    torch_threads: int = 1
    workers: int = 0
    vectorize: str = "auto"
    vectorize_max: int = 256
    device: str = "auto"
    address: str | None = None
    num_cpus: int = 0
    object_store_mb: int = 256
    max_failures: int = 3
    numerics: str = "portable"
    state_memory_mb: float = 0.0
    spill_dir: str = ""
    data_reads: str = "auto"

    def validate(self, prefix: str = "engine") -> None:
        check_engine(self, prefix)


#: CPU threads (``engine.torch_threads``, ``engine.num_cpus``) allowed per CPU of this machine: a few
#: times the cores only oversubscribes, far more makes torch's OpenMP run out of memory at the first kernel
THREADS_PER_CPU = 4


def machine_limits() -> tuple[int, int, int]:
    """(this machine's CPUs, the most CPU threads a field may ask for, its memory in MB)."""
    cpus = os.cpu_count() or 1
    return cpus, THREADS_PER_CPU * cpus, psutil.virtual_memory().total // 2**20


def threads_why(cpus: int) -> str:
    """Where the most threads a field may ask for comes from, for its message: ``4 x this machine's 2 CPUs``."""
    return f"{THREADS_PER_CPU} x this machine's {cpus} CPUs"


def check_engine(engine: EngineConfig, prefix: str = "engine") -> None:
    """``engine.*``: the actor pool's resources, then each host's threads, memory and numerics."""
    require(engine.kind in ENGINES, f"{prefix}.kind", engine.kind, f"one of {list(ENGINES)}")
    require(engine.num_actors >= 0, f"{prefix}.num_actors", engine.num_actors, "must be >= 0 (0 = one per CPU)")
    require(
        engine.devices_per_actor >= 0,
        f"{prefix}.devices_per_actor",
        engine.devices_per_actor,
        "must be >= 0 (0 = spread devices over the actors)",
    )
    require(engine.cpus_per_actor > 0, f"{prefix}.cpus_per_actor", engine.cpus_per_actor, "must be > 0")
    require(
        engine.gpus_per_actor == -1 or 0 <= engine.gpus_per_actor <= 1,
        f"{prefix}.gpus_per_actor",
        engine.gpus_per_actor,
        "must be in [0, 1], or -1 for auto (1 / actors when GPUs exist, else 0)",
    )
    require(
        engine.gpus == -1 or 0 <= engine.gpus < math.inf,
        f"{prefix}.gpus",
        engine.gpus,
        "must be >= 0 (GPUs the device actors ask for in all; state it so an autoscaler starts GPU workers), "
        "or -1 for auto (every GPU the cluster has now)",
    )
    require(engine.actors_per_gpu >= 1, f"{prefix}.actors_per_gpu", engine.actors_per_gpu,
            "must be >= 1 (device actors sharing one GPU)")
    require(
        0 < engine.placement_timeout_s <= PLACEMENT_TIMEOUT_MAX_S,
        f"{prefix}.placement_timeout_s",
        engine.placement_timeout_s,
        f"must be > 0 and <= {PLACEMENT_TIMEOUT_MAX_S:,} seconds (a day: how long to wait for the cluster to place "
        "the federation's actors, e.g. while an autoscaler starts nodes)",
    )
    _check_host(engine, prefix)


def _check_host(engine: EngineConfig, prefix: str) -> None:
    """Threads, CPUs and memory against this machine's, failures tolerated, spilling and numerics."""
    require(engine.torch_threads >= 1, f"{prefix}.torch_threads", engine.torch_threads, "must be >= 1")
    cpus, max_threads, memory_mb = machine_limits()
    require(engine.torch_threads <= max_threads, f"{prefix}.torch_threads", engine.torch_threads,
            f"must be <= {max_threads} ({threads_why(cpus)})")
    require(
        engine.workers >= 0,
        f"{prefix}.workers",
        engine.workers,
        "must be >= 0 (threads training devices per host; 0 = one per CPU the host has, 1 on a GPU)",
    )
    require(
        engine.vectorize in ("auto", "always", "never"),
        f"{prefix}.vectorize",
        engine.vectorize,
        "one of ['auto', 'always', 'never'] (auto = vmap devices' steps when they train on a GPU)",
    )
    require(engine.vectorize_max >= 1, f"{prefix}.vectorize_max", engine.vectorize_max, "must be >= 1 (devices per vmapped call)")
    require(engine.device in ("auto", "cpu", "cuda"), f"{prefix}.device", engine.device, "one of ['auto', 'cpu', 'cuda']")
    require(engine.num_cpus >= 0, f"{prefix}.num_cpus", engine.num_cpus, "must be >= 0 (0 = all)")
    require(engine.num_cpus <= max_threads, f"{prefix}.num_cpus", engine.num_cpus,
            f"must be <= {max_threads} ({threads_why(cpus)})")
    require(engine.object_store_mb >= 64, f"{prefix}.object_store_mb", engine.object_store_mb, "must be >= 64")
    require(engine.object_store_mb <= memory_mb, f"{prefix}.object_store_mb", engine.object_store_mb,
            f"must be <= {memory_mb} (this machine's memory in MB; Ray refuses more)")
    require(engine.max_failures >= 0, f"{prefix}.max_failures", engine.max_failures, "must be >= 0 (lost hosts tolerated per run)")
    require(0 <= engine.state_memory_mb < math.inf, f"{prefix}.state_memory_mb", engine.state_memory_mb,
            "must be >= 0 (MB of device states a host keeps in memory before spilling to disk; 0 = no limit)")
    require(not engine.spill_dir or engine.state_memory_mb > 0, f"{prefix}.spill_dir", engine.spill_dir,
            "is where device states spill past engine.state_memory_mb, which is 0 (no limit: nothing spills); set "
            "engine.state_memory_mb, or leave engine.spill_dir empty")
    require(engine.numerics in PROFILES, f"{prefix}.numerics", engine.numerics,
            f"one of {list(PROFILES)} (portable: CPU kernels pinned, the same numbers on any x86-64, Intel or AMD; "
            "native: the CPU's own kernels, numbers tied to the CPU)")
    require(engine.data_reads in DATA_READS, f"{prefix}.data_reads", engine.data_reads,
            f"one of {list(DATA_READS)} (who reads a cached dataset's samples on Ray: auto = each device actor "
            "where every node sees the driver's cache file, else the driver; nodes = each device actor, from "
            "storage every node reaches; driver = the driver, which sends them)")


#: the longest engine.placement_timeout_s (Ray's waits take a C long of milliseconds)
PLACEMENT_TIMEOUT_MAX_S = 86_400


#: engine.data_reads: who reads a dataset's samples from its cache file on Ray
DATA_READS = ("auto", "nodes", "driver")
