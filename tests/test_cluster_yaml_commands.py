"""``cluster.yaml`` installs the project's Python, Ray and torch, and every ``lcfed`` / ``ray`` command in its
header parses as written. In-process, no cluster.

The versions are read from where the project pins them (``pyproject.toml``: ``requires-python``, the Python
mypy checks for, the dependency ranges; the ``Makefile``: the torch build ``make setup`` installs; the Ray this
suite runs), never restated here. The header's commands go through the parsers that would run them: ``lcfed``'s
own (``tune_jobs.cli.build_parser``, a ``submit``'s entrypoint too, with its ``--config``, ``--set`` and
``--space`` found) and Ray's click commands (``make_context`` parses without running). The ``aws`` lines are
AWS-only and are not run here.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

import click
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the project's checked Python)

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster.yaml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def makefile_pins() -> dict[str, str]:
    """``name -> version`` of every ``name==version`` the Makefile's ``pip install`` lines pin (torch's build)."""
    text = (ROOT / "Makefile").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    return {m[1]: m[2] for line in installs for m in re.finditer(r"\b([A-Za-z0-9_.-]+)==([0-9][^\s'\"]*)", line)}


def _requirement(name: str) -> Requirement:
    (req,) = [r for r in map(Requirement, PYPROJECT["project"]["dependencies"]) if r.name == name]
    return req


def _config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _images() -> list[str]:
    docker = _config()["docker"]
    return [docker["head_image"], docker["worker_image"]]


def test_the_images_python_is_the_one_the_project_is_checked_for():
    checked = PYPROJECT["tool"]["mypy"]["python_version"]  # e.g. "3.11"
    for image in _images():
        m = re.fullmatch(r"rayproject/ray:([0-9.]+)-py(\d)(\d+)(-gpu)?", image)
        assert m, image
        python = f"{m[2]}.{m[3]}"
        assert python == checked, (image, checked)
        assert Version(python) in _requirement_python(), (image, PYPROJECT["project"]["requires-python"])


def _requirement_python():
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_the_images_ray_is_the_projects():
    installed = importlib.metadata.version("ray")  # the Ray `make setup` installed: `ray up` / `lcfed submit` run it
    for image in _images():
        tag = image.split(":")[1].split("-")[0]
        assert tag == installed, (image, installed)
        assert Version(tag) in _requirement("ray").specifier, (image, str(_requirement("ray")))


def test_every_node_installs_the_makefiles_torch_build():
    pins = makefile_pins()
    assert {"torch", "torchvision"} <= pins.keys(), pins
    config = _config()
    for key in ("head_setup_commands", "worker_setup_commands"):
        (line,) = [c for c in config[key] if "torch==" in c]
        asked = dict(w.split("==", 1) for w in shlex.split(line) if "==" in w)
        assert asked == {k: pins[k] for k in ("torch", "torchvision")}, (key, asked, pins)
        for name, version in asked.items():  # and pyproject's ranges accept them
            assert Version(version) in _requirement(name).specifier, (name, version)


def header_commands() -> list[list[str]]:
    """The header comment's commands (a line ``#   cmd ...``, continued by a trailing backslash), split as a
    shell splits them, trailing comments dropped."""
    lines = []
    for line in CLUSTER_YAML.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    commands: list[list[str]] = []
    text = "\n".join(lines).replace("\\\n", " ")
    for line in text.splitlines():
        if re.match(r"\s{2,}(ray|lcfed|aws) ", line):
            commands.append(shlex.split(line, comments=True))
    return commands


def _parse_lcfed(words: list[str]) -> None:
    from lcfed.config import load_config
    from tune_jobs.cli import build_parser, command_of

    args = build_parser(command_of(words), lazy=True).parse_args(words)
    if words[0] == "submit":
        entry = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
        assert entry[0] == "lcfed", entry
        _parse_lcfed(entry[1:])
        return
    cfg = load_config(ROOT / args.config, args.set)  # the file is in the synced repository; --set parses
    assert cfg.name
    if words[0] == "sweep":  # a bundled space (tune_jobs/spaces/), as `lcfed sweep` looks it up
        assert (ROOT / args.space).is_file() or (ROOT / "tune_jobs" / "spaces" / args.space).is_file(), args.space


def test_every_header_command_is_a_real_command_with_real_flags():
    from ray.scripts.scripts import cli as ray_cli

    commands = header_commands()
    kinds = [c[0] for c in commands]
    assert kinds.count("lcfed") >= 2 and kinds.count("ray") >= 6, commands
    for words in commands:
        if words[0] == "lcfed":
            _parse_lcfed(words[1:])
        elif words[0] == "ray":
            command = ray_cli.commands[words[1]]
            command.make_context(f"ray {words[1]}", words[2:])  # click.UsageError on an unknown flag or argument


@pytest.mark.parametrize("words", [["ray", "up", "cluster.yaml", "--no-such-flag"], ["ray", "rsync-up"]])
def test_a_wrong_ray_command_would_be_caught(words):
    from ray.scripts.scripts import cli as ray_cli

    with pytest.raises(click.UsageError):
        ray_cli.commands[words[1]].make_context(f"ray {words[1]}", words[2:])


def test_a_wrong_lcfed_command_would_be_caught():
    with pytest.raises(SystemExit):
        _parse_lcfed(["sweep", "--config", "configs/demo.yaml", "--gpu-per-trial", "0.5"])
