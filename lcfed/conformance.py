"""Does a Strategy keep the contract every built-in keeps? ``lcfed check METHOD`` and :func:`check`.

Properties, each checked on a small federation (digits, 6 devices, 2 rounds) in this process:

- ``seeded``: the same config and seed give the same numbers, run after run;
- ``pure``: no hook changes its arguments in place (server state, device state, payload, plan,
  messages): states are values, so checkpoints, retries and the Ray engine see what was sent;
- ``priced``: each round's ``bytes_up`` covers every tensor the devices' messages carry;
- ``resumable``: stopping after round 1 and resuming from its checkpoint gives round 2 bit for bit;
- ``engines`` (``ray=True``): the Ray engine (device and server actors) gives the in-process numbers.

A plugin author runs it on their method (``lcfed check mypackage.module:MyStrategy``) or calls
:func:`check` from a test; every built-in passes it (tests/test_conformance.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from lcfed import engines, numerics
from lcfed.config import ExperimentConfig, from_dict
from lcfed.config.overrides import apply_overrides, resolve
from lcfed.engines.local import LocalEngine, LocalPool, LocalServer
from lcfed.errors import ConfigError
from lcfed.methods.base import Strategy
from lcfed.methods.round import Message
from lcfed.methods.traffic import tensor_bytes
from lcfed.run.loop import load_resume, run_rounds
from lcfed.run.result import RunResult
from lcfed.run.sources import load

PROPERTIES = ("seeded", "pure", "priced", "resumable", "engines")
#: the hooks whose arguments must come back unchanged, by argument position
HOOKS: dict[str, tuple[int, ...]] = {"configure": (0,), "aggregate": (0, 1, 2), "local": (1, 2, 3),
                                     "eval_payload": (0,), "personalized": (1, 2)}
#: metrics that measure this machine's time, not the method
TIMING = ("round_seconds",)


@dataclass(frozen=True)
class Finding:
    """One property: whether it holds, and what was seen when it does not."""

    prop: str
    ok: bool
    detail: str = ""


@dataclass
class _Audit:
    mutated: dict[str, int] = field(default_factory=dict)  # hook -> calls that changed an argument
    unpriced: list[str] = field(default_factory=list)  # rounds whose bytes_up misses message tensors


def small_config(name: str, **overrides: Any) -> ExperimentConfig:
    """The federation checks run on: 6 devices of digits (2 classes each), 2 rounds of 2 local steps,
    K = 3, D = 4 and M = 2 mixture components where the method has them; ``overrides`` (dotted keys, e.g. ``**{"train.lr": 0.01}``,
    as ``lcfed check --set`` gives them) change it and are validated with it."""
    fields = {f.name for f in dataclasses.fields(resolve("method", "METHOD", name).params)}
    method: dict[str, Any] = {"name": name}
    method.update({k: v for k, v in {"num_clusters": 3, "rank": 4, "num_components": 2}.items() if k in fields})
    raw: dict[str, Any] = {"data": {"dataset": "digits", "partition": "pathological", "classes_per_device": 2, "num_devices": 6},
           "train": {"rounds": 2, "local_steps": 2, "lr": 0.05}, "method": method,
           "engine": {"torch_threads": 1, "workers": 1}, "tracking": {"enabled": False}}
    return from_dict(apply_overrides(raw, overrides))  # dotted keys at any depth, as `--set` takes them


def fingerprint(obj: Any) -> str:
    """A digest of every tensor and array reachable in ``obj`` (dataclasses, mappings, sequences), with
    the scalars beside them: equal digests, equal contents."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            h.update(str((x.dtype, tuple(x.shape))).encode())
            h.update(x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b"")
        elif isinstance(x, np.ndarray):
            h.update(str((x.dtype, x.shape)).encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, dict):
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, (int, float, str, bool, type(None))):
            h.update(repr(x).encode())
        else:  # other objects (e.g. a fitted projector): their attributes
            walk(getattr(x, "__dict__", repr(x)))

    walk(obj)
    return h.hexdigest()


class _Guarded:
    """A strategy whose hooks are watched: arguments fingerprinted before and after each call, and each
    aggregation's ``bytes_up`` compared with its messages' tensors."""

    def __init__(self, inner: Any, audit: _Audit) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_audit", audit)

    def __setattr__(self, name: str, value: Any) -> None:
        # the server sets what the strategy reads (the device model's ``scheduled`` devices): on the strategy
        # itself, or the watched run would choose its own devices and differ from the unwatched one
        setattr(self._inner, name, value)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in HOOKS or not callable(attr):
            return attr
        watched = HOOKS[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            before = [fingerprint(args[i]) for i in watched if i < len(args)]
            out = attr(*args, **kwargs)
            if [fingerprint(args[i]) for i in watched if i < len(args)] != before:
                self._audit.mutated[name] = self._audit.mutated.get(name, 0) + 1
            if name == "aggregate":
                msgs: Sequence[Message] = args[2]
                carried = sum(tensor_bytes(m) for m in msgs)
                if out[1].bytes_up < carried:
                    self._audit.unpriced.append(f"round {args[1].rnd}: bytes_up {out[1].bytes_up} < {carried} "
                                                "bytes of tensors in the messages")
            return out

        return call


def _run(cfg: ExperimentConfig, audit: _Audit | None = None, resume: Any = None,
         observers: Sequence[Any] = ()) -> RunResult:
    """The in-process engine, with the strategy watched when ``audit`` is given."""
    engine = LocalEngine(cfg, load(cfg), 1)
    try:
        server_strategy = engine.setup.strategy()
        if audit is not None:  # the guard forwards every attribute: to the loop it is the strategy
            engine.hosted.strategy = cast(Strategy, _Guarded(engine.hosted.strategy, audit))
            server_strategy = cast(Strategy, _Guarded(server_strategy, audit))
        return run_rounds(cfg, engine.setup.federation, LocalServer(server_strategy), LocalPool(engine.hosted), observers, resume)
    finally:
        engine.close()


def differences(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]]) -> list[str]:
    """Where two histories differ (``round r: metric a != b``), timing metrics aside."""
    if len(a) != len(b):
        return [f"{len(a)} rounds against {len(b)}"]
    out = []
    for ra, rb in zip(a, b, strict=True):
        for key in sorted(set(ra) | set(rb)):
            if key in TIMING:
                continue
            va, vb = ra.get(key, math.nan), rb.get(key, math.nan)
            if va != vb and not (math.isnan(va) and math.isnan(vb)):
                out.append(f"round {int(ra.get('round', -1)) + 1}: {key} {va!r} != {vb!r}")
    return out


def _first(diffs: list[str]) -> str:
    return diffs[0] + (f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else "")


def check(name: str, *, ray: bool = False, cfg: ExperimentConfig | None = None,
          progress: Callable[[str], None] | None = None) -> list[Finding]:
    """Every property of :data:`PROPERTIES` for the method ``name`` (``engines`` only with ``ray``), on
    ``cfg`` (default :func:`small_config`). A property that cannot be checked because the method fails
    to run is reported failed with the error."""
    cfg = cfg or small_config(name)
    numerics.activate(cfg.engine.numerics)
    say = progress or (lambda _: None)
    findings: list[Finding] = []
    audit = _Audit()
    say("seeded, pure, priced")
    with tempfile.TemporaryDirectory(prefix="lcfed-check-") as tmp:
        # the unwatched run also checkpoints, its next-to-last round's checkpoint kept aside to resume from:
        # one run fewer than a separate stopped run (saving a checkpoint must not change the numbers either)
        saved = f"{tmp}/saved"
        run_dir = f"{tmp}/run"
        ckpt: dict[str, Any] = {"checkpoint.dir": run_dir, "checkpoint.every": 1}
        try:
            first = _run(cfg, audit)
            try:
                second, unsaved = _run(cfg.replace(**ckpt), observers=[_KeepCheckpoint(run_dir, saved, cfg.train.rounds - 2)]), None
            except Exception as exc:  # checkpointing fails, not the method: only resumable fails
                second, unsaved = _run(cfg), exc
        except ConfigError:
            raise  # the config (or a Strategy's check of its params) is refused: once, not as every property failed
        except Exception as exc:
            error = f"the method fails to run: {type(exc).__name__}: {exc}"
            return [Finding(p, False, error) for p in PROPERTIES if p != "engines" or ray]
        diffs = differences(first.history, second.history)
        findings.append(Finding("seeded", not diffs, _first(diffs) if diffs else ""))
        findings.append(Finding("pure", not audit.mutated, "; ".join(f"{hook} changed its arguments in place "
                                                                     f"({n} call{'s' if n > 1 else ''})"
                                                                     for hook, n in audit.mutated.items())))
        findings.append(Finding("priced", not audit.unpriced, _first(audit.unpriced) if audit.unpriced else ""))
        say("resumable")
        findings.append(_resumable(cfg.replace(**{**ckpt, "checkpoint.dir": saved}), first, unsaved))
    if ray:
        say("engines")
        findings.append(_engines(cfg, first))
    return findings


class _KeepCheckpoint:
    """An observer copying the checkpoint directory aside after round ``rnd`` (from 0)."""

    def __init__(self, src: str, dst: str, rnd: int) -> None:
        self.src, self.dst, self.rnd = src, dst, rnd

    def on_start(self, cfg: ExperimentConfig, fed: Any) -> None:
        pass

    def on_round(self, rnd: int, metrics: dict[str, float], stats: Any) -> None:
        if rnd == self.rnd:  # written before the observers hear of the round
            shutil.copytree(self.src, self.dst)

    def on_end(self, result: RunResult) -> None:
        pass


def _resumable(cfg: ExperimentConfig, straight: RunResult, unsaved: Exception | None) -> Finding:
    """Resume ``cfg`` (its ``checkpoint.dir`` holding the checkpoint before the last round): the last round as
    ``straight`` played it."""
    if unsaved is not None:
        return Finding("resumable", False, f"{type(unsaved).__name__}: {unsaved}")
    try:
        snap = load_resume(cfg)
        if snap is None:
            return Finding("resumable", False, f"no checkpoint before the last round (train.rounds {cfg.train.rounds}: "
                                               "resuming needs 2 or more)")
        resumed = _run(cfg, resume=snap)
    except Exception as exc:
        return Finding("resumable", False, f"{type(exc).__name__}: {exc}")
    diffs = differences(straight.history[-1:], resumed.history[-1:])
    return Finding("resumable", not diffs, _first(diffs) if diffs else "")


def _engines(cfg: ExperimentConfig, local: RunResult) -> Finding:
    try:  # through the registry: Ray is imported only for this property
        remote = engines.run(cfg.replace(**{"engine.kind": "ray", "engine.devices_per_actor": 3}))
    except Exception as exc:
        return Finding("engines", False, f"{type(exc).__name__}: {exc}")
    diffs = differences(local.history, remote.history)
    return Finding("engines", not diffs, _first(diffs) if diffs else "")


def assert_conforms(name: str, *, ray: bool = False, cfg: ExperimentConfig | None = None) -> None:
    """For a plugin's own tests: fails with :func:`report` unless every property holds."""
    findings = check(name, ray=ray, cfg=cfg)
    if not all(f.ok for f in findings):
        raise AssertionError(report(name, findings))


def report(name: str, findings: Iterable[Finding]) -> str:
    """``lcfed check``'s table: one line a property."""
    lines = [f"{name}:"]
    for f in findings:
        lines.append(f"  {f.prop:<10} {'ok' if f.ok else 'FAILED'}" + (f"  {f.detail}" if f.detail else ""))
    return "\n".join(lines)
