"""Checkpoints without pickle: server state, device states and the run's history.

States are frozen dataclasses of tensors, arrays and scalars. They are encoded into plain
containers of tensors and scalars, written with ``torch.save`` and read back with
``torch.load(weights_only=True)``, which refuses arbitrary objects. Dataclasses are rebuilt only
from this project's own modules (an allow-list), so a checkpoint file cannot run code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: module prefixes whose dataclasses a checkpoint may name
ALLOWED_MODULES = ("lcfed.",)
FORMAT_VERSION = 2  # 2: the content as one byte tensor with its SHA-256 (1: the content itself)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or does not belong to this config."""


def encode(obj: Any) -> Any:
    """Plain containers + tensors that ``torch.load(weights_only=True)`` accepts."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    if isinstance(obj, np.ndarray):
        return {"__np__": torch.from_numpy(np.ascontiguousarray(obj).copy()), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {
            "__dc__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
        }
    if isinstance(obj, dict):
        return {"__map__": [[encode(k), encode(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _dataclass(path: str) -> type:
    module, _, qualname = path.partition(":")
    if not module.startswith(ALLOWED_MODULES):
        raise CheckpointError(f"checkpoint names {path!r}, outside the allowed modules {ALLOWED_MODULES}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise CheckpointError(f"checkpoint names {path!r}, which is not a dataclass")
    return obj


def decode(obj: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if "__np__" in obj:
            return obj["__np__"].numpy().astype(obj["dtype"], copy=False)
        if "__dc__" in obj:
            cls = _dataclass(obj["__dc__"])
            return cls(**{k: decode(v) for k, v in obj["fields"].items()})
        if "__map__" in obj:
            return {decode(k): decode(v) for k, v in obj["__map__"]}
        if "__tuple__" in obj:
            return tuple(decode(v) for v in obj["__tuple__"])
        raise CheckpointError(f"unknown checkpoint node with keys {sorted(obj)}")
    return obj


@dataclass
class Snapshot:
    """Everything needed to continue a run bit-identically from ``next_round``."""

    next_round: int
    server_state: Any
    device_states: dict[int, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    config_digest: str = ""
    tracking: dict[str, str] = field(default_factory=dict)
    trained: tuple[int, ...] = ()  # devices that have trained at least once (scored in acc_*)


def save(path: str | Path, snap: Snapshot) -> Path:
    """Write atomically (temp file + rename), so a crash mid-write keeps the previous checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {
        "next_round": snap.next_round,
        "server_state": encode(snap.server_state),
        "device_states": encode(snap.device_states),
        "history": encode(snap.history),
        "config_digest": snap.config_digest,
        "tracking": encode(snap.tracking),
        "trained": list(snap.trained),
    }
    buf = io.BytesIO()
    torch.save(content, buf)
    body = buf.getvalue()
    # a checksum over the content: a damaged file is refused instead of resuming with other numbers
    payload = {"format": FORMAT_VERSION, "sha256": hashlib.sha256(body).hexdigest(),
               "body": torch.frombuffer(bytearray(body), dtype=torch.uint8)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: str | Path) -> Snapshot:
    """Read a checkpoint written by :func:`save` (tensors and plain data only)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path} (damaged or not a checkpoint): {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") not in (1, FORMAT_VERSION):
        fmt = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"checkpoint {path} has format {fmt!r}, expected {FORMAT_VERSION}")
    if raw["format"] == FORMAT_VERSION:
        body = raw.get("body")
        if not isinstance(body, torch.Tensor) or body.dtype != torch.uint8:
            raise CheckpointError(f"checkpoint {path} is damaged: no content")
        data = body.numpy().tobytes()
        if hashlib.sha256(data).hexdigest() != raw.get("sha256"):
            raise CheckpointError(f"checkpoint {path} is damaged: its content does not match its SHA-256")
        try:
            raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    try:
        return Snapshot(
            next_round=int(raw["next_round"]),
            server_state=decode(raw["server_state"]),
            device_states=decode(raw["device_states"]),
            history=decode(raw["history"]),
            config_digest=str(raw["config_digest"]),
            tracking=decode(raw["tracking"]),
            trained=tuple(int(d) for d in raw.get("trained", ())),
        )
    except CheckpointError:
        raise
    except Exception as exc:  # well-formed file, wrong structure (e.g. crafted by hand)
        raise CheckpointError(f"checkpoint {path} has an unexpected structure: {type(exc).__name__}: {exc}") from None
