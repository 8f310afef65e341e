"""Device traces in FedScale's formats, read into arrays: how fast each device computes and sends
(:func:`read_capacity`) and when it is online (:func:`read_availability`), and which trace row each
simulated device uses (:func:`trace_rows`).

FedScale ships both traces as pickled dicts keyed by client id (1-based ints):

- capacity: ``{id: {"computation": ms per sample (forward pass), "communication": kbit/s}}``; FedScale
  takes ``size_kbit / communication`` seconds to move a model;
- availability ("behaviour"): ``{id: {"active": [t0, ...], "inactive": [u0, ...], "finish_time": T, ...}}``
  in seconds; interval i is online from ``active[i]`` to ``inactive[i]``, and the trace repeats with
  period ``finish_time`` (FedScale looks at ``time % finish_time``).

A record's other keys (``duration``, ``model``, the extra fields of FedScale's variants) are ignored; a
table's header is checked whole, so a misspelt column is an error rather than a column dropped.

A trace is read from (``auto`` picks by extension):

- ``.pkl`` / ``.pickle``: FedScale's own files, through an unpickler that builds only dicts, lists,
  tuples, numbers, strings, booleans and None: a pickle that names any class or function is refused
  before anything it names is imported or run (a pickle can otherwise run any code it likes);
- ``.json``: the same dict (id strings as keys), or a list of records, each with an ``id`` (or
  ``client_id``) beside the fields;
- ``.csv`` / ``.parquet``: a table; capacity: ``id,computation,communication``; availability: one row per
  online interval, ``id,active,inactive,finish_time`` (a client never online: one row with ``active``
  and ``inactive`` empty), an optional ``duration`` column ignored. ``client_id`` may name the id column.

Ids are non-negative ints (or strings of digits). Every value is checked before a trace is returned;
a bad file is one :class:`TraceError` naming the config field, the file and the offending client. Each
format's reader is in :mod:`lcfed.devices.trace_files`; this module checks and returns what they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import lcfed.devices.trace_budget as trace_budget
from lcfed import _moved
from lcfed.devices.trace_files import (
    AVAILABILITY_FIELDS,
    CAPACITY_FIELDS,
    TraceError,
    TraceProblems,
    availability_records,
    availability_rows,
    capacity_records,
    load_json,
    load_pickle,
    read_table,
    shown,
)

__all__ = [
    "TRACE_FORMATS", "AvailabilityTrace", "CapacityTrace", "TraceError", "read_availability", "read_capacity",
    "trace_rows",
]

TRACE_FORMATS = ("auto", "json", "csv", "parquet", "pickle")
"""How a trace file is read; ``auto`` = by its extension (:data:`TRACE_SUFFIXES`)."""


TRACE_SUFFIXES = {".json": "json", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".pkl": "pickle",
                  ".pickle": "pickle"}
"""The extensions ``auto`` knows, and the format each means."""


ROW_BLOCK = 4096
"""Devices beyond the trace draw their rows in blocks of this many, each block from its own seed."""


@dataclass(frozen=True, eq=False)  # eq=False: elementwise array comparison has no truth value
class CapacityTrace:
    """Each trace client's speed and link, one row per client in ascending id order."""

    ids: np.ndarray  #: int64 (n,), sorted ascending, unique
    computation_ms: np.ndarray  #: float64 (n,), milliseconds to process one sample (forward pass), finite > 0
    communication_kbps: np.ndarray  #: float64 (n,), link bandwidth in kbit/s, finite > 0
    path: str  #: the file it was read from

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class AvailabilityTrace:
    """Each trace client's online intervals, one row per client in ascending id order, as CSR arrays:
    client i is online on ``[starts[k], ends[k]]`` for ``offsets[i] <= k < offsets[i+1]`` (sorted, not
    overlapping), and its trace repeats with period ``period[i]`` (seconds)."""

    ids: np.ndarray  #: int64 (n,), sorted ascending, unique
    offsets: np.ndarray  #: int64 (n+1,), CSR offsets into starts/ends
    starts: np.ndarray  #: float64 (total,), seconds the intervals begin (``active``)
    ends: np.ndarray  #: float64 (total,), seconds they end (``inactive``)
    period: np.ndarray  #: float64 (n,), ``finish_time``: each client's trace repeats after it; > 0
    path: str  #: the file it was read from

    def __len__(self) -> int:
        return len(self.ids)


def read_capacity(path: str | Path, fmt: str = "auto", field: str = "devices.capacity_trace") -> CapacityTrace:
    """The capacity trace in ``path`` (``fmt``: one of :data:`TRACE_FORMATS`). ``field`` is the config
    field that named the file: every :class:`TraceError` starts with it, so the user knows what to fix."""
    err, p, kind = _open(path, fmt, field)
    if kind in ("json", "pickle"):
        data = load_json(p, err) if kind == "json" else load_pickle(p, err)
        ids, comp, comm = capacity_records(data, err)
    else:
        table = read_table(p, kind, err, CAPACITY_FIELDS, ())
        if len(table.ids) > trace_budget.MAX_CLIENTS:
            raise err(f"holds {len(table.ids):,} rows; at most {trace_budget.MAX_CLIENTS:,} clients are read from a trace")
        ids, comp, comm = table.ids, table.values["computation"], table.values["communication"]
    return _capacity(ids, comp, comm, err)


def read_availability(path: str | Path, fmt: str = "auto",
                      field: str = "devices.availability_trace") -> AvailabilityTrace:
    """The availability trace in ``path`` (``fmt``: one of :data:`TRACE_FORMATS`); ``field`` as for
    :func:`read_capacity`."""
    err, p, kind = _open(path, fmt, field)
    if kind in ("json", "pickle"):
        data = load_json(p, err) if kind == "json" else load_pickle(p, err)
        ids, counts, starts, ends, period = availability_records(data, err)
    else:
        table = read_table(p, kind, err, AVAILABILITY_FIELDS, ("duration",))
        ids, counts, starts, ends, period = availability_rows(table, err)
    return _availability(ids, counts, starts, ends, period, err)


def trace_rows(num_devices: int, ids: np.ndarray, seed: int) -> np.ndarray:
    """Which trace row each of ``num_devices`` simulated devices uses, int64 (num_devices,).

    With ``n = len(ids)`` trace clients (rows in ascending id order): device ``d < n`` uses row ``d``.
    Device ``d >= n`` uses ``rng.integers(0, n, size=4096)[d % 4096]`` with
    ``rng = np.random.default_rng([seed, 0x7ACE, d // 4096])``: every block of 4096 devices draws 4096
    rows from its own seed, whatever part of the block is beyond the trace. A device's row so depends only
    on ``(n, seed, d)``: more devices, or a block rebuilt alone, give the same rows to the same devices.
    """
    n = len(ids)
    if n < 1:
        raise ValueError("trace_rows needs a trace with at least one client")
    if num_devices < 0 or seed < 0:
        raise ValueError(f"trace_rows: num_devices and seed must be >= 0, got {num_devices} and {seed}")
    rows = np.arange(num_devices, dtype=np.int64)
    for block in range(n // ROW_BLOCK, -(-num_devices // ROW_BLOCK)):
        lo, hi = max(block * ROW_BLOCK, n), min((block + 1) * ROW_BLOCK, num_devices)
        if lo >= hi:
            continue
        draws = np.random.default_rng([seed, 0x7ACE, block]).integers(0, n, size=ROW_BLOCK, dtype=np.int64)
        rows[lo:hi] = draws[lo - block * ROW_BLOCK:hi - block * ROW_BLOCK]
    return rows


def _open(path: str | Path, fmt: str, field: str) -> tuple[TraceProblems, Path, str]:
    """The error builder, the file and the format to read it with; a missing file or unknown format is
    refused here, before anything is read."""
    p = Path(path).expanduser()
    err = TraceProblems(field, str(p))
    if fmt not in TRACE_FORMATS:
        raise err(f"unknown trace format {fmt!r}; one of {', '.join(TRACE_FORMATS)}")
    if not p.exists():
        raise err("no such file")
    if p.is_dir():
        raise err("is a directory, not a trace file")
    if fmt != "auto":
        return err, p, fmt
    kind = TRACE_SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise err(f"cannot tell the trace format from the extension {p.suffix!r} (known: "
                  f"{', '.join(TRACE_SUFFIXES)}); name the format, one of {', '.join(TRACE_FORMATS[1:])}")
    return err, p, kind


def _sorted_unique(ids: np.ndarray, err: TraceProblems) -> np.ndarray:
    """The stable order that sorts ``ids``; refuses an empty trace and a repeated id."""
    if len(ids) == 0:
        raise err("holds no clients; a trace needs at least one")
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if len(dup):
        raise err(f"client {s[dup[0]]} appears more than once; each client id has one record")
    return order


def _positive(ids: np.ndarray, values: np.ndarray, what: str, err: TraceProblems) -> None:
    bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
    if len(bad):
        raise err(f"client {ids[bad[0]]}: {what} is {shown(values[bad[0]])}; must be a finite number > 0")


def _capacity(ids: np.ndarray, comp: np.ndarray, comm: np.ndarray, err: TraceProblems) -> CapacityTrace:
    order = _sorted_unique(ids, err)
    ids, comp, comm = ids[order], comp[order], comm[order]
    _positive(ids, comp, "computation (ms per sample)", err)
    _positive(ids, comm, "communication (kbit/s)", err)
    return CapacityTrace(ids, comp, comm, err.path)


def _availability(ids: np.ndarray, counts: np.ndarray, starts: np.ndarray, ends: np.ndarray, period: np.ndarray,
                  err: TraceProblems) -> AvailabilityTrace:
    order = _sorted_unique(ids, err)
    old = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    ids, counts, period = ids[order], counts[order], period[order]
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    if not np.array_equal(order, np.arange(len(order))):  # move each client's intervals with it
        take = np.repeat(old[order] - offsets[:-1], counts) + np.arange(offsets[-1])
        starts, ends = starts[take], ends[take]
    _positive(ids, period, "finish_time (the trace's period, seconds)", err)
    owner = np.repeat(np.arange(len(ids)), counts)
    for key, times in (("active", starts), ("inactive", ends)):
        bad = np.flatnonzero(~(np.isfinite(times) & (times >= 0)))
        if len(bad):
            raise err(f"client {ids[owner[bad[0]]]}: {key} time {shown(times[bad[0]])}; times must be finite "
                      "seconds >= 0")
    bad = np.flatnonzero(ends <= starts)
    if len(bad):
        k = bad[0]
        raise err(f"client {ids[owner[k]]}: interval [{shown(starts[k])}, {shown(ends[k])}] has inactive <= active; each "
                  "online interval ends after it starts")
    bad = np.flatnonzero((owner[1:] == owner[:-1]) & (starts[1:] < ends[:-1]))
    if len(bad):
        k = bad[0]
        raise err(f"client {ids[owner[k]]}: intervals [{shown(starts[k])}, {shown(ends[k])}] and [{shown(starts[k + 1])}, "
                  f"{shown(ends[k + 1])}] are not sorted or overlap; each starts at or after the previous one ends")
    has = counts > 0
    last = np.zeros(len(ids))
    last[has] = ends[offsets[1:][has] - 1]
    bad = np.flatnonzero(period < last)
    if len(bad):
        c = bad[0]
        raise err(f"client {ids[c]}: finish_time {shown(period[c])} is smaller than its last inactive time "
                  f"{shown(last[c])}; the period covers every interval")
    return AvailabilityTrace(ids, offsets, starts, ends, period, err.path)


def __getattr__(name: str) -> Any:
    """A name split off to :mod:`lcfed.devices.trace_files`, read here: found there, with a DeprecationWarning."""
    return _moved.split_off(__name__, name)
