"""FedScale device traces read into arrays (:mod:`lcfed.devices.traces`): tiny hand-written traces in every
format give identical arrays; each bad file is one TraceError naming the field, the file and the
problem; a hostile pickle runs nothing; the seeded device -> trace row rule, by hand and block by block."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lcfed.devices.trace_files import TraceError
from lcfed.devices.traces import (
    ROW_BLOCK,
    TRACE_FORMATS,
    AvailabilityTrace,
    CapacityTrace,
    read_availability,
    read_capacity,
    trace_rows,
)
from lcfed.errors import ConfigError

CAP_FIELD = "devices.capacity_trace"
AV_FIELD = "devices.availability_trace"

# FedScale's layout: int ids (1-based, in no particular order), fields per client
CAPACITY: dict[int, dict[str, Any]] = {
    3: {"computation": 12.5, "communication": 800.0},
    1: {"computation": 40.0, "communication": 2500.5},
    2: {"computation": 7, "communication": 12000},
}
AVAILABILITY: dict[int, dict[str, Any]] = {
    2: {"duration": 100, "active": [10, 50], "inactive": [20, 60.5], "finish_time": 100, "model": "CPH1801"},
    1: {"duration": 5, "active": [0], "inactive": [5], "finish_time": 5, "model": "SM-G930F"},
    7: {"duration": 0, "active": [], "inactive": [], "finish_time": 30, "model": "Pixel"},
}


def check_capacity(t: CapacityTrace, path: Path) -> None:
    assert t.ids.dtype == np.int64 and t.computation_ms.dtype == np.float64 and t.communication_kbps.dtype == np.float64
    np.testing.assert_array_equal(t.ids, [1, 2, 3])
    np.testing.assert_array_equal(t.computation_ms, [40.0, 7.0, 12.5])
    np.testing.assert_array_equal(t.communication_kbps, [2500.5, 12000.0, 800.0])
    assert t.path == str(path) and len(t) == 3


def check_availability(t: AvailabilityTrace, path: Path) -> None:
    assert t.ids.dtype == np.int64 and t.offsets.dtype == np.int64
    assert t.starts.dtype == t.ends.dtype == t.period.dtype == np.float64
    np.testing.assert_array_equal(t.ids, [1, 2, 7])
    np.testing.assert_array_equal(t.offsets, [0, 1, 3, 3])
    np.testing.assert_array_equal(t.starts, [0.0, 10.0, 50.0])
    np.testing.assert_array_equal(t.ends, [5.0, 20.0, 60.5])
    np.testing.assert_array_equal(t.period, [5.0, 100.0, 30.0])
    assert t.path == str(path) and len(t) == 3


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def write_pickle(path: Path, data: Any, protocol: int = pickle.DEFAULT_PROTOCOL) -> Path:
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=protocol)
    return path


def refused(read: Callable[..., Any], path: Path, where: str, *problems: str, **kw: Any) -> str:
    """Reading ``path`` is one one-line TraceError (a ConfigError) naming the field, the file and each problem."""
    with pytest.raises(TraceError) as err:
        read(path, **kw)
    msg = str(err.value)
    assert isinstance(err.value, ConfigError)
    assert msg.startswith(f"{where}: {path}: "), msg
    for p in problems:
        assert p in msg, msg
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- every format, the same arrays


def test_capacity_reads_the_same_from_every_format(tmp_path: Path) -> None:
    files = [
        write_json(tmp_path / "dict.json", {str(k): v for k, v in CAPACITY.items()}),
        write_json(tmp_path / "list.json", [{"id": k, **v} for k, v in CAPACITY.items()]),
        write_json(tmp_path / "list2.json", [{"client_id": str(k), **v} for k, v in CAPACITY.items()]),
        write_pickle(tmp_path / "fedscale.pkl", CAPACITY),
    ]
    csv = tmp_path / "cap.csv"
    csv.write_text("id,computation,communication\n3,12.5,800\n1,40,2500.5\n2,7,12000\n")
    files.append(csv)
    pq = tmp_path / "cap.parquet"
    pd.DataFrame([{"id": k, **v} for k, v in CAPACITY.items()]).to_parquet(pq)
    files.append(pq)
    for f in files:
        check_capacity(read_capacity(f), f)
    other = tmp_path / "cap.txt"  # any extension with the format named
    other.write_bytes(csv.read_bytes())
    check_capacity(read_capacity(other, fmt="csv"), other)


def test_availability_reads_the_same_from_every_format(tmp_path: Path) -> None:
    files = [
        write_json(tmp_path / "dict.json", {str(k): v for k, v in AVAILABILITY.items()}),
        write_json(tmp_path / "list.json", [{"id": k, **v} for k, v in AVAILABILITY.items()]),
        write_pickle(tmp_path / "fedscale.pickle", AVAILABILITY),
    ]
    csv = tmp_path / "av.csv"  # rows of one client need not be adjacent; a client never online: empty cells
    csv.write_text("id,active,inactive,finish_time,duration\n2,10,20,100,100\n7,,,30,0\n1,0,5,5,5\n2,50,60.5,100,100\n")
    files.append(csv)
    rows = [{"id": 2, "active": 10.0, "inactive": 20.0, "finish_time": 100.0},
            {"id": 1, "active": 0.0, "inactive": 5.0, "finish_time": 5.0},
            {"id": 7, "active": None, "inactive": None, "finish_time": 30.0},
            {"id": 2, "active": 50.0, "inactive": 60.5, "finish_time": 100.0}]
    pq = tmp_path / "av.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    files.append(pq)
    for f in files:
        check_availability(read_availability(f), f)


@pytest.mark.parametrize("protocol", range(6))
def test_fedscale_pickles_of_every_protocol(tmp_path: Path, protocol: int) -> None:
    check_capacity(read_capacity(write_pickle(tmp_path / "c.pkl", CAPACITY, protocol)), tmp_path / "c.pkl")
    check_availability(read_availability(write_pickle(tmp_path / "a.pkl", AVAILABILITY, protocol)),
                       tmp_path / "a.pkl")


def test_a_large_table_reads_vectorised(tmp_path: Path) -> None:
    n = 100_000
    rng = np.random.default_rng(0)
    ids = rng.permutation(n) + 1
    pd.DataFrame({"id": ids, "computation": rng.uniform(1, 100, n), "communication": rng.uniform(100, 1e4, n)}
                 ).to_csv(tmp_path / "c.csv", index=False)
    t = read_capacity(tmp_path / "c.csv")
    np.testing.assert_array_equal(t.ids, np.arange(1, n + 1))
    rid = np.repeat(ids, 3)
    start = np.tile([0.0, 100.0, 200.0], n)
    df = pd.DataFrame({"id": rid, "active": start, "inactive": start + 50, "finish_time": 300.0})
    df.to_csv(tmp_path / "a.csv", index=False)
    df.to_parquet(tmp_path / "a.parquet")
    for f in ("a.csv", "a.parquet"):
        a = read_availability(tmp_path / f)
        np.testing.assert_array_equal(a.offsets, np.arange(0, 3 * n + 1, 3))
        np.testing.assert_array_equal(a.ends - a.starts, np.full(3 * n, 50.0))


# ---------------------------------------------------------------- files, formats, pickles


def test_missing_file_unknown_format_and_extension(tmp_path: Path) -> None:
    refused(read_capacity, tmp_path / "nope.json", CAP_FIELD, "no such file")
    f = write_json(tmp_path / "c.json", {})
    msg = refused(read_capacity, f, CAP_FIELD, "unknown trace format 'xml'", fmt="xml")
    assert all(name in msg for name in TRACE_FORMATS)
    odd = tmp_path / "c.dat"
    odd.write_text("{}")
    refused(read_availability, odd, AV_FIELD, "cannot tell the trace format", "'.dat'", "pickle")
    refused(read_capacity, tmp_path, CAP_FIELD, "is a directory")
    refused(read_capacity, f, "devices.other", "holds no clients", field="devices.other")


class Hostile:
    """Unpickling this creates a file: what a trace pickle from the internet might do."""

    def __init__(self, target: Path) -> None:
        self.target = str(target)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.target, "w"))


def test_a_hostile_pickle_runs_nothing(tmp_path: Path) -> None:
    payload = pickle.dumps({1: {"computation": Hostile(tmp_path / "pwned"), "communication": 1.0}})
    pickle.loads(pickle.dumps(Hostile(tmp_path / "proof"))).close()  # the payload is real: plain pickle runs it
    assert (tmp_path / "proof").exists()
    f = tmp_path / "trace.pkl"
    f.write_bytes(payload)
    for read, field in ((read_capacity, CAP_FIELD), (read_availability, AV_FIELD)):
        refused(read, f, field, "the pickle names", "open", "refused")
        assert not (tmp_path / "pwned").exists()


def test_a_pickle_naming_any_global_is_refused(tmp_path: Path) -> None:
    class System:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    f = tmp_path / "t.pkl"
    f.write_bytes(pickle.dumps(System(), protocol=0))
    refused(read_capacity, f, CAP_FIELD, "system", "a class or function")
    numpy_values = {1: {"computation": np.float64(3.0), "communication": np.float32(2.0)}}
    refused(read_capacity, write_pickle(f, numpy_values), CAP_FIELD, "the pickle names numpy")
    assert not (tmp_path / "pwned").exists()


def test_truncated_and_garbage_pickles(tmp_path: Path) -> None:
    f = tmp_path / "t.pkl"
    f.write_bytes(pickle.dumps(CAPACITY)[:-7])
    refused(read_capacity, f, CAP_FIELD, "not a readable pickle")
    f.write_bytes(b"\x00garbage\xff" * 10)
    refused(read_capacity, f, CAP_FIELD, "not a readable pickle")
    f.write_bytes(b"")
    refused(read_availability, f, AV_FIELD, "not a readable pickle")
    refused(read_capacity, write_pickle(f, 42), CAP_FIELD, "holds a int", "dict of client id")


def test_bad_json_and_csv_files(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_text('{"1": {"computation": 1,')
    refused(read_capacity, f, CAP_FIELD, "not valid JSON", "line 1")
    c = tmp_path / "c.csv"
    c.write_text("")
    refused(read_capacity, c, CAP_FIELD, "an empty file", "id,computation,communication")
    c.write_text('id,computation,communication\n1,"2,3\n')
    refused(read_capacity, c, CAP_FIELD, "not a readable CSV")


def test_trace_error_is_a_config_error_that_crosses_processes() -> None:
    err = TraceError(CAP_FIELD, "/x/c.pkl", "holds no clients")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is TraceError and str(back) == str(err) == f"{CAP_FIELD}: /x/c.pkl: holds no clients"
    assert isinstance(back, ConfigError) and isinstance(back, ValueError) and back.field == CAP_FIELD


# ---------------------------------------------------------------- capacity values


def cap(**fields: Any) -> dict[str, Any]:
    return {"computation": 10.0, "communication": 100.0, **fields}


@pytest.mark.parametrize(("data", "problems"), [
    ({"5": {"computation": 1.0}}, ["client 5", "no 'communication' key"]),
    ({"5": cap(computation=float("nan"))}, ["client 5", "computation", "nan", "finite number > 0"]),
    ({"5": cap(computation=float("inf"))}, ["client 5", "computation", "inf"]),
    ({"5": cap(computation=0)}, ["client 5", "computation", "0.0", "> 0"]),
    ({"1": cap(), "5": cap(communication=-3)}, ["client 5", "communication", "-3.0"]),
    ({"5": cap(computation="fast")}, ["client 5", "computation is 'fast'", "must be a number"]),
    ({"5": cap(computation=True)}, ["client 5", "must be a number"]),
    ({"1": cap(), "01": cap()}, ["client 1 appears more than once"]),
    ([{"id": 4, **cap()}, {"id": "4", **cap()}], ["client 4 appears more than once"]),
    ({}, ["holds no clients"]),
    ([], ["holds no clients"]),
    ({"abc": cap()}, ["client id 'abc'", "non-negative integer"]),
    ([{"id": -2, **cap()}], ["client id -2"]),
    ([cap()], ["record 0 has no id key"]),
    ([{"id": 1, "client_id": 1, **cap()}], ["record 0 has both id and client_id"]),
    ([[1, 2.0, 3.0]], ["record 0 is a list"]),
    ("1,2,3", ["holds a str", "dict of client id"]),
    ({"5": [1.0, 2.0]}, ["client 5", "record is a list"]),
])
def test_capacity_values_are_checked(tmp_path: Path, data: Any, problems: list[str]) -> None:
    refused(read_capacity, write_json(tmp_path / "c.json", data), CAP_FIELD, *problems)


@pytest.mark.parametrize(("text", "problems"), [
    ("id,computation\n1,2\n", ["no communication column", "id,computation,communication"]),
    ("client,computation,communication\n1,2,3\n", ["no id column"]),
    ("id,computation,communication,speed\n1,2,3,4\n", ["unknown column speed"]),
    ("id,computation,communication\n1,2,3\n1,4,5\n", ["client 1 appears more than once"]),
    ("id,computation,communication\n", ["holds no clients"]),
    ("id,computation,communication\n1,,3\n", ["client 1", "computation", "nan"]),
    ("id,computation,communication\n1,2,nan\n", ["client 1", "communication", "nan"]),
    ("id,computation,communication\n1,2,0\n", ["client 1", "communication", "0.0"]),
    ("id,computation,communication\n1,fast,3\n", ["client 1", "computation is 'fast'"]),
    ("id,computation,communication\nx1,2,3\n", ["client id 'x1'"]),
    ("id,computation,communication\n,2,3\n", ["client id ''"]),
    ("id,computation,communication\n1.5,2,3\n", ["client id '1.5'"]),
    ("id,computation,communication\n-1,2,3\n", ["client id -1"]),
    ("id,computation,communication\n1,inf,3\n", ["client 1", "computation", "inf"]),
    ("id,client_id,computation,communication\n1,1,2,3\n", ["both id and client_id columns"]),
])
def test_capacity_tables_are_checked(tmp_path: Path, text: str, problems: list[str]) -> None:
    f = tmp_path / "c.csv"
    f.write_text(text)
    refused(read_capacity, f, CAP_FIELD, *problems)


def test_capacity_parquet_is_checked(tmp_path: Path) -> None:
    f = tmp_path / "c.parquet"
    pd.DataFrame({"id": [1, 2], "computation": [1.0, -1.0], "communication": [3.0, 4.0]}).to_parquet(f)
    refused(read_capacity, f, CAP_FIELD, "client 2", "computation", "-1.0")
    pd.DataFrame({"id": [1.5], "computation": [1.0], "communication": [3.0]}).to_parquet(f)
    refused(read_capacity, f, CAP_FIELD, "id column holds double", "integers")
    pd.DataFrame({"id": [1], "computation": ["x"], "communication": [3.0]}).to_parquet(f)
    refused(read_capacity, f, CAP_FIELD, "computation column holds", "numbers")
    pd.DataFrame({"id": [1], "computation": [1.0]}).to_parquet(f)
    refused(read_capacity, f, CAP_FIELD, "no communication column")
    f.write_bytes(b"not parquet at all")
    refused(read_capacity, f, CAP_FIELD, "not a readable parquet file")


# ---------------------------------------------------------------- availability values


def av(active: Any, inactive: Any, finish: Any = 100.0) -> dict[str, Any]:
    return {"active": active, "inactive": inactive, "finish_time": finish}


@pytest.mark.parametrize(("data", "problems"), [
    ({"3": av([0, 10], [5])}, ["client 3", "different lengths"]),
    ({"3": av([0, float("nan")], [5, 20])}, ["client 3", "active time nan", "finite"]),
    ({"3": av([0], [float("nan")])}, ["client 3", "inactive time nan"]),
    ({"3": av([-1], [5])}, ["client 3", "active time -1.0", ">= 0"]),
    ({"3": av([5], [5])}, ["client 3", "[5.0, 5.0]", "inactive <= active"]),
    ({"3": av([5], [2])}, ["client 3", "inactive <= active"]),
    ({"3": av([10, 0], [20, 5])}, ["client 3", "not sorted or overlap"]),
    ({"3": av([0, 4], [5, 9])}, ["client 3", "[0.0, 5.0] and [4.0, 9.0]", "not sorted or overlap"]),
    ({"3": av([0], [5], 0)}, ["client 3", "finish_time", "0.0", "> 0"]),
    ({"3": av([], [], -5)}, ["client 3", "finish_time", "-5.0"]),
    ({"3": av([0], [50], 40)}, ["client 3", "finish_time 40.0 is smaller than its last inactive time 50.0"]),
    ({"3": av([0], [5], float("nan"))}, ["client 3", "finish_time", "nan"]),
    ({"3": {"active": [0], "inactive": [5]}}, ["client 3", "no 'finish_time' key"]),
    ({"3": av([0], [5]), "03": av([0], [5])}, ["client 3 appears more than once"]),
    ({}, ["holds no clients"]),
    ({"3": av("0", [5])}, ["client 3", "active is a str"]),
    ({"3": av([0], ["5"])}, ["client 3", "inactive holds '5'", "numbers"]),
])
def test_availability_values_are_checked(tmp_path: Path, data: Any, problems: list[str]) -> None:
    refused(read_availability, write_json(tmp_path / "a.json", data), AV_FIELD, *problems)


def test_touching_intervals_and_a_period_equal_to_the_last_end_are_fine(tmp_path: Path) -> None:
    t = read_availability(write_json(tmp_path / "a.json", {"9": av([0, 5], [5, 10], 10)}))
    np.testing.assert_array_equal(t.starts, [0, 5])
    np.testing.assert_array_equal(t.ends, [5, 10])


HEADER = "id,active,inactive,finish_time\n"


@pytest.mark.parametrize(("body", "problems"), [
    ("1,0,,10\n", ["client 1", "a row with active but no inactive", "different lengths"]),
    ("1,,5,10\n", ["client 1", "a row with inactive but no active"]),
    ("1,0,5,10\n1,,,10\n", ["client 1", "a row with no interval among its 2 rows"]),
    ("1,0,5,10\n1,6,8,12\n", ["client 1", "finish_time differs between its rows (10.0 and 12.0)"]),
    ("1,0,5,\n", ["client 1", "finish_time is empty"]),
    ("1,nan,5,10\n", ["client 1", "active time nan"]),
    ("1,0,5,10\n1,3,8,10\n", ["client 1", "not sorted or overlap"]),
    ("2,0,5,10\n2,6,8,7\n", ["client 2", "finish_time differs"]),
    ("2,0,50,10\n", ["client 2", "smaller than its last inactive time 50.0"]),
    ("", ["holds no clients"]),
])
def test_availability_tables_are_checked(tmp_path: Path, body: str, problems: list[str]) -> None:
    f = tmp_path / "a.csv"
    f.write_text(HEADER + body)
    refused(read_availability, f, AV_FIELD, *problems)


def test_availability_columns_are_checked(tmp_path: Path) -> None:
    f = tmp_path / "a.csv"
    f.write_text("id,active,inactive\n1,0,5\n")
    refused(read_availability, f, AV_FIELD, "no finish_time column", "id,active,inactive,finish_time")
    f.write_text("id,active,inactive,finish_time,model\n1,0,5,10,X\n")
    refused(read_availability, f, AV_FIELD, "unknown column model", "optionally duration")


def test_availability_parquet_tells_nan_from_empty(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "a.parquet"
    nan = float("nan")
    pq.write_table(pa.table({"id": [1, 2], "active": pa.array([0.0, nan]), "inactive": [5.0, 6.0],
                             "finish_time": [10.0, 10.0]}), f)
    refused(read_availability, f, AV_FIELD, "client 2", "active time nan")
    pq.write_table(pa.table({"id": [1, 2], "active": pa.array([0.0, None]), "inactive": pa.array([5.0, None]),
                             "finish_time": [10.0, 10.0]}), f)
    t = read_availability(f)
    np.testing.assert_array_equal(t.offsets, [0, 1, 1])
    pq.write_table(pa.table({"id": ["5"], "active": pa.nulls(1), "inactive": pa.nulls(1), "finish_time": [3]}), f)
    t = read_availability(f)  # string ids, an all-empty (null-typed) column, an integer period
    np.testing.assert_array_equal(t.ids, [5])
    np.testing.assert_array_equal(t.offsets, [0, 0])
    assert t.period.dtype == np.float64 and t.period[0] == 3.0


# ---------------------------------------------------------------- which trace row each device uses


def test_trace_rows_by_hand() -> None:
    ids = np.array([4, 9, 20], dtype=np.int64)
    rows = trace_rows(6, ids, seed=7)
    draws = np.random.default_rng([7, 0x7ACE, 0]).integers(0, 3, size=ROW_BLOCK)
    assert rows.dtype == np.int64
    np.testing.assert_array_equal(rows, [0, 1, 2, draws[3], draws[4], draws[5]])
    np.testing.assert_array_equal(trace_rows(2, ids, seed=7), [0, 1])  # fewer devices than clients
    np.testing.assert_array_equal(trace_rows(0, ids, seed=7), np.zeros(0, dtype=np.int64))
    np.testing.assert_array_equal(trace_rows(6, ids, seed=7), rows)  # deterministic


def test_trace_rows_beyond_one_block_of_clients() -> None:
    n, num = 5000, 9000
    rows = trace_rows(num, np.arange(n), seed=1)
    np.testing.assert_array_equal(rows[:n], np.arange(n))
    b1 = np.random.default_rng([1, 0x7ACE, 1]).integers(0, n, size=ROW_BLOCK)
    b2 = np.random.default_rng([1, 0x7ACE, 2]).integers(0, n, size=ROW_BLOCK)
    np.testing.assert_array_equal(rows[n:2 * ROW_BLOCK], b1[n - ROW_BLOCK:])
    np.testing.assert_array_equal(rows[2 * ROW_BLOCK:], b2[:num - 2 * ROW_BLOCK])


def test_trace_rows_blocks_are_independent() -> None:
    ids = np.arange(10)
    three = trace_rows(3 * ROW_BLOCK, ids, seed=3)
    five = trace_rows(5 * ROW_BLOCK, ids, seed=3)
    block2 = slice(2 * ROW_BLOCK, 3 * ROW_BLOCK)
    np.testing.assert_array_equal(three[block2], five[block2])
    part = trace_rows(2 * ROW_BLOCK + 100, ids, seed=3)  # a partial last block: the same rows
    np.testing.assert_array_equal(part[2 * ROW_BLOCK:], five[2 * ROW_BLOCK:2 * ROW_BLOCK + 100])
    np.testing.assert_array_equal(three, five[:3 * ROW_BLOCK])
    assert five.min() >= 0 and five.max() < 10
    assert set(np.unique(five[10:]).tolist()) == set(range(10))  # every row in use
    assert not np.array_equal(trace_rows(3 * ROW_BLOCK, ids, seed=4), three)


def test_trace_rows_refuses_an_empty_trace_and_negative_arguments() -> None:
    with pytest.raises(ValueError, match="at least one client"):
        trace_rows(3, np.zeros(0, dtype=np.int64), 0)
    with pytest.raises(ValueError, match=">= 0"):
        trace_rows(-1, np.arange(3), 0)
    with pytest.raises(ValueError, match=">= 0"):
        trace_rows(3, np.arange(3), -1)
