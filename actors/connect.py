"""How lcfed reaches Ray: a private local Ray, or a deliberate attach to an existing cluster.

``engine.address: null`` starts a private Ray (``ray.init(address="local")``): plain ``ray.init()``
would follow Ray's address file (``ray_current_cluster``, written by ``ray start --head``) onto
whatever cluster runs on the machine, then reject our ``num_cpus``. ``auto``, ``host:port`` or
``$RAY_ADDRESS`` (set by Ray inside a submitted job) attach on purpose, after a probe that fails
within seconds instead of Ray's minutes of retries.

Token auth (Ray 2.60): the C++ ``RayConfig`` reads ``RAY_AUTH_MODE`` when ``ray`` is imported, and
``ray.init`` turns token mode on by itself only for a local start or ``address=None/"auto"``, so an
explicit address to a token cluster spends ~20 s on ``InvalidAuthToken`` and fails. We ask the GCS
whether it wants a token, check Ray's own token (``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``,
``~/.ray/auth_token``) against it, and switch this process to token mode the way Ray does.

A private start in token mode makes Ray 2.60 generate ``~/.ray/auth_token`` if none exists, with
the umask's mode (0644 usually): any user of the machine could read it and drive this Ray. We
create it first, 0600 in a 0700 ``~/.ray`` (:func:`secure_token_file`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lcfed import numerics
from lcfed.logs import ray_init_options

if TYPE_CHECKING:
    from lcfed.config import EngineConfig

_log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
PROBE_TIMEOUT_S = 5.0
TOKEN_SOURCES = "$RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
UNREACHABLE_FIX = (
    "engine.address must be a running cluster's GCS address (`ray start --head --port 6379` prints it; "
    "not the dashboard URL), or `auto` for the cluster `ray start` left on this machine; "
    "leave engine.address unset (and $RAY_ADDRESS empty) for a private local Ray."
)


class ClusterError(RuntimeError):
    """Ray cannot be reached or used as configured; the message says what to do (CLI: exit 2)."""


def ensure_ray(engine: EngineConfig) -> bool:
    """Connect to (or start) Ray; True only if this call started a private Ray, to be shut down.

    Attaching returns False: the cluster is not ours (it may also grow), and the connection lasts
    until the process exits or the caller's ``ray.shutdown()``.
    """
    import ray  # after the auth settings are in the environment (module docstring)

    if ray.is_initialized():
        return False
    address = (engine.address or os.environ.get("RAY_ADDRESS") or "").strip()
    if not address:
        numerics.activate(engine.numerics)  # the private Ray's workers inherit this process's kernel settings
        start_local(engine)
        return True
    attach(address)
    return False


def start_local(engine: EngineConfig) -> None:
    """A private Ray whose processes listen on 127.0.0.1 only."""
    import ray  # after the auth settings are in the environment (module docstring)

    secure_token_file()
    with _loopback_node_ip():
        ray.init(
            address="local",
            num_cpus=engine.num_cpus or os.cpu_count(),
            include_dashboard=False,
            object_store_memory=engine.object_store_mb * 1024 * 1024,
            _node_ip_address=LOOPBACK,
            **ray_init_options(),
        )


def secure_token_file() -> Path | None:
    """Before a private start: the token file Ray would create, created owner-only; returns its path.

    Only in token mode (``RAY_AUTH_MODE`` unset, Ray 2.60's default for a local start, or ``token``)
    and without ``$RAY_AUTH_TOKEN``. A missing ``$RAY_AUTH_TOKEN_PATH`` file is left to Ray's error
    (that path names a token someone should provide, not a new one); Ray's default
    ``~/.ray/auth_token`` is created with a token in Ray's format (64 hex digits), or tightened to
    0600 if group/others could read or write it. A file the user placed elsewhere keeps its mode.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if (mode is not None and mode.lower() != "token") or os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return None
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    path = Path.home() / ".ray" / "auth_token"
    try:
        with contextlib.suppress(FileExistsError):
            path.parent.mkdir(mode=0o700)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        _tighten(path)
        return path
    except OSError:
        return None  # unwritable home: Ray reports it in its own words
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # as ray._private.authentication's generator, no newline
    return path


def _tighten(path: Path) -> None:
    """0600 for a token file of ours that group/others can access (Ray 2.60 writes 0644)."""
    try:
        st = path.stat()
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and st.st_uid == os.getuid():
            path.chmod(0o600)
            _log.warning("lcfed: %s was open to other users (mode %o); now 0600", path, stat.S_IMODE(st.st_mode))
    except OSError:
        pass  # not ours to fix; Ray reads it as it is


@contextlib.contextmanager
def _loopback_node_ip() -> Iterator[None]:
    """Keep a loopback ``_node_ip_address``: on Linux Ray swaps it for the machine's IP unless
    ``ENABLE_RAY_CLUSTER`` is off (its macOS/Windows default). With node IP 127.0.0.1, GCS, raylet,
    agents and workers all bind loopback. Only this call is affected; the env knob would leak."""
    from ray._private import ray_constants  # (the same)

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def attach(address: str) -> None:
    """``ray.init`` onto an existing cluster (``auto``, ``host:port``, ``ray://``) or ClusterError."""
    import ray  # after the auth settings are in the environment (module docstring)

    if address.startswith("ray://"):  # Ray Client: its own protocol and server
        ray.init(address=address, **ray_init_options())
        return
    with _loopback_node_ip() if _loopback_only(address) else contextlib.nullcontext():
        gcs = resolve_gcs(address)
        _probe_tcp(gcs, address)
        _enable_auth_if_required(gcs, address)
        try:
            ray.init(address=gcs, **ray_init_options())
        except ConnectionError as exc:
            raise ClusterError(f"cannot connect to the Ray cluster at {_named(gcs, address)}: {exc}.\n"
                               f"{UNREACHABLE_FIX}") from exc


def _loopback_only(address: str) -> bool:
    """A loopback address (or ``auto`` finding one: Ray's address file, ``$RAY_ADDRESS``) whose cluster listens on
    loopback only (``lcfed head start``'s): Ray swaps the host for the machine's IP, where nothing listens, so
    resolving and joining its node stay on loopback. A cluster on the machine's IP that also answers on loopback
    is attached as Ray would."""
    host = address.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "auto"):
        return False
    try:
        gcs = resolve_gcs(address)
        if host == "auto":  # what the discovery found, before Ray's swap
            with _loopback_node_ip():
                host = resolve_gcs(address).rsplit(":", 1)[0]
    except ClusterError:
        return False
    loopback = ("127.0.0.1", "localhost")
    return host in loopback and gcs.rsplit(":", 1)[0] not in loopback and not answers(gcs, timeout=1.0)


def answers(address: str, timeout: float) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` (``[v6]:port`` too) within ``timeout``."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def resolve_gcs(address: str) -> str:
    """The GCS ``host:port``: ``auto`` is Ray's discovery ($RAY_ADDRESS, address file, a running GCS)."""
    from ray._private import services  # (the same)

    try:
        gcs = services.canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as exc:
        raise ClusterError(f"Ray address {address!r}: {exc}\n{UNREACHABLE_FIX}") from None
    if gcs is None:  # "local"
        raise ClusterError(f"Ray address {address!r} is not a cluster address.\n{UNREACHABLE_FIX}")
    return str(gcs)


def _named(gcs: str, address: str) -> str:
    return gcs if gcs == address else f"{address} (GCS {gcs})"


def _probe_tcp(gcs: str, address: str) -> None:
    """Fail in seconds when nothing listens: Ray itself retries for minutes."""
    from ray._common.network_utils import parse_address  # (the same)

    host, port = parse_address(gcs)
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ClusterError(f"cannot reach a Ray cluster at {_named(gcs, address)} ({reason}).\n{UNREACHABLE_FIX}") from None


def _enable_auth_if_required(gcs: str, address: str) -> None:
    """Token mode on in this process when the GCS asks for a token and Ray's token passes."""
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, Config, get_authentication_mode  # type: ignore[attr-defined]  # (the same; Ray's _raylet.pyi omits its auth API)
    from ray.exceptions import AuthenticationError  # (the same)

    if not _gcs_refuses(gcs, address, None):
        return  # no auth on this cluster
    where = _named(gcs, address)
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        raise ClusterError(f"the Ray cluster at {where} requires token auth: unset RAY_AUTH_MODE=disabled.")
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()
    try:
        token = loader.get_raw_token(ignore_auth_mode=True) if loader.has_token(ignore_auth_mode=True) else ""
    except AuthenticationError as exc:  # e.g. $RAY_AUTH_TOKEN_PATH names no file
        raise ClusterError(f"the Ray cluster at {where} requires token auth: {exc.message}") from None
    if not token:
        raise ClusterError(
            f"the Ray cluster at {where} requires token auth and no token was found in {TOKEN_SOURCES}: "
            "copy the cluster's token there (`ray get-auth-token` on the head node)."
        )
    if _gcs_refuses(gcs, address, token):
        raise ClusterError(
            f"the Ray cluster at {where} rejected the auth token from {TOKEN_SOURCES}: it must be the cluster's "
            "own (`ray get-auth-token` on the head node)."
        )
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        os.environ["RAY_AUTH_MODE"] = "token"  # inherited by our child processes too
        Config.initialize("")  # re-read RAY_AUTH_MODE into the C++ config (as Ray's _enable_token_auth does)
        loader.reset_cache()


def _gcs_refuses(gcs: str, address: str, token: str | None) -> bool:
    """Whether the GCS answers a cheap call with UNAUTHENTICATED, given this token (or none).

    Any other failure (not a GCS at all, e.g. the dashboard port) is a ClusterError right here.
    """
    import grpc  # (the same: Ray's gRPC)
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc  # (the same)

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(gcs) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=PROBE_TIMEOUT_S, metadata=metadata)  # type: ignore[attr-defined]  # protobuf-generated: its messages exist only at run time
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                return True
            raise ClusterError(
                f"{_named(gcs, address)} does not answer as a Ray GCS ({err.code().name}: {err.details()}).\n{UNREACHABLE_FIX}"
            ) from None
    return False
