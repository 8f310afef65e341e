"""`lcfed run --engine ray` attaches to the head `lcfed head start` left running on this machine, saying so
in one line, with the numbers of a private Ray; `--private-ray` keeps the private start (a real head on free
ports, its state in a temporary ``$XDG_STATE_HOME``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from lcfed.config import to_dict
from tests.conftest import same_metrics, tiny_config
from tests.raycluster import free_port
from tune_jobs.cli import main
from tune_jobs.run_command import attach_to_head

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster, pytest.mark.subprocess]


def test_a_ray_run_attaches_to_the_running_head_and_private_ray_does_not(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = tiny_config("engine.kind=ray", "engine.num_actors=1", "tracking.enabled=false")
    assert attach_to_head(cfg, private=False) is cfg  # no head recorded: the private Ray, silently
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    port = free_port()
    assert main(["head", "start", "--port", str(port), "--dashboard-port", str(free_port()), "--num-cpus", "2"]) == 0
    capsys.readouterr()
    try:
        runs = {}
        for flags in ([], ["--private-ray"]):
            out = tmp_path / f"run{len(runs)}.json"
            done = subprocess.run([sys.executable, "-m", "tune_jobs", "run", "-c", str(config), "--json", str(out),
                                   *flags], capture_output=True, text=True, timeout=240, env=os.environ.copy())
            assert done.returncode == 0, done.stderr[-3000:]
            runs[tuple(flags)] = (done.stderr, json.loads(out.read_text()))
        attached, private = runs[()], runs[("--private-ray",)]
        line = (f"lcfed: attaching to the Ray head `lcfed head start` left running (GCS 127.0.0.1:{port}); "
                "--private-ray starts a Ray of this run's own")
        assert line in attached[0].splitlines() and "attaching" not in private[0]
        keys = ["acc_mean", "acc_weighted", "train_loss"]
        same_metrics([{k: attached[1][k] for k in keys}], [{k: private[1][k] for k in keys}])  # the same numbers
        assert attach_to_head(cfg, private=True) is cfg
        assert attach_to_head(cfg, private=False).engine.address == f"127.0.0.1:{port}"
    finally:
        assert main(["head", "stop"]) == 0
