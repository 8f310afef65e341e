"""`lcfed head start|stop|status`: a real `ray start --head` on free ports, its state in a temporary
``$XDG_STATE_HOME``; every listening socket on loopback while up (psutil); `lcfed run --engine ray` attaches to
it, saying so in one line, with the numbers of a private Ray (the in-process run's), and `--private-ray` keeps
the private start; after the stop no process of its group, no state and no Ray address file naming it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import psutil
import pytest
import yaml

from lcfed.config import to_dict
from lcfed.engines.local import run_local
from tests.conftest import same_metrics, tiny_config
from tests.raycluster import alive, free_port
from tune_jobs import head
from tune_jobs.cli import main
from tune_jobs.run_command import attach_to_head

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


@pytest.fixture
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "lcfed"


def test_a_head_that_listens_on_loopback_only_runs_attached_and_stops_cleanly(state_home, tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = tiny_config("engine.kind=ray", "engine.num_actors=1", "tracking.enabled=false")
    assert attach_to_head(cfg, private=False) is cfg  # no head recorded: the private Ray, silently
    port, dash = free_port(), free_port()
    assert main(["head", "start", "--port", str(port), "--dashboard-port", str(dash), "--num-cpus", "2"]) == 0
    out = capsys.readouterr().out
    state = json.loads((state_home / "head.json").read_text())
    pid = int(state["pid"])
    try:
        assert f"GCS 127.0.0.1:{port}" in out and "every socket on 127.0.0.1" in out
        leader = psutil.Process(pid)
        cmd = " ".join(leader.cmdline())
        assert "ray start --head --block" in cmd and os.getpgid(pid) == pid
        # the recorded id is the head itself, the leader of the process group that holds every socket
        sockets = head.listening(pid)
        assert {port, dash} <= {p for _, _, p in sockets}
        assert sockets and all(head.is_loopback(ip) for _, ip, _ in sockets), sockets
        assert head.address_file().read_text().strip() == f"127.0.0.1:{port}"

        assert main(["head", "status"]) == 0
        assert f"127.0.0.1:{dash}" in capsys.readouterr().out
        assert main(["head", "start", "--port", str(free_port()), "--dashboard-port", str(free_port())]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"already running (pid {pid}" in err
        _attached_run(cfg, port, tmp_path)
        _auto_attaches(port)
    finally:
        assert main(["head", "stop"]) == 0
    out, err = capsys.readouterr()
    assert "Ray head stopped in" in out and "Traceback" not in out + err
    assert head.group(pid) == []
    assert not (state_home / "head.json").exists()
    assert not head.address_file().exists() or head.address_file().read_text().strip() != f"127.0.0.1:{port}"
    assert main(["head", "stop"]) == 0 and "nothing to stop" in capsys.readouterr().out
    assert main(["head", "status"]) == 1


def _auto_attaches(port: int) -> None:
    """``engine.address=auto`` finds the head through Ray's address file and joins it as the run above joined it (on
    loopback) wherever Ray alone would swap 127.0.0.1 for the machine's IP, on which nothing listens. The decision
    alone: an in-process attach here took 30 s more in a test process that had run a private Ray before."""
    from actors.connect import _loopback_only, resolve_gcs

    swapped = resolve_gcs("auto") != f"127.0.0.1:{port}"  # Ray's own answer
    assert _loopback_only("auto") is swapped and _loopback_only(f"127.0.0.1:{port}") is swapped


def _attached_run(cfg, port: int, tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
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


def test_bad_ports_are_one_line_before_anything_starts(state_home, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        assert main(["head", "start", "--port", str(busy), "--dashboard-port", str(free_port())]) == 2
        assert f"--port {busy}: the port is in use on 127.0.0.1" in capsys.readouterr().err
    assert main(["head", "start", "--port", "80"]) == 2
    assert "--port 80: must be a port in 1024-65535" in capsys.readouterr().err
    assert main(["head", "start", "--port", "7000", "--dashboard-port", "7000"]) == 2
    assert "they must differ" in capsys.readouterr().err
    assert main(["head", "start", "--num-cpus", "-1"]) == 2
    assert "--num-cpus -1: must be a whole number >= 0" in capsys.readouterr().err
    assert not state_home.exists()  # nothing was started or written


def test_a_start_ray_gave_up_on_under_load_is_cleared_and_tried_once_more(state_home, tmp_path, monkeypatch, capsys):
    """Ray waits a fixed 30 s for the head's raylet, which a busy machine can miss. Ray's message cannot be
    caused on demand, so a stand-in `ray` says it, leaving a daemon behind as Ray's GCS would: each attempt's
    leftovers are killed, the start is tried once more, and the second failure is the command's one line."""
    calls = tmp_path / "calls"
    fake = tmp_path / "ray"
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\nsleep 600 &\necho $! >> {tmp_path / 'left'}\n"
                    f"echo 'Exception: {head.RAY_STARTUP_TIMEOUT}. This could happen because ...'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(head, "_ray_binary", lambda: str(fake))
    assert main(["head", "start", "--port", str(free_port()), "--dashboard-port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.count("starting the head once more") == 1 and head.RAY_STARTUP_TIMEOUT in err.splitlines()[-1]
    assert len(calls.read_text().split()) == 2
    left = [int(p) for p in (tmp_path / "left").read_text().split()]
    assert len(left) == 2 and not any(alive(p) for p in left)
    assert not head.state_file().exists()
