"""The module paths from before lcfed's packages (``lcfed.loop``, ``lcfed.models``, ...) still import, with a
DeprecationWarning naming the new path, and give the new modules' objects; checkpoints and pickles that name a
class by its old module still load; nothing in the repository uses an old path."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import lcfed
from lcfed import _moved

ROOT = Path(__file__).resolve().parents[1]


def _forget(name: str) -> None:
    """Drop an old path's stand-in, so that the next import finds it again (and warns again)."""
    sys.modules.pop(name, None)
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        vars(sys.modules[parent]).pop(leaf, None)


@pytest.fixture
def fresh() -> Iterator[None]:
    for name in _moved.MOVED:
        _forget(name)
    yield
    for name in _moved.MOVED:
        _forget(name)


def test_every_old_path_names_modules_that_exist():
    for old, targets in _moved.MOVED.items():
        assert old.startswith("lcfed.") and old.count(".") == 1, old
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} has a file again"
        for target in targets:
            importlib.import_module(target)


def test_an_old_module_imports_with_a_warning_naming_the_new_path(fresh):
    from lcfed.run import loop

    with pytest.warns(DeprecationWarning, match=r"lcfed\.loop moved to lcfed\.run\.loop") as record:
        import lcfed.loop as old
    assert record[0].filename == __file__  # the warning points at the import, not at the import machinery
    assert old.run_rounds is loop.run_rounds and old.load_resume is loop.load_resume
    from lcfed.run.rounds import eval_sample  # split off the loop: still there under the old path

    assert old.eval_sample is eval_sample


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_from_import_of_each_old_path_gives_the_same_objects(fresh, old):
    targets = _moved.MOVED[old]
    new = importlib.import_module(targets[0])
    name = next(n for n in vars(new) if not n.startswith("_") and getattr(getattr(new, n), "__module__", "") == new.__name__)
    with pytest.warns(DeprecationWarning, match=old.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(new, name)


def test_from_lcfed_import_an_old_module(fresh):
    from lcfed.learning import models

    with pytest.warns(DeprecationWarning, match=r"lcfed\.models moved to lcfed\.learning\.models"):
        from lcfed import models as old  # type: ignore[attr-defined]
    assert old.build_network is models.build_network
    assert lcfed.models is old  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        lcfed.no_such_module  # type: ignore[attr-defined]  # noqa: B018


def test_names_split_across_modules_resolve_under_the_old_path(fresh):
    from lcfed.config.data import holdout_count
    from lcfed.config.engine import machine_limits
    from lcfed.run.shards import FileShard
    from lcfed.run.sources import load

    with pytest.warns(DeprecationWarning):
        from lcfed.config_rules import holdout_count as old_count  # type: ignore[import-not-found]
        from lcfed.config_rules import machine_limits as old_limits  # type: ignore[import-not-found]
        from lcfed.experiment import FileShard as OldShard  # type: ignore[import-not-found]
        from lcfed.experiment import load as old_load  # type: ignore[import-not-found]
    assert (old_count, old_limits, OldShard, old_load) == (holdout_count, machine_limits, FileShard, load)
    with pytest.raises(ImportError):
        from lcfed.experiment import no_such_name  # type: ignore[import-not-found]  # noqa: F401


def test_a_name_split_off_a_module_that_stayed_warns():
    from lcfed.devices import fleet, generators

    with pytest.warns(DeprecationWarning, match=r"lcfed\.devices\.fleet\.synthetic_fleet moved to lcfed\.devices\.generators"):
        old = fleet.synthetic_fleet  # type: ignore[attr-defined]
    assert old is generators.synthetic_fleet
    with pytest.raises(AttributeError):
        fleet.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_a_checkpoint_written_before_the_move_still_loads(tmp_path, monkeypatch):
    """A checkpoint names its state classes by module; one written before the packages names lcfed.similarity."""
    import torch

    from lcfed.learning.similarity import Projector
    from lcfed.run import checkpoint

    proj = Projector(torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.zeros(3))
    monkeypatch.setattr(Projector, "__module__", "lcfed.similarity")  # as the class was named then
    snap = checkpoint.Snapshot(next_round=3, server_state=proj, device_states={0: proj, 1: None}, config_digest="d")
    path = checkpoint.save(tmp_path / "latest.pt", snap)
    monkeypatch.undo()
    assert b"lcfed.similarity:Projector" in (tmp_path / "latest.pt").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the old name is the file's, not the caller's code
        back = checkpoint.load(path)
        state = back.device_states[0]
    assert type(back.server_state) is Projector and type(state) is Projector
    assert torch.equal(back.server_state.components, proj.components)
    assert _moved.current_module("lcfed.similarity", "Projector") == "lcfed.learning.similarity"
    assert _moved.current_module("lcfed.methods.lcfed", "LCFedState") == "lcfed.methods.lcfed"


def test_a_pickle_naming_an_old_module_loads(fresh, monkeypatch):
    """MLflow's logged models are pickles: one logged before the move names its classes by the old modules."""
    from lcfed.learning.models import ParamSpec

    spec = ParamSpec(names=("w",), shapes=((2,),), offsets=(0,), embedding_size=0)
    monkeypatch.setattr(ParamSpec, "__module__", "lcfed.models")
    with pytest.warns(DeprecationWarning):
        data = pickle.dumps(spec)
    monkeypatch.undo()
    assert b"lcfed.models" in data
    assert pickle.loads(data) == spec and type(pickle.loads(data)) is ParamSpec


@pytest.mark.subprocess
def test_the_repository_imports_no_old_path():
    """Importing every module of the three packages (as the command, the API and the engines do) warns nothing."""
    code = (
        "import importlib, pkgutil, warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import lcfed, actors, tune_jobs\n"
        "for pkg in (lcfed, actors, tune_jobs):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        with warnings.catch_warnings():\n"
        "            warnings.filterwarnings('ignore', category=DeprecationWarning, module='(?!lcfed|actors|tune_jobs)')\n"
        "            importlib.import_module(m.name)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)


def test_no_source_names_an_old_path():
    """The rewritten imports stay rewritten: no ``from lcfed.loop import`` (and the like) in the repository."""
    import re

    olds = "|".join(re.escape(o) for o in _moved.MOVED)
    pattern = re.compile(rf"(from|import) ({olds})\b(?!\.)")
    bad = []
    for folder in ("lcfed", "actors", "tune_jobs", "tests", "benchmarks", "examples", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md") and path.name not in ("_moved.py", Path(__file__).name):
                bad += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(path.read_text())]
    assert bad == []
