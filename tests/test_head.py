"""`lcfed head start|stop|status`: a real `ray start --head` on free ports, its state in a temporary
``$XDG_STATE_HOME``; every listening socket on loopback while up (psutil); after the stop no process of
its group, no state and no Ray address file naming it."""

from __future__ import annotations

import json
import os
import socket

import psutil
import pytest

from tests.raycluster import free_port
from tune_jobs import head
from tune_jobs.cli import main

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster, pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


@pytest.fixture
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "lcfed"


def test_a_head_that_listens_on_loopback_only_and_stops_cleanly(state_home, capsys):
    port, dash = free_port(), free_port()
    assert main(["head", "start", "--port", str(port), "--dashboard-port", str(dash), "--num-cpus", "1"]) == 0
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
    finally:
        assert main(["head", "stop"]) == 0
    out, err = capsys.readouterr()
    assert "Ray head stopped in" in out and "Traceback" not in out + err
    assert head.group(pid) == []
    assert not (state_home / "head.json").exists()
    assert not head.address_file().exists() or head.address_file().read_text().strip() != f"127.0.0.1:{port}"
    assert main(["head", "stop"]) == 0 and "nothing to stop" in capsys.readouterr().out
    assert main(["head", "status"]) == 1


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
