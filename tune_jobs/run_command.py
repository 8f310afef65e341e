"""``lcfed run``: one experiment, in-process or on Ray, with its progress, tracking, checkpoint and resume, and
the summary it ends with (also what ``--json`` writes)."""


from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lcfed import engines, logs, numerics
from lcfed.config import ExperimentConfig, load_config
from lcfed.config.overrides import parse_override
from lcfed.errors import ConfigError, require
from lcfed.run.metric_catalog import SUMMARY, SUMMARY_AVERAGED
from lcfed.run.output_paths import check_output_dir, check_output_file
from lcfed.run.stop import stop_on_signals
from lcfed.tracking.naming import run_name
from lcfed.tracking.store import check_tracking_store
from lcfed.tracking.ui import ui_hint
from tune_jobs.feasible import check_run, cluster_option, use_cluster
from tune_jobs.options import config_options, examples, verbosity_options

# torch, the data and the run's modules are imported where they are used: a refused config costs no torch import


def add_parser(sub: Any) -> None:
    """lcfed run: one federation, tracked."""
    run = sub.add_parser(
        "run", help="run one federation and log it to MLflow",
        description="Run one federation (every round: local training, clustering, aggregation, evaluation), "
        "print a summary and log the run to MLflow. `lcfed config` with the same --config and --set "
        "prints the resolved config the run would use.",
        epilog=examples("lcfed run --config configs/demo.yaml",
                        "lcfed config --config configs/demo.yaml --set method.mu=0.5   # the config that run uses",
                        "lcfed run --config configs/demo.yaml --set method.mu=0.5",
                        "lcfed run --config configs/demo.yaml --set method.name=fedavg --json fedavg.json",
                        "lcfed run --config configs/demo.yaml --engine ray --no-track",
                        "lcfed run --config configs/demo.yaml --set checkpoint.dir=outputs/runs/demo --resume"))
    config_options(run)
    run.add_argument("--engine", choices=engines.names(), help="execution engine (overrides engine.kind)")
    run.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    cluster_option(run)
    run.add_argument("--private-ray", action="store_true",
                     help="with engine.kind=ray, start a Ray of this run's own even when `lcfed head start` left a "
                          "head running on this machine (which the run otherwise attaches to)")
    verbosity_options(run, "no progress, no notices: errors and the final summary only")
    run.add_argument("--json", metavar="FILE", help="also write the final metrics and timings as JSON")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in checkpoint.dir (same MLflow run, identical numbers)",
    )
    run.set_defaults(func=cmd_run)


def _observers(cfg: ExperimentConfig, args: argparse.Namespace, resume: Any) -> tuple[list[Any], Any]:
    from lcfed.run.progress import ProgressBar
    from lcfed.tracking.observer import MLflowObserver

    observers: list[Any] = [ProgressBar(disable=None if logs.progress_shown() else True)]
    tracker = None
    if cfg.tracking.enabled and not args.no_track:
        tracker = MLflowObserver(cfg.tracking.uri, resume_run_id=resume.tracking.get("run_id") if resume else None,
                                 backfill=resume.history if resume else (), guard=True,
                                 resume_command=args.resume_command,
                                 run_name=run_name(cfg, dict(parse_override(o) for o in args.set)))
        try:
            tracker.check()
        except Exception as exc:
            raise SystemExit(f"lcfed: cannot reach the MLflow tracking store {tracker.uri}: {exc}") from None
        note = tracker.new_run_if_gone() if resume else ""
        if note:
            print(f"lcfed: note: {note}", file=sys.stderr, flush=True)
        observers.append(tracker)
    return observers, tracker


def resume_line(cfg: ExperimentConfig, resume: Any, ckpt: Path, tracked: bool) -> str:
    """What ``--resume`` continues, in one line: the MLflow run and the round (from 0, as MLflow's steps), e.g.
    ``lcfed: resuming MLflow run 3f2a... at round 2 of rounds 0-4 (checkpoint runs/x/checkpoint.pt)``."""
    if resume is None:
        return f"lcfed: no checkpoint in {ckpt.parent} yet; starting at round 0 of rounds 0-{cfg.train.rounds - 1}"
    run_id = resume.tracking.get("run_id")
    what = (f"MLflow run {run_id}" if run_id and tracked else
            "an untracked run (a new MLflow run logs it)" if tracked else "the run")
    if resume.next_round >= cfg.train.rounds:
        return f"lcfed: {what} finished all {cfg.train.rounds} rounds (checkpoint {ckpt}); nothing to resume"
    return (f"lcfed: resuming {what} at round {resume.next_round} of rounds 0-{cfg.train.rounds - 1} "
            f"(checkpoint {ckpt})")


def attach_to_head(cfg: ExperimentConfig, private: bool) -> ExperimentConfig:
    """With ``engine.kind: ray`` and no address (nor ``$RAY_ADDRESS``), the head ``lcfed head start`` left
    running on this machine, said in one line: attaching skips the private Ray's start and stop (seconds a
    run). ``private`` (``--private-ray``), an address, or no such head: ``cfg`` as it is."""
    if cfg.engine.kind != "ray" or private or cfg.engine.address or os.environ.get("RAY_ADDRESS", "").strip():
        return cfg
    from tune_jobs import head  # psutil and the head's state only for a Ray run

    state = head.running()
    if state is None:
        return cfg
    if logs.progress_shown():
        print(f"lcfed: attaching to the Ray head `lcfed head start` left running (GCS {state['gcs']}); "
              "--private-ray starts a Ray of this run's own", file=sys.stderr, flush=True)
    return cfg.replace(**{"engine.address": str(state["gcs"])})


def cmd_run(args: argparse.Namespace) -> int:
    overrides = list(args.set) + ([f"engine.kind={args.engine}"] if args.engine else [])
    cfg = attach_to_head(load_config(args.config, overrides), args.private_ray)
    check_run(cfg, use_cluster(args.cluster))  # an ask no node type holds: one line, before anything starts
    numerics.activate(cfg.engine.numerics)  # before this process's first tensor op
    check_output_file(args.json, "--json", protect=[args.config])
    check_output_dir(cfg.checkpoint.dir, "checkpoint.dir")
    if cfg.tracking.enabled and not args.no_track:
        check_tracking_store(cfg.tracking.uri)
    if cfg.engine.kind == "local" and cfg.engine.device == "cuda":
        import torch

        require(torch.cuda.is_available(), "engine.device", "cuda",
                "no CUDA GPU is visible to this process: use auto or cpu (or run on a GPU machine)")
    from lcfed.data import format_stats
    from lcfed.run.loop import checkpoint_path, load_resume
    from lcfed.tracking.resume import check_resume_store

    stats = checked_partition_stats(cfg)  # fail on missing data or misfit sizes before anything starts
    if logs.progress_shown():
        print(f"partition: {partition_label(cfg)}: {format_stats(stats)}", flush=True)
    ckpt = checkpoint_path(cfg)
    resume = None
    if args.resume:
        if ckpt is None:
            raise ConfigError("--resume", True, "needs checkpoint.dir (e.g. --set checkpoint.dir=outputs/runs/exp1)")
        resume = load_resume(cfg)
        if resume is not None and cfg.tracking.enabled and not args.no_track:
            check_resume_store(resume.tracking, cfg.tracking.uri, str(ckpt))
        if logs.progress_shown():
            print(resume_line(cfg, resume, ckpt, tracked=cfg.tracking.enabled and not args.no_track),
                  file=sys.stderr, flush=True)
    elif ckpt is not None and ckpt.exists():
        raise ConfigError("checkpoint.dir", str(ckpt.parent), "already holds a checkpoint: pass --resume, or use a new dir")
    observers, tracker = _observers(cfg, args, resume)
    with stop_on_signals():
        result = engines.run(cfg, observers, resume)  # Ray only for its engine: `lcfed run` in-process never loads it
    averaged = last_evals(result.history, cfg.tracking.summary_evals)
    summary = _run_summary(cfg, result, stats, averaged)
    print(f"\n{cfg.name}: {cfg.method.name} on {cfg.data.dataset} ({cfg.data.partition}), "
          f"{cfg.data.num_devices} devices, {cfg.train.rounds} rounds, engine {cfg.engine.kind}")
    print(summary_table(result.final, averaged))
    if "final_eval" in summary:
        print(f"  {'evaluated':<14} {final_eval_line(summary['final_eval'], result.final)}")
    print(f"  {'s/round':<14} {result.round_seconds:>10.3f}   (wall {result.wall_seconds:.1f} s)")
    print(f"  numerics       {provenance_line(result.provenance)}")
    if result.placement:
        print(f"  placement      {placement_line(result.placement)}")
    if tracker is not None:
        loc = tracker.location()
        print(f"MLflow run {loc['run_id']} in experiment {cfg.tracking.experiment!r} (id {loc['experiment_id']})")
        print(f"  store: {loc['tracking_uri']}")
        print(f"  UI:    {ui_hint(loc['tracking_uri'], loc['experiment_id'], loc['run_id'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if "unlogged_metrics" in result.tracking:
        print(f"lcfed: the MLflow store was unreachable at the end: metrics not logged are in "
              f"{result.tracking['unlogged_metrics']}; send them with `lcfed tracking replay "
              f"{result.tracking['unlogged_metrics']}` once it is back", file=sys.stderr)
        return 1
    return 0


def _run_summary(cfg: ExperimentConfig, result: Any, stats: dict[str, float], averaged: dict[str, Any]) -> dict[str, Any]:
    """What ``lcfed run --json`` writes: the run's settings, its last evaluation, the mean of the last ones,
    the partition, the numerics and where it was tracked."""
    final_round = int(result.final["round"]) if "round" in result.final else None
    return {
        "name": cfg.name,
        "seed": cfg.seed,
        "method": cfg.method.name,
        "engine": cfg.engine.kind,
        "rounds": cfg.train.rounds,
        "seconds_per_round": result.round_seconds,
        "wall_seconds": result.wall_seconds,
        "reports": f"the metrics at the top level are the last evaluation's (round {final_round}); last_evals "
                   f"holds their mean over the last {averaged['evaluations']} evaluations (rounds from 0, as "
                   "MLflow's steps)",
        "last_eval_round": final_round,
        **({"final_eval": final_eval(result)} if result.trained is not None else {}),
        **{k: v for k, v in result.final.items() if k != "round"},
        **({"sim_seconds_to_target": next((row["sim_seconds_to_target"] for row in result.history
                                           if "sim_seconds_to_target" in row), None)}
           if cfg.devices.target_acc else {}),
        "last_evals": averaged,
        "partition": stats,
        "provenance": result.provenance,
        **result.tracking,
        **({"placement": result.placement} if result.placement else {}),
    }



def last_evals(history: Sequence[dict[str, float]], n: int) -> dict[str, Any]:
    """The mean of each summary metric over the last ``n`` evaluated rounds (fewer if the run made
    fewer), with how many were averaged and their rounds (from 0, as MLflow's steps). A single evaluation moves
    with the smallest devices' test sets; the papers' tables average the last few (reproduce: 3)."""
    evals = [row for row in history if "acc_mean" in row][-n:]
    out: dict[str, Any] = {"evaluations": len(evals), "rounds": [int(row["round"]) for row in evals]}
    for key in SUMMARY_AVERAGED:
        if evals and all(key in row for row in evals):
            out[key] = float(sum(row[key] for row in evals) / len(evals))
    return out


def final_eval(result: Any) -> dict[str, Any]:
    """Which devices the last evaluation scored: ``devices`` of the ``trained`` ones (those the accuracy
    metrics count), and whether that was a seeded sample (``train.eval_devices`` before the last round,
    ``train.final_eval_devices`` in it)."""
    trained = int(np.count_nonzero(result.trained))
    scored = sum(1 for d in result.evaluation if result.trained[d])
    return {"devices": scored, "trained": trained, "sampled": scored < trained}


def final_eval_line(info: dict[str, Any], final: dict[str, float]) -> str:
    """The summary's line on :func:`final_eval`: every trained device, or a sample with ``acc_mean``'s 95 %
    interval."""
    if not info["sampled"]:
        return f"every trained device ({info['trained']:,})"
    ci = final.get("acc_mean_ci95", float("nan"))
    return (f"a seeded sample of {info['devices']:,} of the {info['trained']:,} trained devices: "
            f"acc_mean {final.get('acc_mean', float('nan')):.4f} ± {ci:.4f} (95 %); train.final_eval_devices=0 "
            "scores every one")


def summary_table(final: dict[str, float], averaged: dict[str, Any]) -> str:
    """Two columns: the last evaluation and the mean of the last N, each headed by its rounds."""
    k = averaged["evaluations"]
    last = f"round {int(final['round'])}" if "round" in final else "no evaluation"
    rounds = ", ".join(map(str, averaged["rounds"]))
    lines = [f"  {'':<17} {'last eval':>10}   mean of last {k} eval{'s' if k != 1 else ''}",
             f"  {'':<17} {'(' + last + ')':>10}   (round{'s' if k != 1 else ''} {rounds})"]
    for key in SUMMARY:
        if key in final:
            mean = f"{averaged[key]:.4f}" if key in averaged else "—"
            lines.append(f"  {key:<17} {final[key]:>10.4f}   {mean}")
    return "\n".join(lines)


def provenance_line(p: dict[str, str]) -> str:
    """E.g. ``portable: AVX2 kernels (MKL 2024.2, oneDNN 3.12.0), torch 2.14.1, 1 thread, AMD EPYC, fingerprint
    58f37ce63875``."""
    if not p:
        return "not recorded"
    threads = p.get("threads", "?")
    line = (f"{p.get('numerics', '?')}: {p.get('kernels', '?')} kernels ({p.get('blas', '?')}, {p.get('onednn', '?')}), "
            f"torch {p.get('torch', '?')}, {threads} thread{'s' if threads != '1' else ''}, {p.get('cpu', '?')}")
    if p.get("fingerprint"):
        line += f", fingerprint {p['fingerprint']}"
    if p.get("gpu"):
        line += f", {p['gpu']} (CUDA {p.get('cuda', '?')})"
    return line


def partition_label(cfg: ExperimentConfig) -> str:
    """E.g. ``mnist dirichlet alpha=0.1 (niid_bench), min_samples 10, test_fraction 0.2, min_test_samples 20``."""
    d = cfg.data
    scheme = {"dirichlet": f"dirichlet alpha={d.alpha:g} ({d.dirichlet_convention}), min_samples {d.min_samples}",
              "pathological": f"pathological {d.classes_per_device} classes per device"}.get(d.partition, d.partition)
    qty = f", {d.samples_per_device[0]}-{d.samples_per_device[1]} samples per device" if d.samples_per_device else ""
    floor = f", min_test_samples {d.min_test_samples}" if d.min_test_samples else ""
    source = f"file {d.path}" if d.dataset == "file" else d.dataset
    if d.partition == "natural":
        scheme = f"natural ({d.user_selection} users with >= {d.min_samples} samples)"
    testbed = f" in {d.testbed_groups} {d.testbed} groups" if d.testbed != "none" else ""
    return f"{source} {scheme}{testbed}{qty}, test_fraction {d.test_fraction:g}{floor}, seed {cfg.seed}"


def checked_partition_stats(cfg: ExperimentConfig) -> dict[str, float]:
    """The config's partition statistics, after checking the config against its dataset (a missing
    dataset or sizes that do not fit are errors here)."""
    from lcfed.data import partition_stats
    from lcfed.run.sources import check_against_data, load

    ds = load(cfg)
    return partition_stats(check_against_data(cfg, ds), ds.y)


def placement_line(placement: dict[str, Any]) -> str:
    """E.g. ``4 device actors {CPU 0.5, GPU 0.5} on 2 node(s) [3f2a1b: 2, 9c0d4e: 2]; server on 77ab12; samples
    read on the nodes`` (``engine.data_reads``; or ``sent by the driver``, or each for some actors)."""
    actors = placement["device_actors"]
    per_node: dict[str, int] = {}
    for a in actors:
        per_node[a["node_id"][:6]] = per_node.get(a["node_id"][:6], 0) + 1
    ask = f"CPU {actors[0]['cpus']:g}" + (f", GPU {actors[0]['gpus']:g}" if actors[0]["gpus"] else "")
    nodes = ", ".join(f"{n}: {c}" for n, c in per_node.items())
    on_nodes = sum(a.get("samples") == "node" for a in actors)
    reads = {"nodes": "; samples read on the nodes", "driver": "; samples sent by the driver",
             "mixed": f"; samples read on the nodes by {on_nodes} actor(s), sent by the driver to "
                      f"{len(actors) - on_nodes}"}.get(placement.get("data_reads", ""), "")
    return (f"{len(actors)} device actors {{{ask}}} on {len(per_node)} node(s) [{nodes}]; "
            f"server on {placement['server']['node_id'][:6]}{reads}")


