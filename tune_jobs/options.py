"""What every ``lcfed`` subcommand's parser shares: the base config options, the verbosity flags, the
examples epilog and sub-actions (``lcfed data import``).

The subcommand modules (``sweep``, ``reproduce``, ``compare``, ...) import these from here, not from
:mod:`tune_jobs.cli`, which imports them to build the whole parser.
"""

from __future__ import annotations

import argparse
import functools
import shlex
from collections.abc import Sequence
from typing import Any

from lcfed.logs import DEFAULT, QUIET, VERBOSE

#: ``--config`` / ``--set`` as ``lcfed run`` words them; a command on a base config words them its way
CONFIG_HELP = "YAML experiment config (default: built-in defaults)"
SET_HELP = "override a config field, e.g. --set method.mu=0.1 --set data.num_devices=100 (repeatable)"


def config_options(p: argparse.ArgumentParser, config_help: str = CONFIG_HELP, set_help: str = SET_HELP) -> None:
    """``--config/-c FILE`` and ``--set/-s KEY=VALUE`` (repeatable): the experiment config a command starts
    from (``args.config``, ``args.set``, as :func:`lcfed.config.load_config` takes them)."""
    p.add_argument("--config", "-c", metavar="FILE", help=config_help)
    p.add_argument("--set", "-s", metavar="KEY=VALUE", action="append", default=[], help=set_help)


def verbosity_options(p: argparse.ArgumentParser, quiet_help: str = "errors and the final summary only") -> None:
    """``-q/--quiet`` and ``-v/--verbose`` (one of them): how much a command that runs things prints
    (:func:`lcfed.logs.set_verbosity`, applied by ``lcfed`` before the command runs)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--quiet", "-q", action="store_true", help=quiet_help)
    group.add_argument("--verbose", "-v", action="store_true",
                       help="also what Ray, Tune and MLflow print (warnings, INFO lines, Tune's status)")


def verbosity_of(args: argparse.Namespace) -> int:
    """The :mod:`lcfed.logs` verbosity the parsed flags ask for (a command without them: the default)."""
    if getattr(args, "verbose", False):
        return VERBOSE
    return QUIET if getattr(args, "quiet", False) else DEFAULT


def examples(*commands: str) -> str:
    """A subcommand's ``epilog``: example command lines, printed as written."""
    return "examples:\n" + "\n".join(f"  {c}" for c in commands)


def add_actions(parser: argparse.ArgumentParser, dest: str, metavar: str = "ACTION") -> Any:
    """The sub-actions of a command (``lcfed data import``); the bare command prints its help and
    exits 0 instead of an error."""
    parser.set_defaults(func=functools.partial(_print_help, parser))
    return parser.add_subparsers(dest=dest, metavar=metavar)


def _print_help(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    parser.print_help()
    return 0


def resume_command(argv: Sequence[str]) -> str:
    """The command that continues this one from its checkpoint: ``lcfed ARGS --resume``."""
    return shlex.join(["lcfed", *argv, *([] if "--resume" in argv else ["--resume"])])
