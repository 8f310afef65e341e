"""The ``lcfed`` command: the parser (one-line usage errors), the dispatch to each command with its exit
code, and the small commands (``lcfed config``, ``lcfed table``, ``lcfed tracking replay``).

Each other command registers itself with an ``add_parser(sub)``: ``lcfed run`` in
:mod:`tune_jobs.run_command`, ``lcfed methods/check/models/datasets`` in :mod:`tune_jobs.catalog`, ``lcfed data``
in :mod:`tune_jobs.data_command`, the sweep, reproduce, compare, mlflow-server, job and head commands in theirs.
:data:`COMMANDS` names each command's module and one-line help, so ``lcfed`` imports only the module of the
command it runs: ``lcfed --version`` and ``lcfed --help`` import neither torch nor Ray nor MLflow.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

from actors.connect import ClusterError
from lcfed import logs
from lcfed.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DivergenceError,
    SweepFailed,
    TrackingError,
    did_you_mean,
)
from lcfed.run.faults import ClusterLost
from lcfed.run.stop import Stopped
from tune_jobs.options import add_actions, config_options, examples, resume_command, verbosity_of

EXIT_USAGE = 2
#: the Ray cluster under a run was lost (its raylet or GCS died): the run can go on with --resume
EXIT_CLUSTER_LOST = 3
#: what ``lcfed --version`` reports: lcfed and the packages that run and track it
VERSIONED = ("lcfed", "torch", "ray", "mlflow")
#: columns a command's description is filled to (argparse wraps the options to the terminal)
HELP_WIDTH = 79


class LcfedParser(argparse.ArgumentParser):
    """argparse with the project's error form: one line naming the subcommand and the flag, exit 2,
    instead of a usage dump (``lcfed: usage error: run: --engine: invalid choice 'x' (choose from local,
    ray) (see lcfed run --help)``). Subparsers are of the parser's class, so every subcommand has it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # the raw formatter prints the examples (epilog) as written; descriptions are filled here instead
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        if kwargs.get("description"):
            kwargs["description"] = textwrap.fill(kwargs["description"], HELP_WIDTH)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"lcfed: usage error: {where}{message.removeprefix('argument ')} "
                              f"(see {self.prog} --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[Any, list[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # refused by the subcommand that got them: argparse would report them from the top parser
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's check, on one line with the choices unquoted and the nearest one suggested (`lcfed rn`)
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            raise argparse.ArgumentError(action, f"invalid choice {value!r} (choose from {', '.join(choices)})"
                                                 f"{did_you_mean(value, choices)}")


class _Versions(argparse.Action):
    """``--version``: print :func:`versions` and exit."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(versions())
        parser.exit()


def versions() -> str:
    """E.g. ``lcfed 0.1.0 (torch 2.14.1, ray 2.60.0, mlflow 3.17.2)``, from the installed packages'
    metadata: no torch or Ray import."""
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"{found[0]} ({', '.join(found[1:])})"


#: every command, in ``lcfed --help``'s order: its name, the ``module:function`` that registers its parser (one
#: function may register several commands) and its one-line help (a test holds each equal to its parser's)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("run", "tune_jobs.run_command:add_parser", "run one federation and log it to MLflow"),
    ("config", "tune_jobs.cli:_add_config", "print the resolved, validated config as YAML"),
    ("methods", "tune_jobs.catalog:add_parser", "list the registered methods and their parameters"),
    ("check", "tune_jobs.catalog:add_parser",
     "check that a method keeps the Strategy contract (seeded, pure, priced, resumable, Ray = local)"),
    ("models", "tune_jobs.catalog:add_parser",
     "list the models: built-in, installed plugins (entry points lcfed.models) and where each comes from"),
    ("datasets", "tune_jobs.catalog:add_parser",
     "list the datasets: built-in, installed plugins (entry points lcfed.datasets) and where each comes from"),
    ("data", "tune_jobs.data_command:add_parser", "dataset utilities"),
    ("tracking", "tune_jobs.cli:_add_tracking", "tracking utilities"),
    ("table", "tune_jobs.cli:_add_table", "compare finished runs: one row per `lcfed run --json` summary"),
    ("sweep", "tune_jobs.sweep.command:add_parser", "Ray Tune sweep over config fields; each trial a full federation"),
    ("reproduce", "tune_jobs.reproduce:add_parser", "reproduce a paper table (every cell on one budget, on Ray)"),
    ("compare", "tune_jobs.compare:add_parser",
     "tune methods on one budget (validation), re-run them on seeds, report mean ± CI and paired tests"),
    ("mlflow-server", "tune_jobs.mlflow_server:add_parser",
     "run an MLflow tracking server (127.0.0.1 by default) for runs, sweeps and cluster jobs"),
    ("submit", "tune_jobs.jobs.command:add_parser",
     "run an lcfed command on a Ray cluster as a Ray job (ships this directory)"),
    ("job", "tune_jobs.jobs.command:add_parser", "inspect and control Ray jobs (status, logs, stop, list)"),
    ("head", "tune_jobs.head:add_parser", "a local Ray head on 127.0.0.1: start, stop, status"),
    ("numerics", "tune_jobs.numerics_command:add_parser",
     "print this machine's kernel fingerprint and compare it with the shipped references"),
)


def _registrar(path: str) -> Callable[[Any], None]:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def command_of(argv: Sequence[str]) -> str | None:
    """The command an ``lcfed`` command line names (its first word that is not a flag: the top-level
    parser's flags take no value), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The ``lcfed`` parser. Every command's parser, or with ``lazy`` only ``command``'s (with the others
    named by their help line alone, so ``--help``, a typo's suggestion and the usage stay the same): the
    modules of commands that do not run are not imported."""
    parser = LcfedParser(
        prog="lcfed",
        description="Clustered personalized federated learning experiments (LCFed and its baselines) "
        "in-process or on Ray, tracked in MLflow. `lcfed COMMAND --help` describes a command.",
        epilog=examples("lcfed run --config configs/demo.yaml",
                        "lcfed config --config configs/demo.yaml --set method.mu=0.5   # the resolved config",
                        "lcfed methods"),
    )
    parser.add_argument("--version", action=_Versions, help="print the versions of lcfed, torch, Ray and MLflow")
    sub = add_actions(parser, "command", "COMMAND")
    wanted = {path for name, path, _ in COMMANDS if not lazy or name == command}
    done: set[str] = set()
    for name, path, help_line in COMMANDS:
        if path in done:
            continue
        if path in wanted:
            _registrar(path)(sub)
            done.add(path)
        else:  # named only: never parsed, since the command line names another command
            sub.add_parser(name, help=help_line)
    return parser


def _add_config(sub: Any) -> None:
    """lcfed config: the resolved config."""
    show = sub.add_parser(
        "config", help="print the resolved, validated config as YAML",
        description="Print the config a run with the same --config and --set would use: the file's fields, "
        "the overrides and every default, validated (a bad value is an error here, as in `lcfed run`).",
        epilog=examples("lcfed config",
                        "lcfed config --config configs/demo.yaml --set data.alpha=0.1 > my.yaml"))
    config_options(show)
    show.set_defaults(func=cmd_config)


def _add_tracking(sub: Any) -> None:
    """lcfed tracking replay."""
    tracking = sub.add_parser("tracking", help="tracking utilities",
                              description="Tracking utilities: send metrics a run kept while MLflow was unreachable.",
                              epilog=examples("lcfed tracking replay unlogged-metrics-3f2a1b9c.json"))
    tracking_sub = add_actions(tracking, "tracking_command")
    rep = tracking_sub.add_parser(
        "replay", help="send the metrics a run saved while its MLflow store was unreachable",
        description="Send the metric points a run saved to unlogged-metrics-<run id>.json while its MLflow "
        "store was unreachable to that run (the file names the store), and finish the run.",
        epilog=examples("lcfed tracking replay unlogged-metrics-3f2a1b9c.json"))
    rep.add_argument("file", metavar="FILE", help="an unlogged-metrics-<run id>.json file")
    rep.set_defaults(func=cmd_tracking_replay)


def _add_table(sub: Any) -> None:
    """lcfed table: finished runs side by side."""
    table = sub.add_parser(
        "table", help="compare finished runs: one row per `lcfed run --json` summary",
        description="Compare finished runs side by side, best first: one row per summary written by "
        "`lcfed run --json FILE` (mean accuracy of the last evaluations, last evaluation, time).",
        epilog=examples("lcfed run -c configs/demo.yaml --json a.json",
                        "lcfed run -c configs/demo.yaml --set method.name=fedavg --json b.json",
                        "lcfed table a.json b.json"))
    table.add_argument("files", nargs="+", metavar="FILE", help="summaries written by `lcfed run --json FILE`")
    table.set_defaults(func=cmd_table)


def cmd_table(args: argparse.Namespace) -> int:
    """Methods side by side: the mean of the last evaluations (the number to compare), the last one,
    the sample-weighted mean and the time, best first."""
    from lcfed.numerics import provenance

    rows, records = [], []
    for name in args.files:
        try:
            summary = json.loads(Path(name).read_text())
            averaged = summary["last_evals"]
            records.append(summary.get("provenance") if isinstance(summary.get("provenance"), dict) else {})
            rows.append((summary.get("method", "?"), summary.get("seed", "?"), summary["rounds"], averaged["acc_mean"],
                         averaged.get("acc_weighted", float("nan")), summary.get("acc_mean", float("nan")),
                         summary.get("seconds_per_round", float("nan")), averaged.get("rounds", [])))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError("FILE", name, f"a summary written by `lcfed run --json` ({type(exc).__name__}: {exc})") from None
    groups = provenance.fingerprint_groups(records, list(args.files))
    if groups:  # before the numbers: equal configs on these runs' machines need not give equal numbers
        print(f"warning: these runs come from machines whose kernels differ (kernel fingerprints {groups}); "
              "their numbers differ in the last bits for the same config and seed (lcfed numerics)")
    rows.sort(key=lambda r: -r[3])
    k = max(len(r[7]) for r in rows)
    print(f"{'method':<12} {'seed':>4} {'rounds':>6}  {f'acc_mean (last {k})':>18} {'acc_weighted':>12} "
          f"{'last eval':>9} {'s/round':>8}")
    for method, seed, rounds, acc, weighted, last, spr, _ in rows:
        print(f"{method:<12} {seed!s:>4} {rounds:>6}  {acc:>18.4f} {weighted:>12.4f} {last:>9.4f} {spr:>8.2f}")
    differ = provenance.differences(records)
    if differ:
        print("note: these runs were produced under different numerics, so equal configs need not give equal "
              "numbers: " + "; ".join(differ))
    return 0


def cmd_tracking_replay(args: argparse.Namespace) -> int:
    from lcfed.tracking import replay

    run_id, count = replay(args.file)
    print(f"sent {count} metric points to run {run_id}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from lcfed.config import load_config, to_dict
    from lcfed.run.output_paths import check_output_dir

    cfg = load_config(args.config, args.set)
    check_output_dir(cfg.checkpoint.dir, "checkpoint.dir")
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(words), lazy=True)
    args = parser.parse_args(words)
    args.resume_command = resume_command(words)
    with logs.verbosity_scope(verbosity_of(args)):  # before the command loads MLflow or Ray
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    """The command's exit code; the errors users make or meet as one line (docs/run.md)."""
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"lcfed: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DataError as exc:
        print(f"lcfed: data error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as exc:
        print(f"lcfed: checkpoint error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TrackingError as exc:
        print(f"lcfed: tracking error: {exc}", file=sys.stderr)
        return 1
    except ClusterError as exc:
        print(f"lcfed: cluster error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterLost as exc:
        print(f"lcfed: run failed: {exc.describe(args.resume_command)}", file=sys.stderr)
        return EXIT_CLUSTER_LOST
    except (DivergenceError, SweepFailed) as exc:
        print(f"lcfed: run failed: {exc}", file=sys.stderr)
        return 1
    except Stopped as exc:
        print(f"lcfed: {exc}", file=sys.stderr)
        return 128 + int(getattr(signal, exc.reason, signal.SIGINT))
    except KeyboardInterrupt as exc:
        print(f"lcfed: interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
    except Exception as exc:
        if not type(exc).__module__.startswith("ray."):
            raise
        # Ray lost a process or node the run needs (e.g. its raylet died): one line, not Ray's traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"lcfed: run failed: Ray lost a process or node this command needs ({type(exc).__name__}: {first})",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
