"""A trace file's records, format by format, before they are checked (:mod:`lcfed.devices.traces` checks and
returns them): FedScale's pickles through an unpickler that builds only plain data (a pickle naming any class
or function is refused before anything it names is imported), JSON dicts or record lists, and CSV or parquet
tables whose header is checked whole. Each reader gives the ids and columns as arrays; each problem is one
error naming the config field, the file and the offending client.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import lcfed.devices.trace_budget as trace_budget
from lcfed.devices.trace_budget import Repeated, unique_keys, within_budget
from lcfed.errors import ConfigError

_MAX_ID = 2**63 - 1


CAPACITY_FIELDS = ("computation", "communication")


AVAILABILITY_FIELDS = ("active", "inactive", "finish_time")


_ID_COLUMNS = ("id", "client_id")


class TraceError(ConfigError):
    """A trace file is missing or unusable. A :class:`ConfigError`, so the CLI prints it as one line and
    exits 2 like any bad config value; the message is ``"<field>: <file>: <what is wrong>"``."""

    def __init__(self, field_name: str, path: str, what: str) -> None:
        super().__init__(field_name, path, what)  # field, value, allowed: ConfigError.__reduce__ rebuilds it
        self.path = path
        self.what = what
        self.args = (f"{field_name}: {path}: {what}",)


@dataclass(frozen=True)
class TraceProblems:
    """Builds the :class:`TraceError` of one file: ``raise err("what is wrong")``."""

    field: str
    path: str

    def __call__(self, what: str) -> TraceError:
        return TraceError(self.field, self.path, what)


def load_json(p: Path, err: TraceProblems) -> Any:
    try:
        with open(p, encoding="utf-8-sig") as f:
            data = json.load(f, object_pairs_hook=unique_keys)
    except Repeated as exc:
        raise err(f"the key {str(exc)!r} appears more than once in one object (JSON would keep only the last); "
                  "give each client id, and each field of a record, once") from None
    except json.JSONDecodeError as exc:
        raise err(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise err(f"not valid JSON ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise err(f"cannot read it ({exc.strerror or exc})") from None
    return within_budget(data, err)


class _Refused(pickle.UnpicklingError):
    """The pickle named a global (a class or function); carries its dotted name."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what needs no global: dicts, lists, tuples, sets, numbers, strings, booleans, None.
    Every class or function a pickle names comes through :meth:`find_class`, which refuses them all, so
    nothing is imported and no ``__reduce__`` callable runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")


def load_pickle(p: Path, err: TraceProblems) -> Any:
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise err(f"cannot read it ({exc.strerror or exc})") from None
    try:
        data = _PlainUnpickler(io.BytesIO(raw)).load()
    except _Refused as exc:
        raise err(f"the pickle names {exc} (a class or function); refused: only plain dicts, lists, numbers and "
                  "strings are read from a trace pickle, so nothing in it is imported or run") from None
    except Exception as exc:  # a damaged pickle fails in many ways (EOFError, UnpicklingError, ValueError, ...)
        raise err(f"not a readable pickle ({type(exc).__name__}: {exc})") from None
    return within_budget(data, err)


def _client_id(value: Any, err: TraceProblems) -> int:
    """A record's id: an int, or a string of (ASCII) digits, in 0..2**63-1."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if type(value) is int and value > _MAX_ID:
        raise err(f"client id {value} is beyond 64 bits; ids are integers in [0, 2**63 - 1]")
    if type(value) is not int or not 0 <= value <= _MAX_ID:
        raise err(f"client id {value!r} is not a non-negative integer (or a string of digits)")
    return value


def _records(data: Any, err: TraceProblems) -> list[tuple[int, Mapping[str, Any]]]:
    """``(id, record)`` pairs from FedScale's dict ``{id: record}`` or a list of records with an ``id``."""
    out: list[tuple[int, Mapping[str, Any]]] = []
    if isinstance(data, (dict, list, tuple)) and len(data) > trace_budget.MAX_CLIENTS:
        raise err(f"holds {len(data):,} records; at most {trace_budget.MAX_CLIENTS:,} clients are read from a trace")
    if isinstance(data, dict):
        for key, rec in data.items():
            cid = _client_id(key, err)
            if not isinstance(rec, dict):
                raise err(f"client {cid}: its record is a {type(rec).__name__}; expected a dict of fields")
            out.append((cid, rec))
        return out
    if isinstance(data, (list, tuple)):
        for i, rec in enumerate(data):
            if not isinstance(rec, dict):
                raise err(f"record {i} is a {type(rec).__name__}; expected a dict with an 'id' and the fields")
            keys = [k for k in _ID_COLUMNS if k in rec]
            if len(keys) != 1:
                raise err(f"record {i} has {'no id key' if not keys else 'both id and client_id'}; each record "
                          "names its client with one 'id' (or 'client_id') key")
            out.append((_client_id(rec[keys[0]], err), rec))
        return out
    raise err(f"holds a {type(data).__name__}; expected a dict of client id -> record (FedScale's layout) or a "
              "list of records, each with an 'id'")


def _field(cid: int, rec: Mapping[str, Any], key: str, err: TraceProblems, fields: Sequence[str]) -> Any:
    if key not in rec:
        raise err(f"client {cid}: no {key!r} key (a record holds {', '.join(fields)}; has {sorted(map(str, rec))})")
    return rec[key]


def _number(cid: int, key: str, value: Any, err: TraceProblems) -> float:
    if type(value) not in (int, float):  # not bool, not a string of digits
        raise err(f"client {cid}: {key} is {value!r}; must be a number")
    try:
        return float(value)
    except OverflowError:
        raise err(f"client {cid}: {key} is {value!r}; too large for a float") from None


def capacity_records(data: Any, err: TraceProblems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    recs = _records(data, err)
    ids = np.empty(len(recs), dtype=np.int64)
    comp = np.empty(len(recs), dtype=np.float64)
    comm = np.empty(len(recs), dtype=np.float64)
    for i, (cid, rec) in enumerate(recs):
        ids[i] = cid
        comp[i] = _number(cid, "computation", _field(cid, rec, "computation", err, CAPACITY_FIELDS), err)
        comm[i] = _number(cid, "communication", _field(cid, rec, "communication", err, CAPACITY_FIELDS), err)
    return ids, comp, comm


def availability_records(data: Any, err: TraceProblems) -> tuple[np.ndarray, ...]:
    recs = _records(data, err)
    ids = np.empty(len(recs), dtype=np.int64)
    counts = np.empty(len(recs), dtype=np.int64)
    period = np.empty(len(recs), dtype=np.float64)
    starts: list[Any] = []
    ends: list[Any] = []
    for i, (cid, rec) in enumerate(recs):
        ids[i] = cid
        active = _field(cid, rec, "active", err, AVAILABILITY_FIELDS)
        inactive = _field(cid, rec, "inactive", err, AVAILABILITY_FIELDS)
        for key, seq in (("active", active), ("inactive", inactive)):
            if not isinstance(seq, (list, tuple)):
                raise err(f"client {cid}: {key} is a {type(seq).__name__}; must be a list of times")
        if len(active) != len(inactive):
            raise err(f"client {cid}: active and inactive have different lengths ({len(active)} and "
                      f"{len(inactive)}); each online interval has one of each")
        counts[i] = len(active)
        if len(starts) + len(active) > trace_budget.MAX_INTERVALS:
            raise err(f"holds more than {trace_budget.MAX_INTERVALS:,} online intervals (client {cid} reaches it); at most "
                      f"{trace_budget.MAX_INTERVALS:,} are read from a trace")
        starts.extend(active)
        ends.extend(inactive)
        period[i] = _number(cid, "finish_time", _field(cid, rec, "finish_time", err, AVAILABILITY_FIELDS), err)
    if not set(map(type, starts)) | set(map(type, ends)) <= {int, float}:  # not bool, not "5": name the first
        for cid, rec in recs:
            for key in ("active", "inactive"):
                bad = [t for t in rec[key] if type(t) not in (int, float)]
                if bad:
                    raise err(f"client {cid}: {key} holds {bad[0]!r}; times must be numbers (seconds)")
    try:
        return ids, counts, np.array(starts, dtype=np.float64), np.array(ends, dtype=np.float64), period
    except OverflowError:
        raise err("a time is too large for a float") from None


@dataclass(frozen=True, eq=False)
class _Table:
    """A table's rows: ids, and each value column as float64 (NaN where empty) with its empty mask."""

    ids: np.ndarray
    values: dict[str, np.ndarray]
    empty: dict[str, np.ndarray]


def _columns(names: Sequence[str], err: TraceProblems, required: Sequence[str], optional: Sequence[str]) -> str:
    """The id column's name, once the header is known to hold the required columns and nothing unknown."""
    header = f"{_ID_COLUMNS[0]},{','.join(required)}"
    ids = [c for c in _ID_COLUMNS if c in names]
    if len(ids) != 1:
        raise err(f"{'no id column' if not ids else 'both id and client_id columns'}; the header is {header}")
    missing = [c for c in required if c not in names]
    if missing:
        raise err(f"no {', '.join(missing)} column{'s' * (len(missing) > 1)} (columns: {', '.join(names)}); the "
                  f"header is {header}")
    unknown = [c for c in names if c not in (*_ID_COLUMNS, *required, *optional)]
    if unknown:
        also = f" (and optionally {', '.join(optional)})" if optional else ""
        raise err(f"unknown column{'s' * (len(unknown) > 1)} {', '.join(unknown)}; the header is {header}{also}")
    return ids[0]


def _digit_ids(strings: np.ndarray, err: TraceProblems) -> np.ndarray:
    """Ids from strings of digits, vectorised; the first bad one is named."""
    strings = np.char.strip(np.asarray(strings, dtype=str))
    ok = np.char.isdigit(strings) & (np.char.str_len(strings) <= 19)
    if ok.all():
        try:
            return strings.astype(np.int64)
        except (ValueError, OverflowError):
            pass
    for s in strings.tolist():
        _client_id(s, err)  # raises for the first bad one
    raise err("client ids must be non-negative integers")  # pragma: no cover - _client_id raised


def read_table(p: Path, kind: str, err: TraceProblems, required: Sequence[str], optional: Sequence[str]) -> _Table:
    return _read_csv(p, err, required, optional) if kind == "csv" else _read_parquet(p, err, required, optional)


def _read_csv(p: Path, err: TraceProblems, required: Sequence[str], optional: Sequence[str]) -> _Table:
    import pandas as pd  # only when a CSV trace is read

    try:  # only an empty cell is missing (no interval): a written "nan" stays text, a bad time, not a gap
        df = pd.read_csv(p, keep_default_na=False, na_values=[""], skipinitialspace=True, encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise err(f"an empty file; a trace CSV starts with the header {_ID_COLUMNS[0]},{','.join(required)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise err(f"not a readable CSV file ({type(exc).__name__}: {str(exc).strip()})") from None
    except OSError as exc:
        raise err(f"cannot read it ({exc.strerror or exc})") from None
    df.columns = [str(c).strip() for c in df.columns]
    id_col = _columns(list(df.columns), err, required, optional)
    column = df[id_col]
    if column.dtype.kind in "iu":  # the parser's own integers: the fast path
        raw = column.to_numpy()
        if len(raw) and int(raw.min()) < 0:
            raise err(f"client id {int(raw.min())} is not a non-negative integer (or a string of digits)")
        if len(raw) and int(raw.max()) > _MAX_ID:  # uint64 past int64 would wrap to a negative id
            _client_id(int(raw.max()), err)
        ids = raw.astype(np.int64)
    else:  # empty cells, signs, decimals, letters: each named by _client_id
        ids = _digit_ids(np.where(column.isna().to_numpy(), "", column.to_numpy(dtype=object).astype(str)), err)
    values: dict[str, np.ndarray] = {}
    empty: dict[str, np.ndarray] = {}
    for col in required:
        column = df[col]
        blank = column.isna().to_numpy()
        if column.dtype.kind in "iuf":  # parsed as numbers; NaN only where the cell was empty
            values[col], empty[col] = column.to_numpy(dtype=np.float64), blank
            continue
        cells = np.char.strip(column.to_numpy(dtype=object)[~blank].astype(str))
        out = np.full(len(blank), np.nan)
        try:  # text such as "nan" (a bad time, said so later) or a word (said so here)
            out[~blank] = cells.astype(np.float64)
        except (ValueError, OverflowError):
            where = np.flatnonzero(~blank)
            for i, cell in enumerate(cells.tolist()):
                try:
                    float(cell)
                except ValueError:
                    raise err(f"client {ids[where[i]]}: {col} is {cell!r}; must be a number") from None
            raise err(f"the {col} column holds a value that is not a number") from None
        values[col], empty[col] = out, blank
    return _Table(ids, values, empty)


def _read_parquet(p: Path, err: TraceProblems, required: Sequence[str], optional: Sequence[str]) -> _Table:
    import pyarrow as pa  # only when a parquet trace is read (what pandas reads parquet through)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:  # read through pyarrow itself: nulls (no interval) stay apart from NaN (a bad time)
        table = pq.read_table(p)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise err(f"not a readable parquet file ({type(exc).__name__}: {exc})") from None
    names = [n for n in table.column_names if not n.startswith("__index_level_")]  # pandas' saved index
    id_col = _columns(names, err, required, optional)
    idc = table.column(id_col)
    if idc.null_count:
        raise err(f"the {id_col} column has {idc.null_count} empty cell(s); every row names its client")
    if pa.types.is_integer(idc.type):
        raw = idc.to_numpy()
        if len(raw) and (int(raw.min()) < 0 or int(raw.max()) > _MAX_ID):
            bad = raw.min() if int(raw.min()) < 0 else raw.max()
            raise err(f"client id {int(bad)} is not a non-negative integer in int64")
        ids = raw.astype(np.int64)
    elif pa.types.is_string(idc.type) or pa.types.is_large_string(idc.type):
        ids = _digit_ids(np.asarray(idc.to_pylist(), dtype=str), err)
    else:
        raise err(f"the {id_col} column holds {idc.type}; client ids must be integers")
    values: dict[str, np.ndarray] = {}
    empty: dict[str, np.ndarray] = {}
    for col in required:
        c = table.column(col)
        if not (pa.types.is_integer(c.type) or pa.types.is_floating(c.type) or pa.types.is_null(c.type)):
            raise err(f"the {col} column holds {c.type}; it must hold numbers")
        empty[col] = np.asarray(pc.is_null(c).to_numpy(zero_copy_only=False), dtype=bool)
        numbers = np.asarray(c.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
        values[col] = np.where(empty[col], np.nan, numbers)  # a copy: arrow's buffers are read-only
    return _Table(ids, values, empty)


def availability_rows(table: _Table, err: TraceProblems) -> tuple[np.ndarray, ...]:
    """One row per online interval -> per-client counts, intervals in file order, one period per client."""
    if len(table.ids) > trace_budget.MAX_INTERVALS:
        raise err(f"holds {len(table.ids):,} rows; at most {trace_budget.MAX_INTERVALS:,} online intervals are read from a trace")
    a_empty, i_empty = table.empty["active"], table.empty["inactive"]
    odd = np.flatnonzero(a_empty != i_empty)
    if len(odd):
        r = odd[0]
        has, lacks = ("inactive", "active") if a_empty[r] else ("active", "inactive")
        raise err(f"client {table.ids[r]}: a row with {has} but no {lacks}; active and inactive have different "
                  "lengths (a client never online has one row with both empty)")
    if table.empty["finish_time"].any():
        r = np.flatnonzero(table.empty["finish_time"])[0]
        raise err(f"client {table.ids[r]}: finish_time is empty; every row gives its client's period")
    order = np.argsort(table.ids, kind="stable")  # keeps each client's rows in file order
    ids = table.ids[order]
    blank = a_empty[order]
    starts, ends, finish = (table.values[k][order] for k in AVAILABILITY_FIELDS)
    uniq, first, rows = np.unique(ids, return_index=True, return_counts=True)
    client = np.repeat(np.arange(len(uniq)), rows)
    crowded = np.flatnonzero(blank & (rows[client] > 1))
    if len(crowded):
        c = client[crowded[0]]
        raise err(f"client {uniq[c]}: a row with no interval among its {rows[c]} rows; a client never online has "
                  "exactly one row, with active and inactive empty")
    period = finish[first]
    differs = np.flatnonzero((finish != period[client]) & ~(np.isnan(finish) & np.isnan(period[client])))
    if len(differs):
        c = client[differs[0]]
        raise err(f"client {uniq[c]}: finish_time differs between its rows ({shown(period[c])} and "
                  f"{shown(finish[differs[0]])}); one client has one period")
    counts = rows - np.bincount(client[blank], minlength=len(uniq))
    return uniq, counts.astype(np.int64), starts[~blank], ends[~blank], period


def shown(x: Any) -> str:
    """A number as a message shows it (``1.5``, ``nan``), not numpy's ``np.float64(1.5)``."""
    return repr(float(x))
