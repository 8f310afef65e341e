"""Checkpoints: a safe format, and resuming continues bit-identically (same MLflow run)."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
import torch

from lcfed.config import to_dict
from lcfed.engines.local import run_local
from lcfed.learning.similarity import Projector
from lcfed.methods.lcfed import LCFedState
from lcfed.run import checkpoint
from lcfed.run.loop import load_resume
from lcfed.tracking.store import open_client
from tests.conftest import same_metrics, tiny_config
from tune_jobs.cli import main


def test_roundtrip_of_a_method_state(tmp_path):
    state = LCFedState(torch.arange(3.0), torch.ones(2, 5), np.array([0, 1, -1]),
                       Projector(torch.eye(2, 5), torch.zeros(5)), fitted_at=4, center_codes=torch.ones(2, 2))
    snap = checkpoint.Snapshot(7, state, {0: None, 3: (1, "a")}, [{"round": 0.0}], "abc", {"run_id": "r"})
    path = checkpoint.save(tmp_path / "c.pt", snap)
    raw = torch.load(path, weights_only=True)  # plain data only: loads with the safe loader
    assert raw["format"] == checkpoint.FORMAT_VERSION and raw["body"].dtype == torch.uint8
    back = checkpoint.load(path)
    assert back.next_round == 7 and back.device_states == {0: None, 3: (1, "a")}
    s = back.server_state
    assert isinstance(s, LCFedState) and isinstance(s.projector, Projector)
    assert torch.equal(s.centers, state.centers) and s.assignment.dtype == np.int64
    assert list(s.assignment) == [0, 1, -1] and s.fitted_at == 4


@pytest.mark.parametrize("where", [0.5, 0.9])
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, where):
    path = checkpoint.save(tmp_path / "c.pt", checkpoint.Snapshot(3, {"w": torch.arange(4000.0)}, {}, [], "d"))
    data = bytearray(path.read_bytes())
    at = int(len(data) * where)
    for i in range(at, at + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=f"{path}.*damaged"):
        checkpoint.load(path)


def test_device_states_are_written_part_by_part_and_read_when_used(tmp_path):
    handed = []

    def parts():  # a pool hands its states over one host at a time
        for chunk in ({1: torch.full((3,), 1.0), 4: torch.full((3,), 4.0)}, {}, {9: torch.full((3,), 9.0)}):
            handed.append(sorted(chunk))
            yield chunk

    path = tmp_path / "latest.pt"
    snap = checkpoint.write(path, checkpoint.Snapshot(2, None, {}, [], "d", trained=(1, 4, 9)), parts())
    assert handed == [[1, 4], [], [9]]
    files = sorted(f.name for f in tmp_path.glob("latest.states-*.pt"))
    assert len(files) == 2 and [p.devices for p in snap.device_states.parts] == [(1, 4), (9,)]
    back = checkpoint.load(path)
    assert isinstance(back.device_states, checkpoint.StateParts) and sorted(back.device_states) == [1, 4, 9]
    assert torch.equal(back.device_states[9], torch.full((3,), 9.0))
    assert [sorted(c) for c in checkpoint.state_chunks(back.device_states)] == [[1, 4], [9]]
    # the next checkpoint's parts replace these once its main file is in place
    checkpoint.save(path, checkpoint.Snapshot(3, None, {2: torch.zeros(2)}, [], "d"))
    assert [f.name for f in tmp_path.glob("latest.states-*.pt")] != files
    assert len(list(tmp_path.glob("latest.states-*.pt"))) == 1 and dict(checkpoint.load(path).device_states).keys() == {2}


def test_a_damaged_or_missing_part_is_refused_before_any_state_is_read(tmp_path):
    path = checkpoint.save(tmp_path / "latest.pt", checkpoint.Snapshot(1, None, {0: torch.arange(4000.0)}, [], "d"))
    (part,) = tmp_path.glob("latest.states-*.pt")
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=f"{path} is damaged: its part {part} does not match"):
        checkpoint.load(path)
    part.unlink()
    with pytest.raises(checkpoint.CheckpointError, match=f"its part {part} is missing"):
        checkpoint.load(path)


def test_a_checkpoint_of_the_wrong_structure_is_refused(tmp_path):
    for bad in ({"format": 1, "next_round": 2}, [1, 2], {"format": 1, "next_round": "x", "server_state": None,
                                                         "device_states": {}, "history": [], "config_digest": "",
                                                         "tracking": {}}):
        path = tmp_path / "bad.pt"
        torch.save(bad, path)
        with pytest.raises(checkpoint.CheckpointError, match=str(path)):
            checkpoint.load(path)


def test_foreign_classes_are_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "next_round": 1, "server_state": {"__dc__": "subprocess:Popen", "fields": {}},
                "device_states": [], "history": [], "config_digest": "", "tracking": []}, path)
    with pytest.raises(checkpoint.CheckpointError, match="outside the allowed modules"):
        checkpoint.load(path)


def test_resume_is_bit_identical(tmp_path):
    # a run stopped after 3 rounds, then extended to 6 (the number of rounds is outside the config's digest)
    full = run_local(tiny_config("train.rounds=6", "train.local_steps=2", f"checkpoint.dir={tmp_path / 'a'}"))
    first = tiny_config("train.rounds=3", "train.local_steps=2", f"checkpoint.dir={tmp_path / 'b'}")
    run_local(first)
    cont = tiny_config("train.rounds=6", "train.local_steps=2", f"checkpoint.dir={tmp_path / 'b'}")
    snap = load_resume(cont)
    assert snap is not None and snap.next_round == 3
    resumed = run_local(cont, resume=snap)
    same_metrics(full.history, resumed.history)
    assert np.array_equal(full.assignment, resumed.assignment)


def test_checkpoint_of_another_config_is_refused(tmp_path):
    run_local(tiny_config("train.rounds=2", f"checkpoint.dir={tmp_path}"))
    with pytest.raises(checkpoint.CheckpointError, match="different config"):
        load_resume(tiny_config("train.rounds=4", "method.mu=0.9", f"checkpoint.dir={tmp_path}"))


@pytest.mark.subprocess
def test_cli_resume_continues_the_same_mlflow_run_or_a_new_one_when_it_is_gone(tmp_path, tracking_uri, capsys):
    base = ["run", "--quiet", "--set", f"tracking.uri={tracking_uri}", "--set", f"checkpoint.dir={tmp_path / 'ck'}",
            "--set", "data.num_devices=8", "--set", "method.num_clusters=3", "--set", "method.rank=4",
            "--set", "train.local_steps=1"]  # (what is logged where does not depend on the training)
    assert main([*base, "--set", "train.rounds=2"]) == 0
    # a second run into the same checkpoint dir must say --resume, not overwrite
    assert main([*base, "--set", "train.rounds=4"]) == 2
    assert "--resume" in capsys.readouterr().err
    not_quiet = [a for a in base if a != "--quiet"]  # --resume's line is lcfed's own notice: -q leaves it out
    assert main([*not_quiet, "--set", "train.rounds=4", "--resume"]) == 0
    said = capsys.readouterr().err
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    run = runs[0]
    assert (f"lcfed: resuming MLflow run {run.info.run_id} at round 2 of rounds 0-3 (checkpoint {tmp_path / 'ck' / 'latest.pt'})"
            in said.splitlines()), said
    assert run.info.status == "FINISHED" and run.data.tags.get("resumed") == "true"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss/train_loss")]
    assert steps == [0, 1, 2, 3]

    # the store no longer holds the checkpoint's run: a new run with a note, every round logged in it once
    capsys.readouterr()
    client.delete_run(run.info.run_id)
    assert main([*base, "--set", "train.rounds=5", "--resume"]) == 0
    assert (f"lcfed: note: MLflow run {run.info.run_id} of the checkpoint is not in {tracking_uri} (deleted, or the "
            "store was replaced): continuing in a new run, which gets rounds 1-4 from the checkpoint"
            in capsys.readouterr().err)
    (new,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert new.info.status == "FINISHED" and new.data.tags["resumed_from_run"] == run.info.run_id
    history = client.get_metric_history(new.info.run_id, "loss/train_loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4]
    old = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss/train_loss")}
    assert all(old[m.step] == m.value for m in history if m.step < 4)  # the checkpoint's rounds, as logged before


@pytest.mark.subprocess
def test_sigterm_stops_at_a_round_boundary_checkpointed_and_killed_then_resume_completes(tmp_path, tracking_uri):
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from lcfed.config import to_dict

    rounds = 12  # 9 left once 3 are logged: the signal comes mid-run
    cfg = tiny_config(f"train.rounds={rounds}", "tracking.enabled=true", f"tracking.uri={tracking_uri}",
                      "tracking.experiment=sig", f"checkpoint.dir={tmp_path / 'ck'}", "checkpoint.every=1000")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    cmd = [sys.executable, "-m", "tune_jobs", "run", "-c", str(path), "-q"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    client = open_client(tracking_uri)  # under the store's lock: the run may be creating the database now

    def steps() -> list[int]:
        exp = client.get_experiment_by_name("sig")
        runs = client.search_runs([exp.experiment_id]) if exp else []
        return sorted(m.step for r in runs for m in client.get_metric_history(r.info.run_id, "loss/train_loss"))

    while proc.poll() is None and len(steps()) < 3:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("lcfed: SIGTERM: stopped after round") and "continue with --resume" in last
    stopped_after = int(last.split("after round ")[1].split(";")[0])
    (run,) = client.search_runs([client.get_experiment_by_name("sig").experiment_id])
    assert run.info.status == "KILLED" and "SIGTERM" in run.data.tags["failure_reason"]
    assert checkpoint.load(tmp_path / "ck" / "latest.pt").next_round == stopped_after + 1
    assert steps() == list(range(stopped_after + 1))  # every finished round logged, none lost

    # the resume in this process: the signal needed the subprocess, resuming does not (one interpreter start fewer)
    assert main(["run", "-c", str(path), "-q", "--resume"]) == 0
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert steps() == list(range(rounds))  # each round exactly once, in the same run
    clean = run_local(cfg.replace(**{"tracking.enabled": False, "checkpoint.dir": ""}))
    assert client.get_run(run.info.run_id).data.metrics["accuracy/acc_mean"] == pytest.approx(clean.final["acc_mean"], abs=0)


def test_an_old_checkpoint_resumes_after_a_train_field_is_added(tmp_path, monkeypatch):
    """A ``train`` field added later stays out of the digest at its default (``LATER_DEFAULTS``), so a checkpoint
    written before it existed resumes; at another value the digest changes."""
    import dataclasses

    from lcfed import config as config_module

    old = tiny_config("train.rounds=4", f"checkpoint.dir={tmp_path}")
    run_local(tiny_config("train.rounds=2", f"checkpoint.dir={tmp_path}"))
    later = dataclasses.make_dataclass("TrainConfig", [("warmup", int, dataclasses.field(default=0))],
                                       bases=(type(old.train),), frozen=True)
    monkeypatch.setitem(config_module.LATER_DEFAULTS, "train", {"warmup": 0})
    new = dataclasses.replace(old, train=later(**vars(old.train)))
    assert to_dict(new)["train"]["warmup"] == 0 and new.digest() == old.digest()
    snap = load_resume(new)
    assert snap is not None and snap.next_round == 2
    assert dataclasses.replace(old, train=later(**vars(old.train), warmup=3)).digest() != old.digest()
