"""Reaching a Ray job server: its address, the auth token and when it may be sent, the client."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
EXIT_USAGE = 2
#: env vars through which Ray's own client would override an explicit address
_ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")

UNREACHABLE_FIX = (
    "Start a cluster first: on this machine `lcfed head start` (job server on http://127.0.0.1:8265); "
    "on AWS `ray up cluster.yaml`, then keep `ray dashboard cluster.yaml` running to port-forward "
    "8265 to 127.0.0.1. Or point at the right job server with --address http://HOST:PORT or RAY_ADDRESS."
)



class JobsError(Exception):
    """A job command cannot proceed (unreachable cluster, bad token, unknown job); exit code 2."""


def resolve_address(address: str | None = None) -> str:
    """The job server URL: ``--address``, else ``$RAY_API_SERVER_ADDRESS``/``$RAY_ADDRESS``, else the default.

    A bare ``host:port`` gets ``http://``; ``auto`` (meaningful to ``ray.init`` only) is ignored.
    """
    candidates = [address, *(os.environ.get(name) for name in _ADDRESS_ENV)]
    value = next((c.strip() for c in candidates if c and c.strip() and c.strip() != "auto"), DEFAULT_ADDRESS)
    if "://" not in value:
        value = f"http://{value}"
    parsed = urlparse(value)
    try:
        port_ok = parsed.port is None or 0 < parsed.port < 65536
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise JobsError(f"--address {value}: must be the job server's http(s)://HOST:PORT "
                        f"(default {DEFAULT_ADDRESS}; also read from $RAY_ADDRESS)")
    return value.rstrip("/")


def read_token() -> str | None:
    """The Ray auth token this client should present, or None (auth disabled / no token).

    Same sources and order as Ray: ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``. ``RAY_AUTH_MODE=disabled`` sends none.
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if token := os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return token
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), "~/.ray/auth_token"):
        if path and (p := Path(path).expanduser()).is_file():
            token = p.read_text().strip()
            if token:
                return token
    return None


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (also as ``::ffff:127.x``): traffic that never leaves this machine."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def check_token_transport(url: str, allow_insecure: bool = False) -> None:
    """Refuse to send the auth token in clear text to another machine (before any connection).

    Over plain http anyone on the path reads the bearer token and owns the cluster; loopback (an SSH
    port-forward) and https are fine, and so is having no token to send.
    """
    parsed = urlparse(url)
    if parsed.scheme == "https" or allow_insecure or is_loopback(parsed.hostname or "") or not read_token():
        return
    raise JobsError(
        f"--address {url}: refusing to send the Ray auth token over plain http to a non-loopback host; "
        "use an https:// address, an SSH port-forward (`ray dashboard cluster.yaml`, then --address "
        "http://127.0.0.1:8265), or pass --allow-insecure-token to send it anyway"
    )


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer <token>`` when a token is available (see :func:`read_token`)."""
    token = read_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the address and the fix, if nothing listens at the job server's port."""
    parsed = urlparse(address)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise JobsError(f"cannot reach the Ray job server at {address} ({reason}).\n{UNREACHABLE_FIX}") from None


@contextlib.contextmanager
def _explicit_address() -> Iterator[None]:
    """Hide the address env vars while the client is built: Ray lets them override ``address``."""
    saved = {name: os.environ.pop(name) for name in _ADDRESS_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def make_client(address: str | None = None, allow_insecure_token: bool = False) -> Any:
    """A connected :class:`ray.job_submission.JobSubmissionClient` for the resolved address."""
    url = resolve_address(address)
    check_token_transport(url, allow_insecure_token)
    check_reachable(url)
    from ray.exceptions import AuthenticationError  # Ray when a job command runs, not with the parser
    from ray.job_submission import JobSubmissionClient  # (the same)

    try:
        with _explicit_address():
            return JobSubmissionClient(url, headers=auth_headers())
    except AuthenticationError as exc:
        raise JobsError(f"the Ray job server at {url} rejected the auth token: {_auth_fix()}\n{exc}") from None
    except ConnectionError as exc:
        raise JobsError(f"cannot reach the Ray job server at {url} ({exc}).\n{UNREACHABLE_FIX}") from None


def _auth_fix() -> str:
    where = "$RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else "~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH)"
    return (
        f"the token read from {where} must be the cluster's own: run `ray get-auth-token` on the head node "
        "(cluster.yaml mounts your local ~/.ray/auth_token there, so both match)"
    )
