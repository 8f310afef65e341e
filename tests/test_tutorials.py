"""The tutorials' code, run for real (docs/tutorials/): Ditto and CFL keep the Strategy contract, CFL's
cluster count grows on the demo config with its default thresholds, Ditto's lam changes the personal
models and nothing else, and the dataset tutorial's CSV and config give a run scored against its groups.
Every page's ``--8<--`` include names a file that exists (the site build would fail otherwise)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lcfed import api
from lcfed.conformance import assert_conforms, small_config
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
CODE = TUTORIALS / "code"
INCLUDE = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$', re.MULTILINE)


@pytest.fixture
def tutorial_code(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The tutorials' code folder on the import path, as `lcfed` run from that folder has it; its modules
    are forgotten afterwards, so no other test imports them by accident."""
    monkeypatch.syspath_prepend(str(CODE))
    yield CODE
    for name in ("ditto", "cfl", "make_groups_csv", "balanced"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("page", ["ditto.md", "cfl.md", "dataset.md", "cluster.md"])
def test_every_include_names_a_file_that_exists(page):
    text = (TUTORIALS / page).read_text()
    included = INCLUDE.findall(text)
    if page != "cluster.md":  # the cluster walk-through is commands only
        assert included, f"{page} includes no code file"
    for path in included:
        assert (ROOT / path).is_file(), f"{page} includes {path}, which does not exist"


@pytest.mark.parametrize("method", ["ditto:Ditto", "cfl:CFL", "balanced:BalancedFedAvg"])
def test_the_tutorial_methods_keep_the_contract(tutorial_code, method):
    assert_conforms(method)  # seeded, pure, priced, resumable: what `lcfed check` reports


def test_cfl_keeps_the_contract_while_it_splits(tutorial_code):
    """Thresholds that split every cluster every round: the checkpoint after round 1 holds two clusters,
    and resuming from it must give round 2 bit for bit."""
    split_always = {"method.eps1": 1e9, "method.eps2": 0.0, "method.warmup": 0}
    cfg = small_config("cfl:CFL", **split_always)
    counts = [int(row["num_clusters"]) for row in api.run(cfg).history]
    assert counts[0] == 2 and counts[1] > 2, counts
    assert_conforms("cfl:CFL", cfg=cfg)


def test_cfl_splits_on_the_demo_config_with_its_defaults(tutorial_code):
    """The page's claim: on configs/demo.yaml the defaults split the single cluster within a few rounds
    (measured: round 3, counting from 0)."""
    cfg = api.config(ROOT / "configs" / "demo.yaml", ["method.name=cfl:CFL", "train.rounds=4",
                                                      "tracking.enabled=false"])
    history = api.run(cfg).history
    counts = [int(row["num_clusters"]) for row in history]
    assert counts[0] == 1 and max(counts) >= 2, counts
    assert counts == sorted(counts), counts  # CFL only splits


def test_ditto_lam_moves_the_personal_models_only(tutorial_code):
    def run(*sets: str):
        return api.run(tiny_config(*sets), models=True)  # 8 devices of digits, 3 rounds

    loose, tight = run("method.name=ditto:Ditto", "method.lam=0"), run("method.name=ditto:Ditto", "method.lam=10")
    fedavg = run("method.name=fedavg")
    for res in (loose, tight):  # the personal models' accuracy is what a run reports
        assert all("acc_mean" in row for row in res.history) and math.isfinite(res.final["acc_mean"])
    assert loose.final["acc_mean"] != tight.final["acc_mean"] or loose.final["test_loss"] != tight.final["test_loss"]
    # the global model trains on its own batch stream (0), so it is FedAvg's, number for number, whatever lam
    assert loose.models is not None and tight.models is not None and fedavg.models is not None
    for res in (loose, tight):
        assert [r["train_loss"] for r in res.history] == [r["train_loss"] for r in fedavg.history]
        assert [r["bytes_up"] for r in res.history] == [r["bytes_up"] for r in fedavg.history]  # personal stays home
        assert torch.equal(res.models.server_state.weights, fedavg.models.server_state.weights)
    assert not torch.equal(loose.models.personal[0], tight.models.personal[0])
    # a strong pull keeps the personal model nearer the global one
    w = tight.models.server_state.weights
    assert (tight.models.personal[0] - w).norm() < (loose.models.personal[0] - w).norm()


def test_an_own_local_loop_weighs_classes_and_runs_unbatched_under_the_vectorized_step(tutorial_code):
    """The contract page's own loop: weights by hand; power 0 trains as FedAvg's loop does, up to float rounding;
    under ``engine.vectorize=always`` the loop runs in its device's thread, with the same numbers."""
    from balanced import class_weights

    y = torch.tensor([1, 1, 1, 7])  # n = 4, two classes: 4/(2*3) for each "1", 4/(2*1) for the "7"
    assert class_weights(y, 1.0).tolist() == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert class_weights(y, 0.0).tolist() == [1.0] * 4

    balanced = api.run(tiny_config("method.name=balanced:BalancedFedAvg", "engine.vectorize=never"))
    vectorized = api.run(tiny_config("method.name=balanced:BalancedFedAvg", "engine.vectorize=always"))
    assert [r["acc_mean"] for r in vectorized.history] == [r["acc_mean"] for r in balanced.history]
    assert [r["train_loss"] for r in vectorized.history] == [r["train_loss"] for r in balanced.history]
    plain = api.run(tiny_config("method.name=balanced:BalancedFedAvg", "method.power=0"))
    fedavg = api.run(tiny_config("method.name=fedavg"))
    for a, b in zip(plain.history, fedavg.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert balanced.history[-1]["train_loss"] < balanced.history[0]["train_loss"]


@pytest.mark.subprocess
def test_the_dataset_tutorial_scores_clusters_against_the_files_groups(tutorial_code, tmp_path):
    script = CODE / "make_groups_csv.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "groups.csv")], capture_output=True,
                         text=True, check=True)
    assert "960 samples of 12 users in 3 groups" in out.stdout
    header = (tmp_path / "groups.csv").read_text().splitlines()[0]
    assert header == "f0,f1,f2,f3,label,user,group"

    cfg = api.config(CODE / "groups.yaml", [f"data.data_dir={tmp_path}"])
    res = api.run(cfg)
    assert math.isfinite(res.final["ari"]) and "nmi" in res.final  # nmi: scored against the file's groups
    assert res.final["ari"] > 0.5, res.final["ari"]  # LCFed finds them (1.0 when measured)

    # CFL finds the number of groups by itself, with the thresholds the page gives
    cfl = api.config(CODE / "groups.yaml", [f"data.data_dir={tmp_path}", "method.name=cfl:CFL", "method.eps1=0.1",
                                            "method.eps2=0.2", "method.warmup=1", "train.rounds=10"])
    history = api.run(cfl).history
    counts = [int(row["num_clusters"]) for row in history]
    assert counts[0] == 1 and counts[-1] >= 2, counts
    assert all(math.isfinite(row["ari"]) for row in history)
