"""What every ``lcfed`` subcommand's parser shares: the base config options, the examples epilog and
sub-actions (``lcfed data import``).

The subcommand modules (``sweep``, ``reproduce``, ``compare``, ...) import these from here, not from
:mod:`tune_jobs.cli`, which imports them to build the whole parser.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

#: ``--config`` / ``--set`` as ``lcfed run`` words them; a command on a base config words them its way
CONFIG_HELP = "YAML experiment config (default: built-in defaults)"
SET_HELP = "override a config field, e.g. --set method.mu=0.1 --set data.num_devices=100 (repeatable)"


def config_options(p: argparse.ArgumentParser, config_help: str = CONFIG_HELP, set_help: str = SET_HELP) -> None:
    """``--config/-c FILE`` and ``--set/-s KEY=VALUE`` (repeatable): the experiment config a command starts
    from (``args.config``, ``args.set``, as :func:`lcfed.config.load_config` takes them)."""
    p.add_argument("--config", "-c", metavar="FILE", help=config_help)
    p.add_argument("--set", "-s", metavar="KEY=VALUE", action="append", default=[], help=set_help)


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
