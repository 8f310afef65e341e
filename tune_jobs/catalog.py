"""What the names resolve to and whether a method keeps the contract: ``lcfed methods``, ``lcfed check``,
``lcfed models`` and ``lcfed datasets`` (built-ins, installed plugins and where each comes from)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from lcfed import conformance, registry
from lcfed.config.overrides import parse_override
from lcfed.errors import require
from tune_jobs.options import examples


def add_parser(sub: Any) -> None:
    """Register ``lcfed methods``, ``lcfed check``, ``lcfed models`` and ``lcfed datasets`` on the CLI's subparsers."""
    for add in (_add_methods, _add_check, _add_components):
        add(sub)


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
                        "lcfed check lcfed fedac --rounds 6", "lcfed check fedavg --set train.lr=0.01",
                        "lcfed check --cluster cluster.yaml --config configs/demo.yaml --gpus-per-trial 0.5"))
    check.add_argument("methods", nargs="*", metavar="METHOD", help="a method name or a package.module:attr path")
    check.add_argument("--cluster", metavar="FILE",
                       help="instead, print the plan of --config on this cluster launcher config: whether a trial "
                            "and a federation fit its node types, trials per node type and in flight at max_workers")
    check.add_argument("--config", "-c", metavar="FILE", help="with --cluster: the experiment config")
    check.add_argument("--gpus-per-trial", type=float, default=0.0, help="with --cluster: as lcfed sweep's")
    check.add_argument("--trial-engine", default="auto", help="with --cluster: as lcfed sweep's")
    check.add_argument("--ray", action="store_true", help="also compare the Ray engine with the in-process one")
    check.add_argument("--rounds", type=int, default=2,
                       help=f"rounds of the small federation, 2-{MAX_CHECK_ROUNDS} (default: %(default)s)")
    check.add_argument("--set", "-s", metavar="KEY=VALUE", action="append", default=[],
                       help="change the small federation's config, e.g. --set train.lr=0.01 --set method.mu=0.5 "
                            "(repeatable; applied to every METHOD)")
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


#: ``lcfed check --rounds``: the most rounds of its small federation. The check runs the method about four times
#: (twice straight, then stopped a round early and resumed; --ray once more) at 0.15-0.3 s a round of its 6
#: devices on one core, so 500 rounds take minutes, while a behaviour due at round N (lcfed's refit every 100
#: rounds, fedac's or dcpfl's schedules) shows with N + 1. Bounded rather than estimated: unbounded, a slip of the
#: keyboard would run for days with nothing printed between its "checking ..." lines (Ctrl-C stops it at once,
#: exit 130).
MAX_CHECK_ROUNDS = 500


def cmd_check(args: argparse.Namespace) -> int:
    """The conformance report of each method; exit 1 when a property fails. With ``--cluster``: the plan."""
    if args.cluster:
        from lcfed.config import load_config
        from tune_jobs.feasible import plan_lines, use_cluster

        cluster = use_cluster(args.cluster)
        assert cluster is not None  # (a path given: read, or ConfigError)
        print("\n".join(plan_lines(load_config(args.config, args.set), cluster, args.gpus_per_trial,
                                    args.trial_engine)))
        return 0
    require(bool(args.methods), "METHOD", "", "name a method to check (lcfed check fedavg), or give --cluster FILE")
    require(2 <= args.rounds <= MAX_CHECK_ROUNDS, "--rounds", args.rounds,
            f"must be in [2, {MAX_CHECK_ROUNDS}] (resuming needs a round before the last; the check runs the method "
            "about four times)")
    sets = dict(parse_override(text) for text in args.set)  # a malformed one: one line, exit 2
    # the report is named by METHOD: a --set of another method would check that one under this name
    require("method.name" not in sets, "--set method.name", sets.get("method.name"),
            "lcfed check takes the methods it checks from its METHOD arguments (lcfed check NAME ...); drop this --set")
    configs = [conformance.small_config(name, **{"train.rounds": args.rounds, **sets}) for name in args.methods]
    for name, cfg in zip(args.methods, configs, strict=True):  # (--set train.rounds=N bypasses --rounds' check)
        require(2 <= cfg.train.rounds <= MAX_CHECK_ROUNDS, "train.rounds", cfg.train.rounds,
                f"must be in [2, {MAX_CHECK_ROUNDS}] in lcfed check (as --rounds)")
        require(cfg.method.name == name, "--set method", cfg.method.name,  # a whole section: --set method={...}
                f"lcfed check checks {name} (its METHOD argument), not another method; drop this --set")
    failed = 0
    for name, cfg in zip(args.methods, configs, strict=True):
        def progress(what: str, n: str = name) -> None:  # (a def: mypy infers no lambda with a bound default)
            print(f"{n}: checking {what}", file=sys.stderr)

        findings = conformance.check(name, ray=args.ray, cfg=cfg, progress=progress)
        print(conformance.report(cfg.method.name, findings), flush=True)  # the method the runs resolved
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
    """The first paragraph of ``obj``'s docstring, whole, as one line: a class's own docstring (not one
    inherited from ``Strategy`` or another parent), else its module's; a function's own, else its module's."""
    own = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    module = sys.modules.get(getattr(obj, "__module__", ""), None)
    doc = own if isinstance(own, str) and own.strip() else getattr(module, "__doc__", None)
    return " ".join((doc or "").strip().split("\n\n")[0].split())
