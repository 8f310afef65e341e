"""``--cluster FILE``: a run's or a sweep's resource ask checked against what the cluster can ever hold
(:mod:`actors.feasibility`) before anything starts or waits.

Two checks. Before Ray (the commands): each bundle against the node types of ``--cluster`` (or
``$LCFED_CLUSTER``, or the launcher's config on a head it left, ``~/ray_bootstrap_config.yaml``), so an
ask no node type holds is one line within a second, with nothing started. Once attached (the Ray engine's
placement, the sweep's trials): the ask against the live nodes too, saying which node type it waits for.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from actors.connect import ClusterError
from actors.feasibility import (
    CLUSTER_ENV,
    Ask,
    Bundle,
    Cluster,
    Verdict,
    in_flight,
    judge,
    known_cluster,
    load_cluster,
    summary,
)
from actors.placement import NodeResources, cluster_layout
from lcfed import logs
from lcfed.config import ExperimentConfig
from lcfed.errors import ConfigError

CLUSTER_HELP = ("the Ray cluster launcher config (cluster.yaml) whose node types the run's resource ask is checked "
                "against before anything starts (default: $LCFED_CLUSTER, or the launcher's config on its head)")


def cluster_option(p: argparse.ArgumentParser) -> None:
    """``--cluster FILE`` (:data:`CLUSTER_HELP`)."""
    p.add_argument("--cluster", metavar="FILE", help=CLUSTER_HELP)


def use_cluster(path: str | None) -> Cluster | None:
    """The cluster ``--cluster`` names (exported as ``$LCFED_CLUSTER``, so the engine and Tune trials in this
    process's children judge with it too), else ``$LCFED_CLUSTER``'s, else the launcher's config on its head;
    None where none is known (nothing is judged then). A ``--cluster`` that cannot be read is a ConfigError."""
    if path:
        try:
            cluster = load_cluster(path)
        except ValueError as exc:
            raise ConfigError("--cluster", path, str(exc)) from None
        os.environ[CLUSTER_ENV] = str(Path(path).expanduser().resolve())
        return cluster
    return known_cluster()


def sweep_ask(cfg: ExperimentConfig, gpus_per_trial: float, engine: str) -> Ask:
    """One trial's bundles, as :func:`tune_jobs.sweep.trial.trial_resources` asks Tune for them."""
    from tune_jobs.sweep.options import local_trial_cpus, trial_layout

    if engine == "local":
        return Ask("a trial", (Bundle(local_trial_cpus(cfg), gpus_per_trial),))
    n, cpu, gpu = trial_layout(cfg, gpus_per_trial)
    return Ask("a trial", (Bundle(0.5), *[Bundle(cpu, gpu)] * n))


def sweep_engine(choice: str, gpus_per_trial: float, cluster: Cluster) -> str:
    """The trial engine ``auto`` picks on ``cluster`` (:func:`~tune_jobs.sweep.options.resolve_trial_engine`),
    told before Ray: ``local`` where the cluster is one node at most."""
    from tune_jobs.sweep.options import resolve_trial_engine

    one_node = cluster.max_workers == 0 or not any(t.max_workers for t in cluster.workers)
    return resolve_trial_engine(choice, gpus_per_trial, nodes=1 if one_node else 2)


def trial_engine_nodes(live: list[NodeResources]) -> int:
    """The node count the sweep's ``--trial-engine auto`` decides on: the live nodes, or at least two where the known
    cluster's autoscaler may add workers (:func:`known_cluster`). A head that starts with no worker is then not
    taken for a one-node cluster: its GPU trials get the Ray trial engine, whose device actors go to the workers
    the autoscaler adds, as :func:`sweep_engine` told before Ray."""
    cluster = known_cluster()
    can_grow = cluster is not None and cluster.max_workers > 0 and any(t.max_workers for t in cluster.workers)
    return max(len(live), 2 if can_grow else 1)


def federation_ask(cfg: ExperimentConfig, nodes: list[NodeResources]) -> Ask:
    """The Ray engine's device actors on ``nodes`` (:func:`actors.placement.cluster_layout`), one PACK group."""
    layout = cluster_layout(cfg.engine, cfg.data.num_devices, nodes)
    return Ask("the federation", tuple(Bundle(b["CPU"], b.get("GPU", 0.0)) for b in layout.bundles()))


def largest_nodes(cluster: Cluster) -> list[NodeResources]:
    """The cluster at its largest: the head and every worker type at its cap (within ``max_workers``)."""
    nodes = [NodeResources(cluster.head.size.cpus, cluster.head.size.gpus)]
    for t in cluster.workers:
        room = min(t.max_workers, cluster.max_workers - (len(nodes) - 1))
        nodes += [NodeResources(t.size.cpus, t.size.gpus)] * max(0, room)
    return nodes


def refuse(verdict: Verdict) -> Verdict:
    """A verdict that never fits is a one-line :class:`~actors.connect.ClusterError`; one that waits says
    for what (stderr, unless quiet). Returns ``verdict``."""
    if verdict.error is not None:
        raise ClusterError(verdict.error)
    if verdict.waits_for and logs.progress_shown():
        print(f"lcfed: {verdict.line}: waiting for it (each federation up to engine.placement_timeout_s)",
              file=sys.stderr, flush=True)
    return verdict


def check_live(ask: Ask, live: list[NodeResources]) -> None:
    """Once attached: ``ask`` against the live nodes and the known node types (:func:`known_cluster`)."""
    cluster = known_cluster()
    if cluster is not None:
        refuse(judge(ask, cluster, [Bundle(n.cpus, n.gpus) for n in live]))


def check_run(cfg: ExperimentConfig, cluster: Cluster | None) -> None:
    """``lcfed run --engine ray``'s check before Ray: the federation's bundles as the cluster at its largest
    would size them, against its node types (waits are told once the live nodes are known)."""
    if cluster is not None and cfg.engine.kind == "ray":
        verdict = judge(federation_ask(cfg, largest_nodes(cluster)), cluster)
        if verdict.error is not None:
            refuse(verdict)


def check_sweep(cfg: ExperimentConfig, gpus_per_trial: float, trial_engine: str, cluster: Cluster | None) -> None:
    """``lcfed sweep``'s check before Ray: one trial's bundles against the node types."""
    if cluster is not None:
        engine = sweep_engine(trial_engine, gpus_per_trial, cluster)
        verdict = judge(sweep_ask(cfg, gpus_per_trial, engine), cluster)
        if verdict.error is not None:
            refuse(verdict)


def check_entrypoint(words: list[str], working_dir: str, path: str) -> None:
    """``lcfed submit --cluster FILE -- lcfed run|sweep ...``: the job's ask checked here, before it is submitted
    (its ``--config`` read from the working directory shipped)."""
    cluster = use_cluster(path)
    os.environ.pop(CLUSTER_ENV, None)  # a file of this machine: the job on the head reads the launcher's own
    words = words[1:] if words[:1] == ["--"] else words
    if len(words) < 2 or Path(words[0]).name != "lcfed" or words[1] not in ("run", "sweep"):
        return
    from lcfed.config import load_config
    from tune_jobs.cli import build_parser, command_of

    try:
        args = build_parser(command_of(words[1:]), lazy=True).parse_args(words[1:])
    except SystemExit:  # the job would say what is wrong with its words
        return
    config = str(Path(working_dir, args.config)) if args.config else None
    overrides = list(args.set) + ([f"engine.kind={args.engine}"] if getattr(args, "engine", None) else [])
    cfg = load_config(config, overrides)
    if words[1] == "run":
        check_run(cfg, cluster)
    else:
        check_sweep(cfg, args.gpus_per_trial, args.trial_engine, cluster)


def plan_lines(cfg: ExperimentConfig, cluster: Cluster, gpus_per_trial: float, trial_engine: str) -> list[str]:
    """``lcfed check --cluster``: the node types, what one trial and one federation ask and whether they fit,
    trials per node of each type and trials in flight at ``max_workers``."""
    types = "; ".join(f"{t.name} {t.size} x {t.max_workers}" for t in cluster.workers) or "none"
    lines = [f"cluster {cluster.source}: head {cluster.head.name} {cluster.head.size}; workers {types} "
             f"(max_workers {cluster.max_workers})"]
    engine = sweep_engine(trial_engine, gpus_per_trial, cluster)
    for ask in (sweep_ask(cfg, gpus_per_trial, engine), federation_ask(cfg, largest_nodes(cluster))):
        verdict = judge(ask, cluster)
        lines.append(verdict.error or verdict.line or f"{ask.what} ({summary(ask)}) fits the head as it starts")
    trial = sweep_ask(cfg, gpus_per_trial, engine)
    alone = {t.name: in_flight(trial, Cluster(t, (), 0)) for t in (cluster.head, *cluster.workers)}
    lines.append(f"trials ({engine} trial engine, --gpus-per-trial {gpus_per_trial:g}) per node: "
                 + ", ".join(f"{name} {k}" for name, k in alone.items()))
    lines.append(f"trials in flight at max_workers: {in_flight(trial, cluster)}")
    return lines
