"""``lcfed sweep``: its parser and the command (its sweep options: :mod:`tune_jobs.sweep.options`).

Ray-free at import: ``lcfed`` builds every subcommand's parser, whatever command runs; the sweep itself
(Tune, MLflow) is imported when ``lcfed sweep`` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lcfed.config import load_config
from lcfed.config.overrides import parse_override
from lcfed.run.output_paths import check_output_file
from lcfed.tracking import check_tracking_store, ui_hint
from tune_jobs.feasible import check_sweep, cluster_option, use_cluster
from tune_jobs.options import config_options, examples, verbosity_options
from tune_jobs.sweep.options import add_no_track, add_sweep_options, sweep_options, tracking_of


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sweep", help="Ray Tune sweep over config fields; each trial a full federation",
        description="A Ray Tune sweep over the config fields a search space (--space) names: each trial is "
        "a full federation on the base config, reported every round; all trials go under one MLflow "
        "parent run (none with --no-track). Prints the best config and its metric.",
        epilog=examples(
            "lcfed sweep --config configs/digits_dirichlet.yaml --space mu_lambda.yaml --num-samples 16",
            "lcfed sweep --space mu_lambda.yaml --search optuna --num-samples 20 --metric val_acc_mean "
            "--set data.val_fraction=0.2",
            "lcfed sweep --space mu_lambda.yaml --name my-sweep --resume   # continue an interrupted sweep",
            "lcfed sweep --space mu_lambda.yaml --keep-checkpoints 1 --register lcfed-digits"))
    config_options(p, "base experiment config", "override a base field")
    p.add_argument("--space", required=True, metavar="FILE",
                   help="search space YAML (a path, or a bundled name under tune_jobs/spaces/, e.g. mu_lambda.yaml)")
    add_sweep_options(p)
    cluster_option(p)
    add_no_track(p)
    p.add_argument("--json", metavar="FILE", help="also write the summary (best config, metric, runs, storage) as JSON")
    verbosity_options(p, "no progress table: errors and the final summary only")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    base = tracking_of(load_config(args.config, args.set), args.no_track)
    check_output_file(args.json, "--json", protect=[args.config, args.space])
    if base.tracking.enabled:  # tracked unless --no-track or tracking.enabled=false
        check_tracking_store(base.tracking.uri)
    options = sweep_options(args)
    options.validate(base.train.rounds, base.tracking.enabled)  # bad flags fail here, before Tune, MLflow or matplotlib loads
    # a trial no node type holds would wait forever: one line now, before Ray, Tune or MLflow start
    check_sweep(base, options.gpus_per_trial, options.trial_engine, use_cluster(args.cluster))
    from tune_jobs.sweep.space import load_space  # Tune when a sweep runs, not with lcfed's parser

    space = load_space(args.space, base)
    from tune_jobs.sweep.search import check_search  # (Tune, as the space)

    check_search(options.search, space)  # a space the search cannot take fails before matplotlib loads
    from tune_jobs.sweep.run import run_sweep  # MLflow and matplotlib: once the flags and the space are sound

    summary = run_sweep(base, space, options, named=dict(parse_override(o) for o in args.set))
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if summary["parent_run_id"]:
        hint = ui_hint(summary["tracking_uri"], summary["experiment_id"], summary["parent_run_id"])
        print(f"MLflow parent run {summary['parent_run_id']}: {hint}")
        print(f"the trials side by side (metric, swept values): {summary['view']}")
        print(f"their charts (parallel coordinates, the metric against each swept value): {summary['view_charts']}")
    else:
        print(f"not tracked: the trials are in Tune's storage, {summary['storage']}")
    if summary.get("registered"):
        reg = summary["registered"]
        print(f"registered {reg['uri']} (the best trial's {reg['model']} models, run {reg['run_id']})")
    if summary["errors"]:
        print(f"lcfed: {summary['errors']} of {summary['trials']} trials failed; first: {summary['first_error']}",
              file=sys.stderr)
        return 1
    return 0
