"""Checkpoints without pickle: server state, device states and the run's history.

A checkpoint is a main file (``latest.pt``: server state, history, which devices trained) and its
device states in part files beside it, written one part at a time as the pool hands them over, so
that no process holds every device's state at once; loading reads the parts only when the states are
used (:class:`StateParts`). The main file names its parts with their SHA-256 and is replaced last,
atomically: a crash mid-write keeps the previous checkpoint whole.

States are frozen dataclasses of tensors, arrays and scalars. They are encoded into plain
containers of tensors and scalars, written with ``torch.save`` and read back with
``torch.load(weights_only=True)``, which refuses arbitrary objects. Dataclasses are rebuilt only
from this project's own modules and, for a run of a plugin method, from that method's module (an
allow-list: :func:`load`'s ``allowed``), so a checkpoint file cannot run code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import secrets
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lcfed.run.checkpoint_codec import (
    CheckpointError,
    allowed_modules,
    decode,
    decode_allowed,
    encode,
    reason,
    safe_load,
)

#: 3: device states in part files; 2: the content as one byte tensor with its SHA-256; 1: the content itself
FORMAT_VERSION = 3


#: device states per part file when a snapshot's states are written from a mapping
PART_DEVICES = 256


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Part:
    """One part file of a checkpoint's device states: its name (beside the main file), SHA-256 and devices."""

    file: str
    sha256: str
    devices: tuple[int, ...]


class StateParts(Mapping[int, Any]):
    """A checkpoint's device states, read from its part files when used (the last part read is kept).

    :meth:`chunks` gives them a part at a time, which is how engines restore them without holding
    all at once. ``allowed``: the modules beyond lcfed's whose dataclasses they may name (:func:`load`).
    """

    def __init__(self, folder: Path, parts: Iterable[Part], allowed: Iterable[str] = ()) -> None:
        self.folder = folder
        self.parts = tuple(parts)
        self.allowed = allowed_modules(allowed)
        self._where = {d: i for i, p in enumerate(self.parts) for d in p.devices}
        self._cached: tuple[int, dict[int, Any]] | None = None

    def _read(self, i: int) -> dict[int, Any]:
        if self._cached is not None and self._cached[0] == i:
            return self._cached[1]
        part = self.parts[i]
        path = self.folder / part.file
        try:
            raw = safe_load(path)
            states = decode_allowed(raw["states"], self.allowed)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"cannot read checkpoint part {path}: {reason(exc)}") from None
        self._cached = (i, states)
        return states

    def __getitem__(self, device: int) -> Any:
        return self._read(self._where[device])[device]

    def __iter__(self) -> Iterator[int]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def chunks(self) -> Iterator[dict[int, Any]]:
        for i in range(len(self.parts)):
            yield self._read(i)
        self._cached = None


def state_chunks(states: Mapping[int, Any]) -> Iterator[dict[int, Any]]:
    """``states`` a part at a time: a checkpoint's own parts, or a plain mapping in parts of
    :data:`PART_DEVICES` devices."""
    if isinstance(states, StateParts):
        yield from states.chunks()
        return
    ids = list(states)
    for start in range(0, len(ids), PART_DEVICES):
        yield {d: states[d] for d in ids[start : start + PART_DEVICES]}


#: the main file's name in ``checkpoint.dir``
MAIN_FILE = "latest.pt"


def path(directory: str | Path | None) -> Path | None:
    """The main file of the checkpoint in ``directory`` (``checkpoint.dir``); None without one."""
    return Path(directory).expanduser() / MAIN_FILE if directory else None


def due(rnd: int, every: int, rounds: int) -> bool:
    """Whether round ``rnd`` (from 0) ends with a checkpoint: every ``every`` rounds (``checkpoint.every``) and
    after the last of ``rounds``."""
    return (rnd + 1) % every == 0 or rnd == rounds - 1


@dataclass
class Snapshot:
    """Everything needed to continue a run bit-identically from ``next_round``."""

    next_round: int
    server_state: Any
    device_states: Mapping[int, Any]  # a StateParts when loaded: read part by part when used
    history: list[dict[str, float]] = field(default_factory=list)
    config_digest: str = ""
    tracking: dict[str, str] = field(default_factory=dict)
    trained: tuple[int, ...] = ()  # devices that have trained at least once (scored in acc_*)
    pending: Any = None  # an asynchronous server's queue (lcfed.devices.buffered.Pending), else None


def _write_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _part_prefix(path: Path) -> str:
    return f"{path.stem}.states-"


def save(path: str | Path, snap: Snapshot, parts: Iterable[Mapping[int, Any]] | None = None) -> Path:
    """:func:`write`, returning the main file's path."""
    write(path, snap, parts)
    return Path(path)


def write(path: str | Path, snap: Snapshot, parts: Iterable[Mapping[int, Any]] | None = None,
          allowed: Iterable[str] = ()) -> Snapshot:
    """Write ``snap``, its device states from ``parts`` (mappings of device -> state, written and
    dropped one at a time) or else from ``snap.device_states``; return ``snap`` with its device states
    read back from the part files (:class:`StateParts`) when used, with the modules ``allowed`` (as
    :func:`load` takes them: the run's method's, whose states the parts may hold).

    Parts are new files of their own; the main file is replaced last (temp file + rename) and the
    previous checkpoint's parts are removed after it, so a crash mid-write keeps the previous checkpoint.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    generation = secrets.token_hex(4)
    written: list[Part] = []
    try:
        for i, chunk in enumerate(parts if parts is not None else state_chunks(snap.device_states)):
            if not chunk:
                continue
            part = path.parent / f"{_part_prefix(path)}{generation}-{i}.pt"
            _write_atomic(part, {"format": FORMAT_VERSION, "states": encode(dict(chunk))})
            written.append(Part(part.name, _sha256_of(part), tuple(int(d) for d in chunk)))
        content = {
            "next_round": snap.next_round,
            "server_state": encode(snap.server_state),
            "device_parts": [{"file": p.file, "sha256": p.sha256, "devices": list(p.devices)} for p in written],
            "history": encode(snap.history),
            "config_digest": snap.config_digest,
            "tracking": encode(snap.tracking),
            "trained": list(snap.trained),
            "pending": encode(snap.pending),
        }
        buf = io.BytesIO()
        torch.save(content, buf)
        body = buf.getvalue()
        # a checksum over the content: a damaged file is refused instead of resuming with other numbers
        _write_atomic(path, {"format": FORMAT_VERSION, "sha256": hashlib.sha256(body).hexdigest(),
                             "body": torch.frombuffer(bytearray(body), dtype=torch.uint8)})
    except BaseException:
        for p in written:
            (path.parent / p.file).unlink(missing_ok=True)
        raise
    keep = {p.file for p in written}
    for old in path.parent.glob(f"{_part_prefix(path)}*.pt"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    for stale in path.parent.glob(".ckpt-*.tmp"):  # left by a write killed before its rename (SIGKILL, a crash)
        stale.unlink(missing_ok=True)
    return dataclasses.replace(snap, device_states=StateParts(path.parent, written, allowed))


def _parts(path: Path, raw: dict[str, Any], allowed: tuple[str, ...]) -> StateParts:
    """The main file's parts, each checked (present, and its SHA-256) before any is read."""
    parts = [Part(str(p["file"]), str(p["sha256"]), tuple(int(d) for d in p["devices"])) for p in raw["device_parts"]]
    for p in parts:
        if Path(p.file).name != p.file or not p.file.startswith(_part_prefix(path)):
            raise CheckpointError(f"checkpoint {path} names a part {p.file!r} outside its folder")
        file = path.parent / p.file
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is damaged: its part {file} is missing")
        if _sha256_of(file) != p.sha256:
            raise CheckpointError(f"checkpoint {path} is damaged: its part {file} does not match its SHA-256")
    return StateParts(path.parent, parts, allowed)


def load(path: str | Path, allowed: Iterable[str] = ()) -> Snapshot:
    """Read a checkpoint written by :func:`save` (tensors and plain data only).

    Its dataclasses are rebuilt from lcfed's modules and from ``allowed``: the module of the run's
    method when it is a plugin (:func:`lcfed.run.loop.checkpoint_modules`), which keeps its own state
    classes there. Each allowed name allows its submodules too, since a plugin package may define its
    states beside its strategy (``ditto.states`` for ``ditto:Ditto``); nothing above or beside it (not
    the parent package, not ``dittox``), and a class must be defined in an allowed module, not merely
    reachable from one. That is code the run imports anyway to run the method; any other class named in
    the file is refused before anything is imported. A state class whose module cannot be imported or
    lacks it (the plugin renamed or not installed) is a :class:`CheckpointError` naming both.
    """
    path = Path(path)
    extra = allowed_modules(allowed)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        raw = safe_load(path)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path} (damaged or not a checkpoint): {reason(exc)}") from None
    if not isinstance(raw, dict) or raw.get("format") not in (1, 2, FORMAT_VERSION):
        fmt = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"checkpoint {path} has format {fmt!r}, expected {FORMAT_VERSION}")
    if raw["format"] >= 2:
        body = raw.get("body")
        if not isinstance(body, torch.Tensor) or body.dtype != torch.uint8:
            raise CheckpointError(f"checkpoint {path} is damaged: no content")
        data = body.numpy().tobytes()
        if hashlib.sha256(data).hexdigest() != raw.get("sha256"):
            raise CheckpointError(f"checkpoint {path} is damaged: its content does not match its SHA-256")
        try:
            raw = safe_load(io.BytesIO(data))
        except Exception as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {reason(exc)}") from None
    try:
        return Snapshot(
            next_round=int(raw["next_round"]),
            server_state=decode_allowed(raw["server_state"], extra),
            device_states=_parts(path, raw, extra) if "device_parts" in raw else decode_allowed(raw["device_states"], extra),
            history=decode(raw["history"]),
            config_digest=str(raw["config_digest"]),
            tracking=decode(raw["tracking"]),
            trained=tuple(int(d) for d in raw.get("trained", ())),
            pending=decode_allowed(raw["pending"], extra) if "pending" in raw else None,
        )
    except CheckpointError:
        raise
    except Exception as exc:  # well-formed file, wrong structure (e.g. crafted by hand)
        raise CheckpointError(f"checkpoint {path} has an unexpected structure: {reason(exc)}") from None
