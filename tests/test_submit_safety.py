"""What `lcfed submit` ships and to whom it sends the Ray token; the token file of a private Ray.

No cluster: the dry run and Ray's own packaging (the zip a submit would upload) run on a seeded
directory; the token checks run against closed ports, an unresolvable host and a recording HTTP
server; one private Ray is started with a temporary HOME to check the file Ray reads.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.raycluster import ROOT, free_port
from tune_jobs import jobs
from tune_jobs.cli import main

SECRETS_AND_STATE = [
    ".env", ".env.local", "sub/.env", "sub/.env.production", "id_rsa", "deploy/id_ed25519", "key.pem",
    "certs/client.p12", ".ray/auth_token", "auth_token", ".aws/credentials", ".ssh/config", ".netrc",
    ".git-credentials", "credentials.json", "keys/my-project-credentials.json", "service-account-prod.json",
    ".kube/config", ".boto", "aws.env", "deploy/prod.env", "secrets.yaml", "conf/secrets.json", "db.secret",
    ".docker/config.json", ".pypirc", "infra/terraform.tfstate", "infra/prod.tfvars", "checkpoints/x.pt", "runs/model.ckpt", "unlogged-metrics-abc.json",
    "data/train-images-idx3-ubyte", "mnist/t10k-labels-idx1-ubyte.gz", "cache/arrays.npz",
    ".venv/bin/python", "venv/pyvenv.cfg", ".tox/log", "mlruns/0/meta.yaml", "results.db",
    "pkg/__pycache__/mod.cpython-311.pyc", "scratch/notes.txt",  # the last: .gitignore'd
    "notes.txt",  # the test's own --exclude
]
CODE = [
    ".env.example",  # re-admitted by --include
    ".gitignore", "README.md", "main.py", "configs/a.yaml", "pkg/__init__.py",
    "pkg/data/loader.py",  # /data is excluded at the root only: a package named data is code
    "sub/run.sh",
]
TOKEN = "f" * 64


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wd = tmp_path / "wd"
    for rel in SECRETS_AND_STATE + CODE:
        (wd / rel).parent.mkdir(parents=True, exist_ok=True)
        (wd / rel).write_text(f"content of {rel}\n")
    (wd / ".gitignore").write_text("scratch/\n")
    monkeypatch.delenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", raising=False)
    return wd


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This client holds a token (as with ~/.ray/auth_token) and no address comes from the env."""
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    for name in ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def _listed(out: str) -> set[str]:
    """The paths of the dry run's file lines ("  12.0 KiB  path")."""
    return {m.group(1) for m in re.finditer(r"^ *[\d.]+ (?:B|KiB|MiB|GiB)  (.+)$", out, re.M)}


# ---- what is shipped ------------------------------------------------------------------------------


def test_dry_run_lists_code_only_and_contacts_no_cluster(workdir, token_env, capsys):
    closed = f"http://127.0.0.1:{free_port()}"
    with socket.socket() as probe:  # the port stays closed: nothing answers, nothing is asked
        assert probe.connect_ex(("127.0.0.1", int(closed.rsplit(":", 1)[1]))) != 0
    code = main(["submit", "--dry-run", "--address", closed, "--working-dir", str(workdir),
                 "--exclude", "notes.txt", "--include", ".env.example", "--", "lcfed", "run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert _listed(out) == set(CODE), out
    assert "cannot reach" not in err and closed not in out + err
    assert f"{len(CODE)} file(s)" in out and "would run: lcfed run" in out
    left_out = set(re.findall(r"^  - (.+)$", out, re.M))
    assert {".env", ".env.local", "sub/.env", "id_rsa", "key.pem", ".ray/", "auth_token", "checkpoints/", "data/",
            "unlogged-metrics-abc.json", ".venv/", "mlruns/"} <= left_out, out
    assert f"{len(left_out)} path(s) left out by the secret/state defaults" in out
    assert "left out by --exclude: notes.txt" in out


def test_ray_packages_exactly_what_the_dry_run_lists(workdir, tmp_path):
    """The real component: Ray's packaging of the working dir with the runtime_env's excludes."""
    from ray._private.runtime_env.packaging import create_package

    env = jobs.build_runtime_env(workdir, {}, ["notes.txt"], [".env.example"])
    target = tmp_path / "pkg.zip"
    create_package(env["working_dir"], target, include_gitignore=True, excludes=env["excludes"])
    with zipfile.ZipFile(target) as zf:
        names = set(zf.namelist())
    assert names == set(CODE), sorted(names)
    assert names == {path for path, _ in jobs.plan_upload(env).files}


def test_a_link_to_a_file_outside_the_working_dir_is_refused(workdir, tmp_path, capsys):
    secret = tmp_path / "elsewhere" / "credentials"
    secret.parent.mkdir()
    secret.write_text("aws_secret_access_key = x\n")
    (workdir / "creds").symlink_to(secret)
    (workdir / "main_link.py").symlink_to(workdir / "main.py")  # a link inside the directory is fine
    env = jobs.build_runtime_env(workdir, {}, ["notes.txt"], [".env.example"])
    from ray._private.runtime_env.packaging import create_package

    target = tmp_path / "pkg.zip"  # Ray itself would ship the link's target
    create_package(env["working_dir"], target, include_gitignore=True, excludes=env["excludes"])
    with zipfile.ZipFile(target) as zf:
        assert zf.read("creds") == secret.read_bytes()
    assert jobs.plan_upload(env).outside == ["creds"]
    closed = f"http://127.0.0.1:{free_port()}"
    for extra in (["--dry-run"], []):
        code = main(["submit", *extra, "--address", closed, "--working-dir", str(workdir), "--", "lcfed", "run"])
        err = capsys.readouterr().err
        assert code == 2 and "--working-dir" in err and "creds" in err and "cannot reach" not in err, err
    code = main(["submit", "--dry-run", "--address", closed, "--working-dir", str(workdir), "--exclude", "creds",
                 "--", "lcfed", "run"])
    assert code == 0 and "creds" not in _listed(capsys.readouterr().out)


def test_include_cannot_be_a_negation():
    with pytest.raises(jobs.JobsError, match="--include"):
        jobs.build_runtime_env(ROOT, {}, includes=["!x"])


# ---- where the token goes -------------------------------------------------------------------------

COMMANDS = [["job", "list", "ADDRESS"], ["job", "status", "j1", "ADDRESS"], ["job", "logs", "j1", "ADDRESS"],
            ["job", "stop", "j1", "ADDRESS"], ["submit", "ADDRESS", "--working-dir", str(ROOT), "--", "lcfed", "run"]]


@pytest.mark.parametrize("command", COMMANDS, ids=["job list", "job status", "job logs", "job stop", "submit"])
def test_token_is_not_sent_over_http_to_another_host(command, token_env, capsys):
    address = "http://10.255.255.1:8265"  # unroutable: a connection attempt would take seconds
    argv = [a for arg in command for a in (["--address", address] if arg == "ADDRESS" else [arg])]
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--address {address}" in err and "--allow-insecure-token" in err and "https" in err
    assert "ray dashboard cluster.yaml" in err and "127.0.0.1:8265" in err


@pytest.mark.parametrize("url", ["https://127.0.0.1:{port}", "http://127.0.0.1:{port}", "http://127.0.0.2:{port}",
                                 "http://localhost:{port}"])
def test_loopback_or_https_is_not_refused(url, token_env, capsys):
    address = url.format(port=free_port())
    assert main(["job", "list", "--address", address]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Ray job server" in err and "refusing" not in err


def test_no_token_or_allow_insecure_proceeds(token_env, monkeypatch, capsys):
    address = "http://lcfed-test.invalid:8265"  # never resolves (RFC 6761): fails fast at the reachability check
    assert main(["job", "list", "--address", address, "--allow-insecure-token"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Ray job server" in err and "refusing" not in err
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/nonexistent/token")  # and no ~/.ray/auth_token is read
    monkeypatch.setenv("HOME", "/nonexistent")
    assert main(["job", "list", "--address", address]) == 2
    assert "cannot reach the Ray job server" in capsys.readouterr().err


def _own_ip() -> str | None:
    """This machine's non-loopback IPv4 address (UDP connect sends nothing), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.1", 9))
        except OSError:
            return None
        ip = str(s.getsockname()[0])
    return None if jobs.is_loopback(ip) or ip == "0.0.0.0" else ip


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server on this machine's non-loopback address recording each request's headers."""
    ip = _own_ip()
    if ip is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(dict(self.headers))
            body = json.dumps({"error": "not a Ray job server"}).encode()
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((ip, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{ip}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_refusal_happens_before_any_connection_and_the_flag_sends_the_token(recorder, token_env, capsys):
    address, seen = recorder
    assert main(["job", "list", "--address", address]) == 2
    assert "--allow-insecure-token" in capsys.readouterr().err
    assert seen == []  # the server is up (the next call reaches it): this one never connected
    main(["job", "list", "--address", address, "--allow-insecure-token"])
    capsys.readouterr()
    assert seen and all(h.get("Authorization") == f"Bearer {TOKEN}" for h in seen)


# ---- the token file of a private Ray --------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    return h


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_token_file_is_created_owner_only(home):
    from actors.connect import secure_token_file

    path = secure_token_file()
    assert path == home / ".ray" / "auth_token"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    token = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)  # Ray's own format (secrets.token_hex(32))
    assert secure_token_file() == path and path.read_text() == token  # an existing token is kept


def test_open_token_file_is_tightened_and_kept(home, log_records):
    from actors.connect import secure_token_file

    (home / ".ray").mkdir(mode=0o755)
    path = home / ".ray" / "auth_token"
    path.write_text("abc")
    path.chmod(0o644)  # what Ray 2.60 leaves with umask 022
    secure_token_file()
    assert _mode(path) == 0o600 and path.read_text() == "abc"
    assert any("0600" in r.getMessage() and str(path) in r.getMessage() for r in log_records)


def test_no_token_file_when_ray_would_not_read_one(home, tmp_path, monkeypatch):
    from actors.connect import secure_token_file

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert secure_token_file() is None
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    assert secure_token_file() is None
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    custom = tmp_path / "custom_token"
    custom.write_text("abc")
    custom.chmod(0o640)  # a path the user chose: its mode is theirs
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(custom))
    assert secure_token_file() is None
    assert _mode(custom) == 0o640 and not (home / ".ray").exists()


@pytest.mark.ray
def test_private_ray_reads_an_owner_only_token(tmp_path):
    """A real private start (Ray's default token mode) with an empty HOME: Ray uses our 0600 file."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    code = """
import json, os, ray
from ray._raylet import AuthenticationTokenLoader
from lcfed.config import EngineConfig
from actors.connect import ensure_ray
assert ensure_ray(EngineConfig(kind="ray", num_cpus=1, object_store_mb=80))
try:
    print("RESULT " + json.dumps(AuthenticationTokenLoader.instance().get_raw_token()))
finally:
    ray.shutdown()
"""
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    path = home / ".ray" / "auth_token"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert json.loads(lines[0][len("RESULT "):]) == path.read_text()
