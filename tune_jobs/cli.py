"""The ``lcfed`` command: run experiments, import datasets, show resolved configs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import signal
import sys
import textwrap
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

import yaml

from actors.connect import ClusterError
from lcfed import conformance, logs, numerics, registry
from lcfed.checkpoint import CheckpointError
from lcfed.config import ConfigError, did_you_mean, load_config, require, to_dict
from lcfed.data import DataError, format_groups, format_stats, import_idx, import_leaf, partition_stats
from lcfed.faults import ClusterLost
from lcfed.federation import check_against_data, load
from lcfed.loop import DivergenceError
from lcfed.output_paths import check_output_dir
from lcfed.stop import Stopped
from lcfed.tracking import TrackingError, replay
from tune_jobs import compare, head, jobs, mlflow_server, reproduce, run_command
from tune_jobs.options import add_actions, config_options, examples, verbosity_of
from tune_jobs.run_command import partition_label, resume_command
from tune_jobs.sweep import command as sweep
from tune_jobs.sweep.errors import SweepFailed

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


def build_parser() -> argparse.ArgumentParser:
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

    for add in (run_command.add_parser, _add_config, _add_methods, _add_check, _add_components, _add_data, _add_tracking,
                _add_table, sweep.add_parser, reproduce.add_parser, compare.add_parser, mlflow_server.add_parser,
                jobs.add_parser, head.add_parser):
        add(sub)
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


def _add_methods(sub: Any) -> None:
    """lcfed methods: the registered methods and their parameters."""
    methods = sub.add_parser(
        "methods", help="list the registered methods and their parameters",
        description="List the registered methods (the values of method.name), each with its description "
        "and its parameters (method.<param>) with their defaults.",
        epilog=examples("lcfed methods", "lcfed run --set method.name=ifca --set method.num_clusters=3"))
    methods.set_defaults(func=cmd_methods)


def _add_check(sub: Any) -> None:
    """lcfed check: a method's conformance to the Strategy contract."""
    check = sub.add_parser(
        "check", help="check that a method keeps the Strategy contract (seeded, pure, priced, resumable, Ray = local)",
        description="Run a method on a small federation and check the contract every built-in keeps: the same "
        "numbers for the same seed, no hook changing its arguments in place, every uploaded tensor priced, "
        "resuming from a checkpoint bit-identical, and (--ray) the Ray engine giving the in-process numbers. "
        "Exit 1 when a property fails; the report names it.",
        epilog=examples("lcfed check fedavg", "lcfed check mypackage.strategies:FedProx --ray",
                        "lcfed check lcfed fedac --rounds 6"))
    check.add_argument("methods", nargs="+", metavar="METHOD", help="a method name or a package.module:attr path")
    check.add_argument("--ray", action="store_true", help="also compare the Ray engine with the in-process one")
    check.add_argument("--rounds", type=int, default=2, help="rounds of the small federation (default: %(default)s)")
    check.set_defaults(func=cmd_check)


def _add_components(sub: Any) -> None:
    """lcfed models / lcfed datasets: the names each accepts."""
    for kind, what in (("model", "models"), ("dataset", "datasets")):
        listing = sub.add_parser(
            what, help=f"list the {what}: built-in, installed plugins (entry points lcfed.{what}) and where each comes from",
            description=f"List every {kind} name that {'model.name' if kind == 'model' else 'data.dataset'} accepts "
                        f"without a path: the built-in ones, then those installed packages register under the "
                        f"entry-point group lcfed.{what}. A package.module:attr path names any other.",
            epilog=examples(f"lcfed {what}", f"lcfed run --set {'model.name' if kind == 'model' else 'data.dataset'}"
                                             f"=mypackage.module:{'build' if kind == 'model' else 'load'}"))
        listing.set_defaults(func=cmd_components, kind=kind)


def _add_data(sub: Any) -> None:
    """lcfed data import / stats."""
    data = sub.add_parser("data", help="dataset utilities", description="Dataset utilities: place IDX files where "
                          "torchvision expects them, turn LEAF's JSON files into an .npz, or print the partition a "
                          "config makes.",
                          epilog=examples("lcfed data import --from /tmp/mnist-idx",
                                          "lcfed data stats --config configs/mnist_dirichlet.yaml"))
    data_sub = add_actions(data, "data_command")
    imp = data_sub.add_parser(
        "import",
        help="place MNIST / Fashion-MNIST IDX files found on this machine where torchvision expects them, "
             "or merge LEAF JSON files into an .npz (--leaf)",
        description="Place MNIST / Fashion-MNIST IDX files (.gz or not) found on this machine where "
        "torchvision reads them under --data-dir, after checking each file (magic number, size, labels). "
        "With --leaf: merge LEAF's JSON files (FEMNIST, Synthetic, ...) into --data-dir/NAME.npz with each "
        "sample's user as its device id, for data.dataset=file and data.partition=natural.",
        epilog=examples("lcfed data import --data-dir ~/.cache/lcfed --from /tmp/mnist-idx",
                        "lcfed run --set data.dataset=mnist --set data.data_dir=~/.cache/lcfed   # then",
                        "lcfed data import --leaf leaf/data/femnist/data/train --leaf leaf/data/femnist/data/test "
                        "--name femnist",
                        "lcfed run --set data.dataset=file --set data.path=femnist.npz --set data.partition=natural"),
    )
    imp.add_argument("--data-dir", default="~/.cache/lcfed", help="destination data directory (default: %(default)s)")
    imp.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        metavar="DIR",
        help="directory holding IDX files (.gz or not); repeatable. Default search: "
        "/usr/share/datasets/fashion-mnist and $LCFED_IDX_DIRS",
    )
    imp.add_argument("--leaf", action="append", default=[], metavar="PATH",
                     help="a LEAF JSON file or a directory of them (its *.json); repeatable: train and test files "
                          "are merged, the same user keeping one device id")
    imp.add_argument("--name", default="leaf", help="with --leaf: the .npz written under --data-dir is NAME.npz "
                                                     "(default: %(default)s)")
    imp.add_argument("--shape", default=None, metavar="C,H,W",
                     help="with --leaf: read each sample as an image of this shape, values in [0, 1] (default: 784 "
                          "values are FEMNIST's 1,28,28; other lengths stay feature vectors)")
    imp.set_defaults(func=cmd_data_import)
    stats = data_sub.add_parser(
        "stats", help="print the config's partition: train/test sizes and classes per device (what a run starts with)",
        description="Partition the config's dataset as a run would and print the devices' train/test sizes "
        "and classes per device, without training.",
        epilog=examples("lcfed data stats --config configs/mnist_dirichlet.yaml",
                        "lcfed data stats --set data.partition=pathological --set data.classes_per_device=2"),
    )
    config_options(stats)
    stats.set_defaults(func=cmd_data_stats)


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
    rows.sort(key=lambda r: -r[3])
    k = max(len(r[7]) for r in rows)
    print(f"{'method':<12} {'seed':>4} {'rounds':>6}  {f'acc_mean (last {k})':>18} {'acc_weighted':>12} "
          f"{'last eval':>9} {'s/round':>8}")
    for method, seed, rounds, acc, weighted, last, spr, _ in rows:
        print(f"{method:<12} {seed!s:>4} {rounds:>6}  {acc:>18.4f} {weighted:>12.4f} {last:>9.4f} {spr:>8.2f}")
    differ = numerics.differences(records)
    if differ:
        print("note: these runs were produced under different numerics, so equal configs need not give equal "
              "numbers: " + "; ".join(differ))
    return 0


def cmd_data_stats(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    ds = load(cfg)
    part = check_against_data(cfg, ds)
    print(f"{partition_label(cfg)}:\n  {format_stats(partition_stats(part, ds.y))}")
    if part.group_kind:  # a testbed's known clusters: each device's true group
        print(f"  {format_groups(part)}")
    return 0


def cmd_tracking_replay(args: argparse.Namespace) -> int:
    run_id, count = replay(args.file)
    print(f"sent {count} metric points to run {run_id}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    check_output_dir(cfg.checkpoint.dir, "checkpoint.dir")
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """Every method by name (built-in, then installed plugins, with where each comes from) and its
    parameters with their defaults."""
    for entry in registry.names("method"):
        try:
            spec = registry.method(entry.name)
        except registry.PluginError as exc:
            print(f"{entry.name:<12} ({entry.origin}) cannot be used: {exc}")
            continue
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(spec.params))
        print(f"{entry.name:<12} {_first_line(spec.strategy)}")
        if entry.origin != "built-in":
            print(f"{'':<12} from: {entry.origin}")
        if fields:
            print(f"{'':<12} params: {fields}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """The conformance report of each method; exit 1 when a property fails."""
    require(args.rounds >= 2, "--rounds", args.rounds, "must be >= 2 (resuming needs a round before the last)")
    configs = [conformance.small_config(name, **{"train.rounds": args.rounds}) for name in args.methods]
    failed = 0
    for name, cfg in zip(args.methods, configs, strict=True):
        findings = conformance.check(name, ray=args.ray, cfg=cfg,
                                     progress=lambda what, n=name: print(f"{n}: checking {what}", file=sys.stderr))
        print(conformance.report(name, findings), flush=True)
        failed += not all(f.ok for f in findings)
    return 1 if failed else 0


def cmd_components(args: argparse.Namespace) -> int:
    """``lcfed models`` / ``lcfed datasets``: every name, its first docstring line and where it comes from."""
    for entry in registry.names(args.kind):
        try:
            obj = getattr(registry, args.kind)(entry.name)
        except registry.PluginError as exc:
            print(f"{entry.name:<14} ({entry.origin}) cannot be used: {exc}")
            continue
        origin = "" if entry.origin == "built-in" else f"  [{entry.origin}]"
        print(f"{entry.name:<14} {_first_line(obj)}{origin}")
    return 0


def _first_line(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring (its module's for a class without one), as one line."""
    doc = obj.__doc__ if obj.__doc__ and not isinstance(obj, type) else sys.modules[obj.__module__].__doc__
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def cmd_data_import(args: argparse.Namespace) -> int:
    check_output_dir(args.data_dir, "--data-dir")
    if args.leaf:
        return _import_leaf(args)
    require(args.shape is None and args.name == "leaf", "--shape" if args.shape is not None else "--name",
            args.shape if args.shape is not None else args.name, "is read with --leaf only")
    placed = import_idx(Path(args.data_dir).expanduser(), args.sources)
    for name, dest in placed:
        print(f"{name}: {dest}")
    print(f"use with: --set data.data_dir={Path(args.data_dir).expanduser()}")
    return 0


def _import_leaf(args: argparse.Namespace) -> int:
    """``lcfed data import --leaf``: LEAF JSON files -> ``--data-dir/NAME.npz`` with device ids."""

    require(not args.sources, "--from", args.sources, "reads IDX files; give it or --leaf (LEAF JSON), not both")
    require(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", args.name) is not None, "--name", args.name,
            "must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (it names the .npz file)")
    shape = None
    if args.shape is not None:
        parts = args.shape.replace("x", ",").split(",")
        require(len(parts) == 3 and all(p.strip().isdigit() and int(p) > 0 for p in parts), "--shape", args.shape,
                "must be C,H,W: three positive integers, e.g. 1,28,28")
        shape = tuple(int(p) for p in parts)
    out = Path(args.data_dir).expanduser() / f"{args.name}.npz"
    done = import_leaf(args.leaf, out, shape)
    kind = "images of " + "x".join(map(str, done.shape)) if done.images else f"feature vectors of {done.shape[0]}"
    print(f"{args.name}: {done.users:,} users, {done.samples:,} samples ({kind}), labels 0-{done.num_classes - 1}: "
          f"{done.path}")
    print(f"use with: --set data.dataset=file --set data.path={done.path} --set data.partition=natural")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.resume_command = resume_command(sys.argv[1:] if argv is None else list(argv))
    with logs.verbosity_scope(verbosity_of(args)):  # before the command loads MLflow or Ray
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    """The command's exit code; the errors users make or meet as one line (section 1 of the README)."""
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
