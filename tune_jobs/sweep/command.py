"""``lcfed sweep``: its options and the command.

Ray-free at import: ``lcfed`` builds every subcommand's parser, whatever command runs; the sweep itself
(Tune, MLflow) is imported when ``lcfed sweep`` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lcfed.config import NAME_RULE, load_config, parse_override, require, safe_name
from lcfed.metric_catalog import objectives
from lcfed.output_paths import check_output_dir, check_output_file
from lcfed.tracking import check_registry, check_tracking_store, ui_hint
from tune_jobs.options import config_options, examples, verbosity_options
from tune_jobs.sweep.objective import METRIC, SCHEDULERS, SEARCHES, check_finishes, resolve_objective
from tune_jobs.sweep.placement import trial_engines
from tune_jobs.sweep.storage import DEFAULT_KEEP_CHECKPOINTS, DEFAULT_STORAGE, check_keep


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="Ray Tune sweep over config fields; each trial a full federation",
        description="A Ray Tune sweep over the config fields a search space (--space) names: each trial is "
        "a full federation on the base config, reported every round; all trials go under one MLflow "
        "parent run. Prints the best config and its metric.",
        epilog=examples(
            "lcfed sweep --config configs/digits_dirichlet.yaml --space mu_lambda.yaml --num-samples 16",
            "lcfed sweep --space mu_lambda.yaml --search optuna --num-samples 20 --metric val_acc_mean "
            "--set data.val_fraction=0.2",
            "lcfed sweep --space mu_lambda.yaml --name my-sweep --resume   # continue an interrupted sweep",
            "lcfed sweep --space mu_lambda.yaml --keep-checkpoints 1 --register lcfed-digits"))
    config_options(p, "base experiment config", "override a base field")
    p.add_argument("--space", required=True, metavar="FILE",
                   help="search space YAML (a path, or a bundled name under tune_jobs/spaces/, e.g. mu_lambda.yaml)")
    p.add_argument("--search", choices=list(SEARCHES), default="random",
                   help="random (default): Tune's random samples, grid([...]) fields expanded; grid: every swept "
                   "field enumerated (grid or choice); optuna / hyperopt: Tune's OptunaSearch / HyperOptSearch, "
                   "seeded by the config's seed (pip install 'lcfed[search]')")
    p.add_argument("--num-samples", type=int, default=1,
                   help="trials (optuna, hyperopt), or samples per grid point (random, grid) (default %(default)s)")
    p.add_argument("--metric", default=METRIC,
                   help=f"the per-round metric to optimise (default %(default)s); one of: {', '.join(objectives())}")
    p.add_argument("--mode", choices=["max", "min"],
                   help="max or min (default: the metric's direction: max for acc_*, label_homogeneity, ari, "
                   "coverage; min for *_loss, acc_std, bytes and seconds)")
    p.add_argument("--scheduler", choices=list(SCHEDULERS), default="asha",
                   help="asha (default): Tune's ASHAScheduler stops trials behind at a rung; hyperband: "
                   "HyperBandScheduler (pauses and stops trials in brackets); fifo: every trial runs all rounds")
    p.add_argument("--grace-period", type=int, metavar="N",
                   help="rounds a trial runs before asha/hyperband may stop it (default max(1, max_t // 2))")
    p.add_argument("--max-t", type=int, metavar="N",
                   help="rounds a trial runs at most under asha/hyperband (default train.rounds)")
    p.add_argument("--max-concurrent", type=int, default=0, help="trials at once (0 = as resources allow)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial, shared by its device actors")
    p.add_argument("--trial-engine", choices=trial_engines(), default="auto",
                   help="local: each trial's federation in the trial's process (engine.torch_threads x engine.workers "
                   "CPUs, its GPU share); ray: device actors in the trial's placement group; auto (default): local on "
                   "a single-node Ray with --gpus-per-trial <= 1, else ray")
    p.add_argument("--name", help="sweep name (Tune experiment and MLflow parent run); default <config name>-sweep")
    p.add_argument("--storage", default=DEFAULT_STORAGE,
                   help="Tune storage: a path, or a URI every node reaches (s3://bucket/prefix, gs://..., file://...) "
                   "as a multi-node cluster needs (default %(default)s, under the working directory)")
    p.add_argument("--keep-checkpoints", type=int, default=DEFAULT_KEEP_CHECKPOINTS, metavar="N",
                   help="checkpoints each trial keeps in the storage, the latest (default %(default)s)")
    p.add_argument("--register", metavar="NAME",
                   help="register the best trial's model (its personalized models) as a new version of NAME in the "
                   "MLflow Model Registry, linked to its run (needs a database store or a server)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same --name")
    p.add_argument("--json", metavar="FILE", help="also write the summary (best config, metric, runs, storage) as JSON")
    verbosity_options(p, "no progress table: errors and the final summary only")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    base = load_config(args.config, args.set)
    require(args.name is None or safe_name(args.name), "--name", args.name, NAME_RULE)
    check_output_file(args.json, "--json", protect=[args.config, args.space])
    check_output_dir(args.storage, "--storage")
    check_tracking_store(base.tracking.uri)  # a sweep is always tracked
    require(args.num_samples >= 1, "--num-samples", args.num_samples, "must be >= 1")
    require(args.max_concurrent >= 0, "--max-concurrent", args.max_concurrent, "must be >= 0")
    require(args.gpus_per_trial >= 0, "--gpus-per-trial", args.gpus_per_trial, "must be >= 0")
    check_keep(args.keep_checkpoints)
    check_registry(args.register)
    obj = resolve_objective(base.train.rounds, args.metric, args.mode, args.scheduler, args.grace_period, args.max_t)
    check_finishes(obj, base.train.rounds, args.register)
    from tune_jobs.sweep.space import load_space  # Tune when a sweep runs, not with lcfed's parser

    space = load_space(args.space, base)
    from tune_jobs.sweep.run import run_sweep  # MLflow and matplotlib: once the flags and the space are sound

    summary = run_sweep(base, space, num_samples=args.num_samples, scheduler=args.scheduler,
                        max_concurrent=args.max_concurrent, gpus_per_trial=args.gpus_per_trial, name=args.name,
                        storage=args.storage, resume=args.resume, trial_engine=args.trial_engine,
                        metric=args.metric, mode=args.mode, grace_period=args.grace_period, max_t=args.max_t,
                        search=args.search, keep_checkpoints=args.keep_checkpoints, register=args.register,
                        named=dict(parse_override(o) for o in args.set))
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"MLflow parent run {summary['parent_run_id']}: {ui_hint(summary['tracking_uri'])}")
    print(f"the trials side by side (metric, swept values): {summary['view']}")
    if summary.get("registered"):
        reg = summary["registered"]
        print(f"registered {reg['uri']} (the best trial's {reg['model']} models, run {reg['run_id']})")
    if summary["errors"]:
        print(f"lcfed: {summary['errors']} of {summary['trials']} trials failed; first: {summary['first_error']}",
              file=sys.stderr)
        return 1
    return 0
