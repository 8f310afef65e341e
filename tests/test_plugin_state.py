"""A plugin method's own state dataclasses in checkpoints (lcfed/run/checkpoint.py, lcfed.run.loop.load_resume): a
Ditto-like plugin (a global FedAvg model, and on each device a personal model pulled towards it) keeps its
server and device states in frozen dataclasses of its own module. Its checkpoints resume bit for bit and
`lcfed check` finds it resumable; the allow-list grows by that module only, so a checkpoint naming any other
class is still refused before anything runs; and a resume whose plugin was renamed is one line naming it."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from lcfed.run import checkpoint
from lcfed.run.loop import checkpoint_modules, load_resume
from tests.conftest import TINY, tiny_config
from tune_jobs.cli import main

PLUGIN = "lcfed_test_ditto"  # a module of the test's own folder, put on the path
STATES = '''
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DittoServer:
    weights: torch.Tensor
    aggregations: int


@dataclass(frozen=True)
class DittoDevice:
    personal: torch.Tensor
    trained: int
'''
STRATEGY = '''
from dataclasses import dataclass

import torch

from lcfed.learning.clustering import weighted_mean
from lcfed.errors import require
from lcfed.learning.local_update import Proximal
from lcfed.methods.base import RoundStats
from lcfed.methods.fedavg import FedAvg, ModelMessage


@dataclass(frozen=True)
class DittoParams:
    lam: float = 0.5  # the personal model's pull towards the global one

    def validate(self, cfg, prefix="method"):
        require(self.lam >= 0, f"{prefix}.lam", self.lam, "must be >= 0")


class Ditto(FedAvg):
    """Ditto-like: FedAvg's global model, and a personal model per device, each in a state of its own."""

    name = "ditto"
    Params = DittoParams
    supports_async = False

    def init(self):
        return DittoServer(self.fed.init.clone(), 0)

    def configure(self, state, rnd):
        devices = self.participants(rnd)
        return self.plan(rnd, devices, state.weights, downlink=[(state.weights, len(devices))])

    def init_device(self, device, init):
        return DittoDevice(init.clone(), 0)

    def local(self, ctx, dev, payload, instruction):
        shared = ctx.local_update(payload)
        pull = [Proximal(payload.to(ctx.data.x_train.device), self.params.lam)]
        mine = ctx.local_update(dev.personal, pull)
        return (DittoDevice(mine.weights.cpu().clone(), dev.trained + 1),
                ModelMessage(ctx.device, ctx.data.num_train, shared.loss, shared.weights.cpu()))

    def aggregate(self, state, plan, msgs):
        models = torch.stack([m.weights for m in msgs])
        counts = torch.tensor([m.num_samples for m in msgs], dtype=torch.float64)
        new = DittoServer(weighted_mean(models, counts), state.aggregations + 1)
        return new, RoundStats(self.mean_loss(msgs), self.upload_bytes(msgs), plan.down_bytes)

    def eval_payload(self, state):
        return state.weights

    def personalized(self, ctx, dev, payload):
        return dev.personal
'''
#: a module beside the plugin that a forged checkpoint names: importing it or building its class leaves a mark
EVIL = '''
from dataclasses import dataclass
from pathlib import Path

Path(__file__).with_name("imported.mark").touch()


@dataclass(frozen=True)
class Evil:
    def __post_init__(self):
        Path(__file__).with_name("built.mark").touch()
'''


def _forget(*names: str) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin's folder (``lcfed_test_ditto.py`` in it), importable, and the working directory."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{PLUGIN}.py").write_text(STATES + STRATEGY)
    (folder / "lcfed_test_evil.py").write_text(EVIL)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a rewritten module is read again, never a stale .pyc
    _forget(PLUGIN, "lcfed_test_evil", "lcfed_test_dittopkg")
    try:
        yield folder
    finally:
        _forget(PLUGIN, "lcfed_test_evil", "lcfed_test_dittopkg")


def ditto(*extra: str, name: str = f"{PLUGIN}:Ditto"):
    return tiny_config(f"method.name={name}", *extra)


def cli_run(tmp_path: Path, ckpt: Path, *sets: str, resume: bool = False) -> tuple[int, Path]:
    """``lcfed run`` of the plugin on the tiny config; (exit code, its --json summary's path)."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = tmp_path / f"summary-{len(list(tmp_path.glob('summary-*')))}.json"
    args = ["run", "-c", str(cfg), "--no-track", "-q", "--json", str(out), "--set", f"method.name={PLUGIN}:Ditto",
            "--set", f"checkpoint.dir={ckpt}"]
    for s in sets:
        args += ["--set", s]
    return main([*args, *(["--resume"] if resume else [])]), out


def test_lcfed_check_finds_the_plugin_resumable(plugin, capsys):
    assert main(["check", f"{PLUGIN}:Ditto"]) == 0
    out = capsys.readouterr().out
    assert "  resumable  ok" in out and "FAILED" not in out, out


def test_the_cli_resumes_the_plugin_at_round_2_of_4_to_the_uninterrupted_numbers(plugin, tmp_path):
    """One set of runs (through ``lcfed run``) for the checkpoint's plugin states and the resumed numbers; every
    metric of the resumed round bit for bit: the plugin's `resumable` in test_lcfed_check_finds_the_plugin_resumable."""
    code, straight = cli_run(tmp_path, tmp_path / "a", "train.rounds=4")
    assert code == 0
    assert cli_run(tmp_path, tmp_path / "b", "train.rounds=2")[0] == 0
    cont = ditto("train.rounds=4", f"checkpoint.dir={tmp_path / 'b'}")
    assert checkpoint_modules(cont) == (PLUGIN,)
    snap = load_resume(cont)
    assert snap is not None and snap.next_round == 2
    module = sys.modules[PLUGIN]
    assert isinstance(snap.server_state, module.DittoServer) and snap.server_state.aggregations == 2
    states = dict(snap.device_states)
    assert all(isinstance(s, module.DittoDevice) for s in states.values()) and max(s.trained for s in states.values()) >= 1
    # lcfed's own allow-list alone still refuses it: the allowance is the run's method's, not global
    with pytest.raises(checkpoint.CheckpointError, match=f"'{PLUGIN}:DittoServer', outside the allowed modules"):
        checkpoint.load(tmp_path / "b" / "latest.pt")
    code, resumed = cli_run(tmp_path, tmp_path / "b", "train.rounds=4", resume=True)
    assert code == 0
    a, b = json.loads(straight.read_text()), json.loads(resumed.read_text())
    assert [a[k] for k in ("acc_mean", "train_loss", "bytes_up")] == [b[k] for k in ("acc_mean", "train_loss", "bytes_up")]


def forge(folder: Path, digest: str, server: object, device: object) -> Path:
    """A well-formed checkpoint (format 3, SHA-256s right) whose server state and one device part are the
    encoded nodes given: what an attacker who can write ``checkpoint.dir`` could leave there."""
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / "latest.states-forged-0.pt"
    torch.save({"format": checkpoint.FORMAT_VERSION, "states": {"__map__": [[0, device]]}}, part)
    content = {"next_round": 1, "server_state": server, "history": checkpoint.encode([{"round": 0.0}]),
               "config_digest": digest, "tracking": checkpoint.encode({}), "trained": [0], "pending": None,
               "device_parts": [{"file": part.name, "sha256": hashlib.sha256(part.read_bytes()).hexdigest(),
                                 "devices": [0]}]}
    buf = io.BytesIO()
    torch.save(content, buf)
    body = buf.getvalue()
    main_file = folder / checkpoint.MAIN_FILE
    torch.save({"format": checkpoint.FORMAT_VERSION, "sha256": hashlib.sha256(body).hexdigest(),
                "body": torch.frombuffer(bytearray(body), dtype=torch.uint8)}, main_file)
    return main_file


def dc(path: str, **fields: object) -> dict:
    return {"__dc__": path, "fields": fields}


@pytest.mark.parametrize("where", ["server", "device"])
@pytest.mark.parametrize("named", ["os:system", "subprocess:Popen", "lcfed_test_evil:Evil", "lcfed_test_dittox:Evil",
                                   f"{PLUGIN}:Evil"])
def test_a_checkpoint_naming_another_module_is_refused_and_nothing_runs(plugin, tmp_path, capsys, where, named):
    """Other modules, a lookalike name, and a class merely reachable from the plugin's module (defined in
    another): refused in one line, before the class's module is imported or the class built, and no round runs."""
    sys.modules.pop(PLUGIN, None)
    module = importlib.import_module(PLUGIN)
    evil = importlib.import_module("lcfed_test_evil")
    (plugin / "imported.mark").unlink()
    _forget("lcfed_test_evil")
    module.Evil = evil.Evil  # reachable as lcfed_test_ditto:Evil, defined in lcfed_test_evil
    ckpt = tmp_path / "ck"
    honest_server = dc(f"{PLUGIN}:DittoServer", weights=torch.zeros(3), aggregations=1)
    honest_device = dc(f"{PLUGIN}:DittoDevice", personal=torch.zeros(3), trained=1)
    forge(ckpt, ditto("train.rounds=3").digest(), dc(named) if where == "server" else honest_server,
                      dc(named) if where == "device" else honest_device)
    before = sorted((p.name, p.read_bytes()) for p in ckpt.iterdir())
    code, summary = cli_run(tmp_path, ckpt, "train.rounds=3", resume=True)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"lcfed: checkpoint error: checkpoint names '{named}'" in err and "outside the allowed modules" in err, err
    if named == f"{PLUGIN}:Evil":
        assert "a class of 'lcfed_test_evil'" in err
    assert not (plugin / "imported.mark").exists() and not (plugin / "built.mark").exists()
    assert not summary.exists() and sorted((p.name, p.read_bytes()) for p in ckpt.iterdir()) == before
    # the honest forgery resumes: the refusal above is the class named, not the forging
    if where == "server":
        good = forge(tmp_path / "good", ditto().digest(), honest_server, honest_device)
        snap = checkpoint.load(good, allowed=(PLUGIN,))
        assert snap.server_state.aggregations == 1 and snap.device_states[0].trained == 1


def test_the_allowance_is_the_module_and_its_submodules_only(plugin):
    encoded = checkpoint.encode({"x": 1})
    assert checkpoint.decode(encoded, allowed=(PLUGIN,)) == {"x": 1}
    for path, allowed in [(f"{PLUGIN}x:Evil", (PLUGIN,)), ("lcfed_test_evil:Evil", ("lcfed_test",)),
                          ("lcfed_test_evil:Evil", ("",)), ("lcfed_test_evil:Evil", ())]:
        with pytest.raises(checkpoint.CheckpointError, match="outside the allowed modules"):
            checkpoint.decode(dc(path), allowed=allowed)
    assert not (plugin / "imported.mark").exists() and not (plugin / "built.mark").exists()


def test_a_resume_after_the_state_class_was_renamed_is_one_line_naming_it(plugin, tmp_path, capsys):
    ckpt = tmp_path / "ck"
    assert cli_run(tmp_path, ckpt, "train.rounds=2")[0] == 0
    source = plugin / f"{PLUGIN}.py"
    source.write_text(source.read_text().replace("DittoDevice", "PersonalDevice"))
    _forget(PLUGIN)
    code, summary = cli_run(tmp_path, ckpt, "train.rounds=4", resume=True)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert (f"lcfed: checkpoint error: checkpoint names '{PLUGIN}:DittoDevice', but module '{PLUGIN}' has no class "
            "'DittoDevice'; resuming needs the code that wrote it") in err, err
    assert not summary.exists()


def test_a_resume_after_the_states_module_was_renamed_is_one_line_naming_it(plugin, tmp_path, capsys):
    """A plugin package whose states live in a submodule (allowed with the strategy's module), then moved."""
    package = plugin / "lcfed_test_dittopkg"
    package.mkdir()
    (package / "states.py").write_text(STATES)
    (package / "__init__.py").write_text("from lcfed_test_dittopkg.states import DittoDevice, DittoServer\n" + STRATEGY)
    name = "method.name=lcfed_test_dittopkg:Ditto"
    ckpt = tmp_path / "ck"
    assert cli_run(tmp_path, ckpt, "train.rounds=2", name)[0] == 0
    cont = ditto("train.rounds=4", f"checkpoint.dir={ckpt}", name="lcfed_test_dittopkg:Ditto")
    snap = load_resume(cont)
    assert snap is not None and type(snap.server_state).__module__ == "lcfed_test_dittopkg.states"
    (package / "states.py").rename(package / "personal.py")
    (package / "__init__.py").write_text("from lcfed_test_dittopkg.personal import DittoDevice, DittoServer\n" + STRATEGY)
    _forget("lcfed_test_dittopkg")
    code, summary = cli_run(tmp_path, ckpt, "train.rounds=4", name, resume=True)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert ("lcfed: checkpoint error: checkpoint names 'lcfed_test_dittopkg.states:DittoServer', but its module "
            "'lcfed_test_dittopkg.states' cannot be imported (ModuleNotFoundError: No module named "
            "'lcfed_test_dittopkg.states'); resuming needs the code that wrote it") in err, err
    assert not summary.exists()


def test_a_resume_without_the_plugin_is_one_line_naming_it(plugin, tmp_path, capsys):
    ckpt = tmp_path / "ck"
    assert cli_run(tmp_path, ckpt, "train.rounds=2")[0] == 0
    main_file = ckpt / checkpoint.MAIN_FILE
    (plugin / f"{PLUGIN}.py").unlink()
    _forget(PLUGIN)
    code, summary = cli_run(tmp_path, ckpt, "train.rounds=4", resume=True)  # the config itself names it
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"cannot import '{PLUGIN}'" in err and not summary.exists()
    # read with the allowance but without the module (e.g. a tool that is handed the method's module)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.load(main_file, allowed=(PLUGIN,))
    assert str(caught.value) == (f"checkpoint names '{PLUGIN}:DittoServer', but its module '{PLUGIN}' cannot be "
                                 f"imported (ModuleNotFoundError: No module named '{PLUGIN}'); resuming needs the "
                                 "code that wrote it")


def test_the_snapshot_a_write_returns_reads_the_plugin_states_back(plugin, tmp_path):
    """What the loop replays from when a host is lost: the states it just wrote, read back from their parts."""
    module = importlib.import_module(PLUGIN)
    snap = checkpoint.Snapshot(1, module.DittoServer(torch.ones(2), 1), {}, [], "d")
    back = checkpoint.write(tmp_path / "latest.pt", snap, [{3: module.DittoDevice(torch.full((2,), 3.0), 1)}],
                            [PLUGIN])
    assert isinstance(back.device_states, checkpoint.StateParts) and back.device_states.allowed == (PLUGIN,)
    state = back.device_states[3]
    assert isinstance(state, module.DittoDevice) and torch.equal(state.personal, torch.full((2,), 3.0))
