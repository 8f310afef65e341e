"""Plugins: the example package (examples/lcfed-example-plugin) installed for real, found through its entry
points, and the same code named by a ``package.module:attr`` path; FedProx with mu = 0 is FedAvg, number
for number; a plugin that fails to load is one line, never a traceback."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from lcfed import registry
from lcfed.data import load_dataset
from tests.conftest import TINY
from tune_jobs.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lcfed-example-plugin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``pip install`` of the example into a target directory put on the path: its entry points are real."""
    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / EXAMPLE.name
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))  # pip builds in the tree
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(source)], check=True, timeout=300)
    sys.path.insert(0, str(target))
    registry.refresh()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m == "lcfed_example" or m.startswith("lcfed_example.")]:
            del sys.modules[name]
        registry.refresh()


def run_json(tmp_path: Path, name: str, *sets: str) -> dict:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = tmp_path / f"{name}.json"
    args = ["run", "-c", str(cfg), "--no-track", "-q", "--json", str(out)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(out.read_text())


def test_listings_show_the_plugins_and_where_they_come_from(installed, capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "fedprox_demo FedProx (Li et al., MLSys 2020)" in out
    assert "from: entry point lcfed_example.fedprox:FedProx (lcfed-example-plugin 0.1.0)" in out
    assert "params: mu=0.01" in out
    assert main(["models"]) == 0
    assert "small_mlp " in capsys.readouterr().out
    assert main(["datasets"]) == 0
    assert "npz " in capsys.readouterr().out


TWO = "train.rounds=2"  # number for number: a round from the first one's state is what more rounds would add


def test_fedprox_with_mu_0_is_fedavg_number_for_number(installed, tmp_path):
    prox = run_json(tmp_path, "prox", TWO, "method.name=fedprox_demo", "method.mu=0")
    avg = run_json(tmp_path, "avg", TWO, "method.name=fedavg")
    keys = ("acc_mean", "acc_weighted", "train_loss", "test_loss", "bytes_up", "bytes_down")
    assert [prox[k] for k in keys] == [avg[k] for k in keys]
    assert prox["method"] == "fedprox_demo"
    pulled = run_json(tmp_path, "pulled", TWO, "method.name=fedprox_demo", "method.mu=1")
    assert pulled["train_loss"] != avg["train_loss"]  # the proximal term is there
    # FedProx inherits FedAvg's asynchronous aggregation (FedBuff): with mu = 0, the same numbers again
    fedbuff = ["train.participation=0.5", "devices.simulate=true", "devices.aggregation=async", "devices.async_buffer=2",
               "devices.speed_sigma=1.0"]
    prox = run_json(tmp_path, "prox-async", TWO, "method.name=fedprox_demo", "method.mu=0", *fedbuff)
    avg = run_json(tmp_path, "avg-async", TWO, "method.name=fedavg", *fedbuff)
    assert [prox[k] for k in (*keys, "sim_clock_seconds", "staleness_mean")] == \
        [avg[k] for k in (*keys, "sim_clock_seconds", "staleness_mean")]


def lcfed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``lcfed`` as a user whose environment has the plugin installed (its Ray workers see it too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "tune_jobs", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # ~70 s; a plugin swept on Ray's workers: tests/test_multinode.py; compare itself: tests/test_compare.py
def test_a_compare_of_the_plugin_against_fedavg(installed, tmp_path):
    """Phase 1 is a 2-trial sweep of each method (the code ``lcfed sweep`` runs; the CLI sweep of a plugin is
    in tests/test_multinode.py, on worker nodes); FedProx is tuned over the space it ships."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "cmp"
    cmp = lcfed(installed, tmp_path, "compare", "-c", str(cfg), "--methods", "fedprox_demo,fedavg", "--budget", "2",
                "--seeds", "1", "--scheduler", "fifo", "--out", str(out))
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    rows = {r["method"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert set(rows) == {"fedprox_demo", "fedavg"}
    phase1 = {m: json.loads((out / "phase1" / f"{m}.json").read_text()) for m in rows}
    assert all(p["trials"] == 2 and p["errors"] == 0 for p in phase1.values())
    assert set(phase1["fedprox_demo"]["best_config"]) == {"train.lr", "train.local_steps", "method.mu"}
    assert set(phase1["fedavg"]["best_config"]) == {"train.lr", "train.local_steps"}


def test_a_plugin_model_on_a_plugin_dataset(installed, tmp_path, capsys):
    digits = load_dataset("digits", tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "example.npz", x=digits.x[:600, 0], y=digits.y[:600])  # N x H x W: one channel added
    summary = run_json(tmp_path, "mlp", "model.name=small_mlp", "data.dataset=npz", f"data.data_dir={data}",
                       "method.name=fedavg", "train.rounds=5")
    assert summary["acc_mean"] > 0.5  # 10 classes: chance is 0.1
    assert main(["data", "stats", "--set", "data.dataset=npz", "--set", f"data.data_dir={data}"]) == 0
    assert "npz" in capsys.readouterr().out


def test_a_path_in_the_working_directory_without_installing(tmp_path, monkeypatch):
    """``module:attr`` names code next to the command, as on a cluster's job working directory."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE / "lcfed_example" / "fedprox.py", work / "myprox.py")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    try:
        prox = run_json(tmp_path, "path", "method.name=myprox:FedProx", "method.mu=0")
        avg = run_json(tmp_path, "avg", "method.name=fedavg")
    finally:
        sys.modules.pop("myprox", None)
    assert prox["method"] == "myprox:FedProx" and prox["acc_mean"] == avg["acc_mean"]
    assert prox["train_loss"] == avg["train_loss"]


def test_an_entry_point_that_fails_to_load_is_one_line(tmp_path, monkeypatch, capsys):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lcfed.methods]\nbrokenep = no_such_module_xyz:Thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    try:
        assert main(["run", "--no-track", "-q", "--set", "method.name=brokenep"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "method.name: got 'brokenep'; entry point 'brokenep' (no_such_module_xyz:Thing) failed to load: " \
               "ModuleNotFoundError: No module named 'no_such_module_xyz'" in err
        assert main(["methods"]) == 0  # the listing goes on, saying what is wrong with it
        assert "brokenep     (entry point no_such_module_xyz:Thing (broken-plugin 0.1)) cannot be used" in \
            capsys.readouterr().out
    finally:
        monkeypatch.undo()
        registry.refresh()


def test_a_subclass_of_a_built_in_without_params_takes_the_built_ins(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.py").write_text("from lcfed.methods.lcfed import LCFed\n\n\nclass Mine(LCFed):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    try:
        assert main(["config", "--set", "method.name=mine:Mine", "--set", "method.mu=0.5"]) == 0
        method = yaml.safe_load(capsys.readouterr().out)["method"]
        assert method["name"] == "mine:Mine" and method["mu"] == 0.5 and "num_clusters" in method
    finally:
        sys.modules.pop("mine", None)
