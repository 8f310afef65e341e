"""The persistent states of a host's devices, costing only what was trained.

A device's state exists from its first round of training; until then reading it gives the
strategy's :meth:`~lcfed.methods.base.Strategy.init_device` state (the initial model), made when it
is read and never stored. Stored states stay in memory up to a budget (``engine.state_memory_mb``);
past it, the tensors of newly stored states go to memory-mapped files (one slab per tensor shape,
slots reused when a device's state is replaced) and are read back as fresh copies, bit for bit.
The strategies see the same objects either way.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lcfed.methods.traffic import tensor_bytes

#: bytes of one memory-mapped chunk of a slab (its file is sparse until slots are written)
CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class _Ref:
    """Where a spilled tensor lies: its slab and slot."""

    key: tuple[str, tuple[int, ...]]
    slot: int


class _Slab:
    """Fixed-shape slots in memory-mapped files in ``folder``, allocated in chunks. Each file is
    unlinked as soon as it is mapped: the mapping keeps its pages, and nothing is left on disk once the
    slab is dropped, however the process ends."""

    def __init__(self, folder: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.folder, self.dtype, self.shape = folder, dtype, shape
        row = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        self.per_chunk = max(1, CHUNK_BYTES // row)
        self.chunks: list[np.memmap] = []
        self.free: list[int] = []

    def alloc(self) -> int:
        if not self.free:
            base = len(self.chunks) * self.per_chunk
            fd, path = tempfile.mkstemp(prefix="lcfed-states-", suffix=".bin", dir=self.folder or None)
            try:
                with os.fdopen(fd, "w+b") as f:
                    self.chunks.append(np.memmap(f, dtype=self.dtype, mode="w+", shape=(self.per_chunk, *self.shape)))
            finally:
                os.unlink(path)
            self.free = list(range(base + self.per_chunk - 1, base - 1, -1))
        return self.free.pop()

    def write(self, slot: int, values: np.ndarray) -> None:
        self.chunks[slot // self.per_chunk][slot % self.per_chunk] = values

    def read(self, slot: int) -> np.ndarray:
        return np.array(self.chunks[slot // self.per_chunk][slot % self.per_chunk])

    def release(self, slot: int) -> None:
        self.free.append(slot)


def _walk(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` rebuilt with ``leaf`` applied to every tensor and :class:`_Ref` in it (through dataclasses,
    mappings, lists and tuples); other values are kept by reference. Dataclasses are copied field by
    field, so neither ``__init__`` nor ``__post_init__`` runs again."""
    if isinstance(obj, (torch.Tensor, _Ref)):
        return leaf(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(out, f.name, _walk(getattr(obj, f.name), leaf))
        return out
    if isinstance(obj, Mapping):
        return type(obj)({k: _walk(v, leaf) for k, v in obj.items()})  # type: ignore[call-arg]
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):  # not named tuples
        return type(obj)(_walk(v, leaf) for v in obj)
    return obj


def _spillable(t: torch.Tensor) -> bool:
    """CPU tensors of a dtype numpy holds (bfloat16 and the like stay in memory)."""
    if t.device.type != "cpu" or t.requires_grad:
        return False
    try:
        torch.empty(0, dtype=t.dtype).numpy()
    except TypeError:
        return False
    return True


class DeviceStates:
    """States of the devices that trained, by device id; the others read ``fresh(device)``.

    ``budget_bytes``: tensor bytes kept in memory (0: no limit, nothing spills); past it, states'
    tensors go to memory-mapped files in ``spill_dir`` (the system's temporary directory if empty),
    unlinked when made: their space is freed by :meth:`close` or when the process ends.
    """

    def __init__(self, fresh: Callable[[int], Any], budget_bytes: int = 0, spill_dir: str = "") -> None:
        self.fresh = fresh
        self.budget = budget_bytes
        self.spill_dir = spill_dir
        self._mem: dict[int, Any] = {}
        self._mem_bytes = 0
        self._disk: dict[int, Any] = {}  # device -> its state with _Refs in place of tensors
        self._slabs: dict[tuple[str, tuple[int, ...]], _Slab] = {}

    def __len__(self) -> int:
        return len(self._mem) + len(self._disk)

    def __contains__(self, device: object) -> bool:
        return device in self._mem or device in self._disk

    @property
    def memory_bytes(self) -> int:
        """Tensor bytes of the states held in memory."""
        return self._mem_bytes

    @property
    def spilled(self) -> int:
        """How many devices' states are on disk."""
        return len(self._disk)

    def get(self, device: int) -> Any:
        """The device's stored state (spilled ones as fresh copies), else ``fresh(device)``."""
        if device in self._mem:
            return self._mem[device]
        if device in self._disk:
            return _walk(self._disk[device], self._load)
        return self.fresh(device)

    def put(self, device: int, state: Any) -> None:
        """Store ``state`` as the device's state (in memory within the budget, else on disk)."""
        nbytes = tensor_bytes(state)
        old_mem, old_disk = self._mem.pop(device, None), self._disk.pop(device, None)
        if old_mem is not None:
            self._mem_bytes -= tensor_bytes(old_mem)
        if self.budget <= 0 or self._mem_bytes + nbytes <= self.budget:
            self._mem[device] = state
            self._mem_bytes += nbytes
        else:
            self._disk[device] = _walk(state, self._spill)
        if old_disk is not None:  # after the new state is written: it may be a copy of the old one
            _walk(old_disk, self._release)

    def update(self, states: Mapping[int, Any]) -> None:
        for device, state in states.items():
            self.put(device, state)

    def stored_ids(self) -> list[int]:
        """The devices whose state is stored (in memory or spilled)."""
        return [*self._mem, *self._disk]

    def stored(self) -> dict[int, Any]:
        """Every stored state by device id (spilled ones as fresh copies): what a checkpoint saves."""
        return {d: self.get(d) for d in sorted([*self._mem, *self._disk])}

    def clear(self) -> None:
        """Forget every stored state (every device reads its fresh state again) and remove the spill files."""
        self._mem.clear()
        self._mem_bytes = 0
        self.close()

    def close(self) -> None:
        """Drop the spilled states and free their files' space."""
        self._disk.clear()
        self._slabs.clear()

    # --- leaves -------------------------------------------------------------------------------
    def _spill(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not _spillable(t):
            return t
        values = t.detach().contiguous().numpy()
        key = (str(values.dtype), tuple(values.shape))
        slab = self._slabs.get(key)
        if slab is None:
            slab = self._slabs[key] = _Slab(self.spill_dir, values.dtype, values.shape)
        slot = slab.alloc()
        slab.write(slot, values)
        return _Ref(key, slot)

    def _load(self, ref: Any) -> Any:
        return torch.from_numpy(self._slabs[ref.key].read(ref.slot)) if isinstance(ref, _Ref) else ref

    def _release(self, ref: Any) -> Any:
        if isinstance(ref, _Ref):
            self._slabs[ref.key].release(ref.slot)
        return ref
