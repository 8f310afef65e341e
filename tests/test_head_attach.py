"""`lcfed run --engine ray` attaches to the head `lcfed head start` left running on this machine, saying so
in one line, with the numbers of a private Ray (the in-process run's); `--private-ray` keeps the private start (a
real head on free ports, its state in a temporary ``$XDG_STATE_HOME``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from lcfed.config import to_dict
from lcfed.engines.local import run_local
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
        out = tmp_path / "run.json"
        done = subprocess.run([sys.executable, "-m", "tune_jobs", "run", "-c", str(config), "--json", str(out)],
                              capture_output=True, text=True, timeout=240, env=os.environ.copy())
        assert done.returncode == 0, done.stderr[-3000:]
        line = (f"lcfed: attaching to the Ray head `lcfed head start` left running (GCS 127.0.0.1:{port}); "
                "--private-ray starts a Ray of this run's own")
        assert line in done.stderr.splitlines()
        # the numbers of a private Ray, which are the in-process run's (tests/test_ray_parity.py)
        keys = ["acc_mean", "acc_weighted", "train_loss"]
        attached, local = json.loads(out.read_text()), run_local(cfg.replace(**{"engine.kind": "local"})).final
        same_metrics([{k: attached[k] for k in keys}], [{k: local[k] for k in keys}])
        assert attach_to_head(cfg, private=True) is cfg  # --private-ray: this run's own Ray, as with no head
        assert attach_to_head(cfg, private=False).engine.address == f"127.0.0.1:{port}"
    finally:
        assert main(["head", "stop"]) == 0
