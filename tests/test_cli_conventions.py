"""The CLI's conventions: a bare command prints its help, `--version`, every command's help has a
description and examples, and the texts that report what was computed say it as it was."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from tune_jobs.cli import build_parser, main
from tune_jobs.reproduce import Cell, write_tables


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser below ``parser`` (``lcfed run``, ``lcfed data``, ``lcfed data import``, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield child
                yield from _commands(child)


@pytest.mark.parametrize("argv", [[], ["data"], ["tracking"], ["reproduce"], ["job"]],
                         ids=["lcfed", "data", "tracking", "reproduce", "job"])
def test_a_bare_command_prints_its_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: {' '.join(['lcfed', *argv])} [-h]") and "examples:\n  lcfed" in out
    assert err == ""


def test_version_lists_lcfed_torch_ray_and_mlflow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out == f"lcfed {version('lcfed')} (torch {version('torch')}, ray {version('ray')}, " \
                  f"mlflow {version('mlflow')})\n"


def test_every_command_has_a_description_and_examples_of_itself() -> None:
    parser = build_parser()
    commands = list(_commands(parser))
    assert len(commands) >= 20  # 12 commands, 9 sub-actions
    for p in commands:
        assert p.description, p.prog
        assert p.epilog and p.epilog.startswith("examples:\n"), p.prog
        assert any(line == f"  {p.prog}" or line.startswith(f"  {p.prog} ") for line in p.epilog.splitlines()), p.prog
        text = p.format_help()
        assert p.epilog in text  # printed as written, not re-wrapped
        assert all(len(line) <= 80 for line in p.description.splitlines()), p.prog
        for line in p.epilog.splitlines()[1:]:  # every example parses (up to a comment or a redirection)
            parser.parse_args(shlex.split(line.partition(">")[0], comments=True)[1:])


def test_run_help_points_to_the_resolved_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    assert "  lcfed config --config configs/demo.yaml" in capsys.readouterr().out


def test_methods_prints_each_description_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    (dcpfl,) = [line for line in out.splitlines() if line.startswith("dcpfl ")]
    assert dcpfl.endswith("DC-PFL: dynamic clustering by model discrepancy, splits at the end of rapid-decrease "
                          "periods, layer-wise aggregation.")


def test_table1_says_how_many_evaluations_it_averaged(tmp_path: Path) -> None:
    cells = [Cell("digits", "dirichlet:0.5", m) for m in ("fedavg", "lcfed")]
    row = {"acc_mean": 0.8, "acc_std": 0.1, "acc_weighted": 0.8, "rounds": 2, "wall_seconds": 1.0}
    md, _ = write_tables(tmp_path, cells, {c.key: {**row, "evaluations": 2.0} for c in cells}, "t")
    assert "averaged over the last 2 evaluations;" in md
    md, _ = write_tables(tmp_path, cells, {c.key: {**row, "evaluations": 1.0} for c in cells}, "t")
    assert "averaged over the last evaluation;" in md
    runs = {cells[0].key: {**row, "evaluations": 2.0}, cells[1].key: {**row, "evaluations": 3.0}}
    md, _ = write_tables(tmp_path, cells, runs, "t")
    assert "averaged over the last 2-3 evaluations (as many as each run made, up to 3);" in md


def test_the_command_table_names_each_parser_with_its_help() -> None:
    """`COMMANDS` (what lets `lcfed` import only the command it runs) lists every command in the parser's order,
    each with its parser's own help line, so `lcfed --help` and a typo's suggestion read as with every parser
    built; a command's own parser is the real one whichever command line builds it."""
    from tune_jobs.cli import COMMANDS

    def subactions(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    full = build_parser()
    assert [(c.dest, c.help) for c in subactions(full)._choices_actions] == [(n, h) for n, _, h in COMMANDS]
    assert build_parser(lazy=True).format_help() == full.format_help()
    for name, _, _ in COMMANDS:
        own = subactions(build_parser(name, lazy=True)).choices[name]
        assert own.format_help() == subactions(full).choices[name].format_help(), name


@pytest.mark.subprocess
def test_version_and_help_import_neither_torch_nor_ray_nor_mlflow() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom tune_jobs.cli import main\nfor argv in (['--version'], ['--help'], []):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'numpy') if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr
