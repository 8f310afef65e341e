"""A checkpoint's content without pickle: states (frozen dataclasses of tensors, arrays and scalars) encoded into
plain containers of tensors and scalars that ``torch.load(weights_only=True)`` reads back, and decoded into
dataclasses only of the modules allowed: lcfed's own and, for a run of a plugin method, that method's
module. A class named by a module path from before lcfed's packages (``lcfed.similarity:Projector``) is found
where it lives now (:func:`lcfed._moved.current_module`), so a checkpoint written before the move still loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from lcfed._moved import current_module
from lcfed.errors import CheckpointError

#: module prefixes whose dataclasses a checkpoint may name (a run's method adds its own module: :func:`load`)
ALLOWED_MODULES = ("lcfed.",)


#: longest reason a :class:`CheckpointError` quotes from the error underneath
REASON_CHARS = 300


def safe_load(source: Any) -> Any:
    """``torch.load`` with the safe loader (tensors and plain data only), quietly: a damaged file either
    fails (a :class:`CheckpointError` says so) or loads what was written, so torch's warnings about an odd
    pickle protocol (a flipped byte in a header) would only add lines to that one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.load(source, map_location="cpu", weights_only=True)


def reason(exc: BaseException) -> str:
    """Why torch (or the decoder) could not read a file, in one line: the safe unpickler's own complaint
    without torch's multi-line advice around it (which suggests loading with ``weights_only=False``: unsafe,
    and no help for a damaged file), terminal escapes and line breaks dropped, at most :data:`REASON_CHARS`."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    elif text.startswith("Weights only load failed"):
        text = "the safe loader (weights_only) refuses its content"
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())
    if len(text) > REASON_CHARS:
        text = text[: REASON_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def encode(obj: Any) -> Any:
    """Plain containers + tensors that ``torch.load(weights_only=True)`` accepts."""
    # the exact types: a subclass (numpy's float64 and str_ are float's and str's) would be pickled as its class,
    # which the safe loader refuses: a checkpoint written that no resume could read
    if obj is None or type(obj) in (bool, int, float, str) or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray):
        # np.array, not np.ascontiguousarray: that makes a 0-d array 1-d, and it would come back of shape (1,)
        return {"__np__": torch.from_numpy(np.array(obj, order="C", copy=True)), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        # a numeric numpy scalar stays one of its dtype (a float32 that came back a Python float would compute in
        # float64 after a resume, and the run would no longer be bit-identical); others (str_, datetime64) as Python's
        if obj.dtype.kind in "biufc":
            try:
                return {"__np__": torch.from_numpy(np.array(obj)), "dtype": str(obj.dtype), "scalar": True}
            except TypeError:  # a dtype torch has no tensor of (longdouble): its Python value
                pass
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


def allowed_modules(allowed: Iterable[str]) -> tuple[str, ...]:
    """Extra allowed module names, as given (a trailing dot dropped; empty names and lcfed's, allowed anyway,
    left out)."""
    names = (m.rstrip(".") for m in allowed)
    return tuple(dict.fromkeys(m for m in names if m and not (m + ".").startswith(ALLOWED_MODULES)))


def _allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """Whether a checkpoint may rebuild a dataclass defined in ``module``: lcfed's (:data:`ALLOWED_MODULES`), or
    one of ``allowed`` or a submodule of it (``ditto`` allows ``ditto`` and ``ditto.states``, never ``dittox``
    or ``ditto``'s parent package)."""
    return module.startswith(ALLOWED_MODULES) or any(module == m or module.startswith(m + ".") for m in allowed)


def _dataclass(path: str, allowed: tuple[str, ...] = ()) -> type:
    module, _, qualname = path.partition(":")
    module = current_module(module, qualname)  # a class named by its module from before lcfed's packages
    if not _allowed(module, allowed):
        raise CheckpointError(f"checkpoint names {path!r}, outside the allowed modules {(*ALLOWED_MODULES, *allowed)}")
    needs = "resuming needs the code that wrote it"
    try:  # an allowed module only: lcfed's own, or the run's method's, whose code the run imports anyway
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # a plugin renamed or not installed here: one line, not the import's traceback
        why = reason(exc)
        raise CheckpointError(f"checkpoint names {path!r}, but its module {module!r} cannot be imported ({why}); "
                              f"{needs}") from None
    for part in qualname.split("."):
        if not part.isidentifier() or not hasattr(obj, part):
            raise CheckpointError(f"checkpoint names {path!r}, but module {module!r} has no class {qualname!r}; "
                                  f"{needs}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise CheckpointError(f"checkpoint names {path!r}, which is not a dataclass")
    if not _allowed(obj.__module__, allowed):  # reached through an allowed module, defined in another
        raise CheckpointError(f"checkpoint names {path!r}, a class of {obj.__module__!r}, outside the allowed "
                              f"modules {(*ALLOWED_MODULES, *allowed)}")
    return obj


def decode(obj: Any, allowed: Iterable[str] = ()) -> Any:
    """Inverse of :func:`encode`. Dataclasses are rebuilt from :data:`ALLOWED_MODULES` and from ``allowed``
    (module names, each with its submodules: :func:`load`); any other class is refused."""
    return decode_allowed(obj, allowed_modules(allowed))


def decode_allowed(obj: Any, allowed: tuple[str, ...]) -> Any:
    if isinstance(obj, list):
        return [decode_allowed(v, allowed) for v in obj]
    if isinstance(obj, dict):
        if "__np__" in obj:
            array = obj["__np__"].numpy().astype(obj["dtype"], copy=False)
            return array[()] if obj.get("scalar") else array
        if "__dc__" in obj:
            cls = _dataclass(obj["__dc__"], allowed)
            return cls(**{k: decode_allowed(v, allowed) for k, v in obj["fields"].items()})
        if "__map__" in obj:
            return {decode_allowed(k, allowed): decode_allowed(v, allowed) for k, v in obj["__map__"]}
        if "__tuple__" in obj:
            return tuple(decode_allowed(v, allowed) for v in obj["__tuple__"])
        raise CheckpointError(f"unknown checkpoint node with keys {sorted(obj)}")
    return obj
