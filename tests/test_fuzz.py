"""Property-based fuzzing (Hypothesis) of what users and crashes hand lcfed: configs, ``lcfed run --set``,
partitions, checkpoints, checkpoint writes killed midway, and the device model.

Every test is seeded (``derandomize``: the same examples on every run and machine, no example database) and
bounded (``max_examples``, ``deadline``), so the file runs in well under a minute on two cores. A failure
prints the smallest input that shows it; ``pytest --hypothesis-show-statistics tests/test_fuzz.py`` says how
many examples each property ran.

1. configs: any config (a mapping, ``--set`` overrides or a YAML file) validates or is one ConfigError line
   naming a field; nothing else is raised and nothing is created;
2. the CLI: ``lcfed run --set ...`` exits 0, or 2 with one line on stderr (1, one line, for a learning rate
   the data diverges at), and what ``lcfed run`` checks before any work refuses in one line or partitions;
3. partitions: each sample used at most once, train and test disjoint, every device at least
   ``data.min_samples``, the same seed the same partition; or one ConfigError line;
4. checkpoints: encode/decode round-trips exactly; a damaged or incomplete checkpoint is one
   CheckpointError line;
5. kill points: a checkpoint write killed at any step leaves a checkpoint that loads (the old or the new),
   and resuming from it is bit-identical to the run that was never killed;
6. the device model: any ``devices``/``network`` section is one ConfigError line naming one of their fields,
   or a fleet whose schedule keeps its invariants (the clock never goes back, kept <= selected <= online, every
   aggregation ends or is stopped in one line, the same seed the same schedule); availability traces in every
   format, pathological values and bytes included, read into checked arrays or are one TraceError line.

``LCFED_FUZZ_SCALE=10`` runs ten times the examples (still seeded) for a deeper search.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import string
import tempfile
import types
import typing
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, Phase, assume, event, given, note, settings
from hypothesis import strategies as st

from lcfed import registry
from lcfed.config import ExperimentConfig, field_types, from_dict, load_config, to_dict
from lcfed.config.overrides import apply_overrides
from lcfed.data import DataError, Dataset
from lcfed.engines.local import run_local
from lcfed.errors import ConfigError, printable
from lcfed.run import checkpoint
from lcfed.run.loop import load_resume
from lcfed.run.sources import check_against_data, load, load_source
from tests.conftest import TINY, same_history, tiny_config
from tune_jobs.cli import main
from tune_jobs.run_command import checked_partition_stats

#: every test's settings: the same examples each run (derandomize), no ``.hypothesis`` database written, the
#: fixtures (a working directory that must stay empty, capsys) shared by a test's examples on purpose
FUZZ = settings(derandomize=True, database=None, print_blob=False, phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])


def _n(examples: int) -> int:
    """``examples``, times ``$LCFED_FUZZ_SCALE`` (default 1): ``LCFED_FUZZ_SCALE=10`` digs ten times deeper."""
    return max(1, round(examples * float(os.environ.get("LCFED_FUZZ_SCALE", "1"))))


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory that is also ``$HOME``: what a property creates shows up here."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- 1. configs ---------------------------------------------------------------------------------------------

_DEFAULTS = load_config()
#: every field a config can set: the sections' and every built-in method's parameters
FIELDS: dict[str, Any] = dict(field_types(_DEFAULTS))
for _entry in registry.names("method"):
    if _entry.origin == "built-in":
        FIELDS.update(field_types(dataclasses.replace(
            _DEFAULTS, method=dataclasses.replace(_DEFAULTS.method, params=registry.method(_entry.name).params()))))
SECTIONS = sorted({key.split(".")[0] for key in FIELDS})
#: fields naming a plugin by ``package.module:attr``: a fuzzed name must not import whatever module it spells
#: (plugin paths have their rows in tests/test_bad_inputs.py)
PLUGIN_NAMED = ("method.name", "model.name", "data.dataset")
#: the flags a config error may name instead of a field
FLAGS = ("--set", "--config", "<config>")
#: values the fields take, so that generated configs also get past the type checks to the range checks
WORDS = ["digits", "synthetic", "leaf_synthetic", "mnist", "file", "iid", "dirichlet", "pathological",
         "primary_secondary", "natural", "rebalance", "niid_bench", "standardize", "unit", "local", "ray", "auto",
         "always", "never", "cpu", "cuda", "portable", "native", "diurnal", "trace", "random", "groups", "sync",
         "async", "sqrt", "constant", "rotated", "label_permuted", "feature_shift", "none", "largest", "lenet5",
         "cnn", "mlp", "npz", "csv", "json", "ward", "average", "fo", "hf", "lcfed", "fedavg", "fedac", "dcpfl",
         "flhc", "ifca", "sqlite:///x.db", "http://127.0.0.1:9", "label", "device", "/tmp", "~/x", "../x", "a/b"]

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=40),
    st.integers(),
    st.sampled_from([2**31, 2**63, 10**30, -(2**63)]),
    st.floats(min_value=-1.5, max_value=2.5),
    st.floats(),  # nan, inf, -0.0, 1e308 and the subnormals
    st.sampled_from(WORDS),
    st.text(max_size=12),
    st.sampled_from(["", " ", "1e-3", ".inf", ".nan", "null", "~", "yes", "off", "é", "\u202e", "a\nb", "\x00"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=5)
KEYS = st.one_of(
    st.sampled_from(sorted(FIELDS)),
    st.sampled_from(SECTIONS),
    st.builds(lambda s, k: f"{s}.{k}", st.sampled_from(SECTIONS), st.text(string.ascii_lowercase + "_", min_size=1,
                                                                            max_size=10)),
    st.text(string.ascii_letters + "._-", min_size=1, max_size=12),
)


def _typed(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of a field's type, near its range: what gets past the type check to the range checks."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_typed(a) for a in args])
    if origin is tuple:
        return st.lists(_typed(args[0]), max_size=3)
    return {int: st.integers(-3, 100) | st.sampled_from([2**31, 10**12]), bool: st.booleans(), type(None): st.none(),
            float: st.floats(-1, 2) | st.floats(0, 1e6) | st.sampled_from([1e308, 5e-324]),
            str: st.sampled_from(WORDS)}.get(annotation, SCALARS)


ITEMS = st.lists(st.one_of(
    st.tuples(KEYS, VALUES),
    st.sampled_from(sorted(FIELDS)).flatmap(lambda k: st.tuples(st.just(k), _typed(FIELDS[k]))),
), max_size=5)


def _no_plugin_path(value: Any) -> Any:
    return value.replace(":", "") if isinstance(value, str) else value


def _safe(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    out = []
    for key, value in items:
        if key in PLUGIN_NAMED or key.split(".")[0] == key and isinstance(value, dict):
            value = _no_plugin_path(value) if not isinstance(value, dict) else {
                k: _no_plugin_path(v) for k, v in value.items()}
        out.append((key, value))
    return out


def _named(exc: ConfigError, keys: list[str]) -> bool:
    """The error names a field (or a flag): a config field, a key given, or a part of one."""
    field = exc.field
    return (field in FIELDS or field in FLAGS or any(field == k or field.startswith(k + ".") or k.startswith(field + ".")
                                                     for k in keys))


def _validates_or_names_a_field(build: Callable[[], ExperimentConfig], keys: list[str]) -> ExperimentConfig | None:
    """``build()``'s config, or None after checking its ConfigError: one line, starting with the field it names."""
    try:
        cfg = build()
    except ConfigError as exc:
        message = str(exc)
        note(f"refused: {message}")
        top = exc.field.split(".")[0]
        event(f"refused: {top if top in SECTIONS or top in FLAGS else 'an unknown section'}")
        assert "\n" not in message and "\r" not in message, message  # a typed key's control characters escaped
        assert message.startswith(f"{printable(exc.field)}: "), message
        assert _named(exc, keys), message
        return None
    assert isinstance(cfg, ExperimentConfig)
    event("validated")
    # what validated prints and reads back as itself (`lcfed config > c.yaml; lcfed run -c c.yaml`), and digests
    again = from_dict(yaml.safe_load(yaml.safe_dump(to_dict(cfg), sort_keys=False)))
    assert again == cfg and again.digest() == cfg.digest()
    return cfg


def _flow(value: Any) -> str:
    """``value`` as the text of ``--set key=TEXT`` (YAML on one line)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


@settings(FUZZ, max_examples=_n(300), deadline=5000)
@given(items=ITEMS)
def test_config_mapping_validates_or_names_a_field(items, empty_cwd):
    items = _safe(items)
    raw = apply_overrides({}, items)
    _validates_or_names_a_field(lambda: from_dict(raw), [k for k, _ in items])
    assert _tree(empty_cwd) == []


@settings(FUZZ, max_examples=_n(300), deadline=5000)
@given(items=ITEMS, raw_text=st.lists(st.tuples(KEYS, st.text(max_size=16)), max_size=2))
def test_set_overrides_validate_or_name_a_field(items, raw_text, empty_cwd):
    """``--set key=value`` as the CLI passes it: the value as YAML text, or any text at all."""
    sets = [f"{k}={_flow(v)}" for k, v in _safe(items)] + [f"{k}={_no_plugin_path(t)}" for k, t in raw_text]
    note(f"--set {sets}")
    _validates_or_names_a_field(lambda: load_config(None, sets), [k for k, _ in items] + [k for k, _ in raw_text])
    assert _tree(empty_cwd) == []


@settings(FUZZ, max_examples=_n(150), deadline=5000)
@given(content=st.one_of(
    st.builds(lambda items: yaml.safe_dump(apply_overrides({}, _safe(items)), allow_unicode=True), ITEMS),
    st.text(max_size=60).map(lambda t: t.replace(":", ": ")),
    st.binary(max_size=40),
))
def test_config_file_validates_or_names_a_field(content, empty_cwd):
    """``-c FILE``: YAML of generated configs, any text, any bytes."""
    path = empty_cwd / "c.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    keys = list(FIELDS) + SECTIONS
    try:
        raw = yaml.safe_load(content) if isinstance(content, str) else None
    except yaml.YAMLError:
        raw = None
    if isinstance(raw, dict):
        keys += [str(k) for k in raw]
        assume(not any(isinstance(v, str) and ":" in v for v in _leaves(raw)))
    _validates_or_names_a_field(lambda: load_config(path), keys)
    assert _tree(empty_cwd) == ["c.yaml"]


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


# -- 2. the CLI ---------------------------------------------------------------------------------------------

#: the tiny run's settings as --set (conftest's TINY: a run of about a second)
TINY_SETS = [f"{section}.{k}={_flow(v)}" for section, fields in TINY.items() for k, v in fields.items()]
#: fields whose valid values keep the tiny run tiny; the budget's are drawn small or out of range
CHEAP = {
    "seed": st.integers(-2, 2**31), "train.lr": st.floats(-1, 10), "train.batch_size": st.integers(-1, 64),
    "train.participation": st.floats(-0.5, 1.5), "train.eval_every": st.integers(-1, 4),
    "train.rounds": st.integers(-1, 3), "train.local_steps": st.integers(-1, 3),
    "data.alpha": st.floats(-1, 5), "data.num_devices": st.integers(-1, 12), "data.min_samples": st.integers(0, 60),
    "data.classes_per_device": st.integers(-1, 12), "data.test_fraction": st.floats(-0.5, 1.5),
    "data.partition": st.sampled_from(["iid", "dirichlet", "pathological", "primary_secondary", "natural", "x"]),
    "data.val_fraction": st.floats(-0.2, 1), "data.holdout_fraction": st.floats(-0.2, 1),
    "data.min_test_samples": st.integers(-1, 20), "data.normalize": st.sampled_from(["unit", "standardize", "z"]),
    "data.samples_per_device": st.lists(st.integers(-5, 200), max_size=3),
    "method.name": st.sampled_from(["fedavg", "standalone", "lcfed", "ifca", "fedper", "nope"]),
    "data.dataset": st.sampled_from(["digits", "leaf_synthetic"]), "data.synthetic_samples": st.integers(-1, 500),
    "method.num_clusters": st.integers(-1, 9), "model.name": st.sampled_from(["lenet5", "mlp", "cnn", "resnet"]),
    "engine.torch_threads": st.integers(-1, 3), "tracking.summary_evals": st.integers(-1, 4),
}
_CHEAP = st.sampled_from(sorted(CHEAP)).flatmap(lambda k: CHEAP[k].map(lambda v: (k, v)))
CLI_OVERRIDES = st.lists(st.one_of(
    _CHEAP, _CHEAP, _CHEAP,  # mostly values that may run
    st.sampled_from(sorted(CHEAP)).flatmap(lambda k: SCALARS.map(lambda v: (k, v))),
    st.tuples(KEYS, SCALARS),
), min_size=1, max_size=3)


@settings(FUZZ, max_examples=_n(8), deadline=60_000)
@given(overrides=CLI_OVERRIDES)
def test_cli_run_is_done_or_one_line(overrides, empty_cwd, capsys):
    """A tiny run with generated overrides: done (0), refused in one line (2), or, for a learning rate too high
    for the data, diverged (1, one line)."""
    sets = [f"{k}={_flow(_no_plugin_path(v))}" for k, v in overrides]
    argv = ["run", "--no-track", "-q", *(a for s in TINY_SETS + sets for a in ("--set", s))]
    note(f"lcfed {' '.join(argv)}")
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors (a --set value that starts with "-")
        code = exc.code
    out, err = capsys.readouterr()
    event(f"exit {code}")
    assert "Traceback" not in out + err
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("lcfed: "), err
        assert _tree(empty_cwd) == []
    elif code == 1:  # docs/run.md's exit 1: a run that diverged (train.lr too high for the data), one line
        assert len(err.splitlines()) == 1 and "training loss is nan/inf" in err, err
    else:
        assert code == 0, f"exit {code}: {err}"
    for leftover in empty_cwd.iterdir():  # the next example starts in an empty directory again
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()


# -- 3. partitions ------------------------------------------------------------------------------------------

_DIGITS = load_source(_DEFAULTS)  # the embedded digits: milliseconds


def _partition_fields(devices: int, min_samples: int) -> st.SearchStrategy[dict[str, Any]]:
    """A data section: a scheme with its parameters, up to ``devices`` devices of ``min_samples``."""
    return st.fixed_dictionaries({
        "partition": st.sampled_from(["iid", "dirichlet", "pathological", "primary_secondary"]),
        "num_devices": st.integers(1, devices),
        "min_samples": st.integers(2, min_samples),
        "alpha": st.floats(0.01, 10),
        "classes_per_device": st.integers(1, 10),
        "test_fraction": st.floats(0.01, 0.95),
        "min_test_samples": st.integers(0, 6),
        "subset": st.one_of(st.just(0), st.integers(10, 1797)),
        "dirichlet_convention": st.sampled_from(["rebalance", "niid_bench"]),
        "samples_per_device": st.one_of(st.just([]), st.lists(st.integers(2, 300), min_size=2, max_size=2).map(sorted)),
        "val_fraction": st.one_of(st.just(0.0), st.floats(0.05, 0.6)),
        "testbed": st.sampled_from(["none", "none", "rotated", "label_permuted"]),
        "testbed_groups": st.integers(1, 6),
    }, optional={"primary": st.lists(st.floats(0, 0.6), min_size=2, max_size=2).map(sorted)})


PARTITION = _partition_fields(60, 40)


def _labels_strategy() -> st.SearchStrategy[np.ndarray]:
    """Labels of a file dataset: 1-12 classes (some possibly absent) of 0-60 samples each."""
    return st.builds(lambda classes, sizes, absent: np.repeat(
        np.arange(classes, dtype=np.int64), [0 if c in absent else n for c, n in enumerate(sizes[:classes])]),
        st.integers(1, 12), st.lists(st.integers(0, 60), min_size=12, max_size=12), st.sets(st.integers(0, 11)))


def _partition_or_refused(cfg: ExperimentConfig, ds: Dataset) -> Any:
    """The run's partition (:func:`check_against_data`), or None after checking its ConfigError."""
    try:
        return check_against_data(cfg, load(cfg, ds))
    except ConfigError as exc:
        note(f"refused: {exc}")
        event(f"refused: {exc.field}")
        assert "\n" not in str(exc) and exc.field.startswith(("data.", "model.")), str(exc)
        return None


def _check_partition(cfg: ExperimentConfig, ds: Dataset, part: Any) -> None:
    """Each sample at most once (train, test and validation disjoint), every device ``data.min_samples`` or more
    with a training sample, and the same seed the same partition, array for array."""
    d = cfg.data
    n = len(load(cfg, ds).y)
    val = part.val or tuple(np.zeros(0, np.int64) for _ in part.train)
    assert part.num_devices == d.num_devices
    used = np.concatenate([*part.train, *part.test, *val, np.zeros(0, np.int64)])
    assert len(np.unique(used)) == len(used), "a sample is used twice"
    assert ((0 <= used) & (used < n)).all()
    for dev, (tr, te, va) in enumerate(zip(part.train, part.test, val, strict=True)):
        assert not np.intersect1d(tr, te).size and not np.intersect1d(tr, va).size
        size = len(tr) + len(te) + len(va)
        assert size >= d.min_samples, f"device {dev} holds {size} samples < data.min_samples {d.min_samples}"
        assert len(tr) >= 1, f"device {dev} has no training sample"
    event(f"partitioned: {d.partition}{' in a testbed' if d.testbed != 'none' else ''}")
    again = check_against_data(cfg, load(cfg, ds))
    for a, b in zip((*part.train, *part.test, *val, part.groups),
                    (*again.train, *again.test, *(again.val or val), again.groups), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b), "the same seed gave another partition"


@settings(FUZZ, max_examples=_n(120), deadline=10_000)
@given(fields=PARTITION, seed=st.integers(0, 2**31 - 1))
def test_partitions_of_digits(fields, seed):
    """Any scheme, seed, device count and subset of digits (testbeds too) that validates partitions soundly."""
    try:
        cfg = from_dict({"seed": seed, "data": fields, "method": {"name": "fedavg"}, "tracking": {"enabled": False}})
    except ConfigError:
        assume(False)
    part = _partition_or_refused(cfg, _DIGITS)
    if part is not None:
        _check_partition(cfg, _DIGITS, part)


@settings(FUZZ, max_examples=_n(150), deadline=10_000)
@given(fields=_partition_fields(12, 10), seed=st.integers(0, 2**31 - 1), labels=_labels_strategy(), spare=st.integers(0, 3))
def test_partitions_of_any_labels(fields, seed, labels, spare):
    """A file dataset's labels: classes of any sizes, some absent (``num_classes`` = the largest + 1, or more)."""
    fields = {**fields, "subset": 0, "testbed": "none"}
    assume(len(labels) >= 2)
    ds = Dataset("fuzz.npz", np.zeros((len(labels), 1, 28, 28), np.uint8), labels, int(labels.max()) + 1 + spare)
    try:
        cfg = from_dict({"seed": seed, "data": fields, "method": {"name": "fedavg"}, "tracking": {"enabled": False}})
    except ConfigError:
        assume(False)
    note(f"labels {np.bincount(labels).tolist()}")
    part = _partition_or_refused(cfg, ds)
    if part is not None:
        _check_partition(cfg, ds, part)


#: the data section's fields that need no file (a file dataset's are tests/test_data_formats.py's)
DATA_FIELDS = sorted(k for k in FIELDS if k.startswith("data.") and k.split(".")[1] not in (
    "data_dir", "download", "path", "format", "label_column", "device_column", "group_column", "image_size"))
DATA_ITEMS = st.lists(st.one_of(
    st.sampled_from(DATA_FIELDS).flatmap(lambda k: _typed(FIELDS[k]).map(lambda v: (k, v))),
    st.tuples(st.just("data.dataset"), st.sampled_from(["digits", "leaf_synthetic", "synthetic"])),
    st.tuples(st.just("data.partition"), st.sampled_from(["iid", "dirichlet", "pathological", "primary_secondary",
                                                          "natural"])),
    st.tuples(st.just("data.synthetic_samples"), st.integers(0, 3000)),
    st.tuples(st.just("data.num_devices"), st.integers(1, 60)),
    st.tuples(st.just("data.min_samples"), st.integers(0, 80)),
), max_size=6)


#: where the generated configs start: digits, LEAF's generator (natural devices: feature vectors, an MLP),
#: generated images
DATA_BASES = [{}, {"data": {"dataset": "leaf_synthetic", "partition": "natural"}, "model": {"name": "mlp"}},
              {"data": {"dataset": "synthetic", "synthetic_samples": 2000}}]


@settings(FUZZ, max_examples=_n(150), deadline=10_000)
@given(base=st.sampled_from(DATA_BASES), items=DATA_ITEMS, seed=st.integers(0, 2**31 - 1))
def test_a_runs_preflight_refuses_in_one_line_or_partitions(base, items, seed, empty_cwd):
    """What ``lcfed run`` checks before any work (the config, then the data it loads or generates and the
    partition): one ConfigError or DataError line, or a partition with the properties above."""
    raw = apply_overrides({"seed": seed, **base, "method": {"name": "fedavg"}, "tracking": {"enabled": False}}, items)
    data = raw.get("data", {})
    assume(not (data.get("dataset") == "synthetic" and not data.get("synthetic_samples")))  # 60,000: a second each
    try:
        cfg = from_dict(raw)
    except ConfigError as exc:
        event(f"refused by the config: {exc.field}")
        assert "\n" not in str(exc)
        return
    try:
        stats = checked_partition_stats(cfg)
    except (ConfigError, DataError) as exc:
        note(f"refused: {exc}")
        event(f"refused by the data: {getattr(exc, 'field', type(exc).__name__)}")
        assert "\n" not in str(exc), str(exc)
        return
    assert stats
    source = load_source(cfg)
    _check_partition(cfg, source, check_against_data(cfg, load(cfg, source)))
    assert _tree(empty_cwd) == []


# -- 4. checkpoints -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FuzzState:
    """A state class of this module: checkpoints rebuild it when :func:`checkpoint.decode` allows the module."""

    a: Any
    b: Any = None


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
           torch.uint8, torch.bool, torch.complex64]
_NP_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.uint8, np.uint16, np.bool_,
              np.complex128]
SHAPES = st.lists(st.integers(0, 4), max_size=3).map(tuple)


@st.composite
def _tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype, shape = draw(st.sampled_from(_DTYPES)), draw(SHAPES)
    n = math.prod(shape)
    raw = draw(st.lists(st.floats(-1e4, 1e4) | st.sampled_from([math.nan, math.inf, -0.0]), min_size=n, max_size=n))
    base = torch.tensor(raw, dtype=torch.float64).reshape(shape)
    t = base.to(dtype) if dtype.is_floating_point or dtype.is_complex else base.nan_to_num(0, 0, 0).to(dtype)
    return t.t() if t.dim() == 2 and draw(st.booleans()) else t  # a non-contiguous view too


@st.composite
def _arrays(draw: st.DrawFn) -> np.ndarray:
    dtype, shape = draw(st.sampled_from(_NP_DTYPES)), draw(SHAPES)
    n = math.prod(shape)
    raw = np.array(draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n)), dtype=np.float64).reshape(shape)
    arr = raw.astype(dtype)
    return arr.T if arr.ndim == 2 and draw(st.booleans()) else arr


_NP_SCALARS = st.builds(lambda dtype, v: dtype(v), st.sampled_from([np.float32, np.float64, np.float16, np.int64,
                                                                      np.int8, np.uint32, np.bool_, np.complex64]),
                        st.integers(0, 100))
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), _tensors(), _arrays(),
                   _NP_SCALARS)
HASHABLE = st.one_of(st.integers(), st.text(max_size=4), st.booleans(), st.none(),
                     st.tuples(st.integers(), st.text(max_size=2)))
STATES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(HASHABLE, inner, max_size=3), st.builds(FuzzState, inner, inner)), max_leaves=8)
ALLOWED = (__name__,)


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def _same(a: Any, b: Any) -> bool:
    """Equal, exactly: types, dtypes, shapes and bits (nan equals nan, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and _bits(a) == _bits(b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


@settings(FUZZ, max_examples=_n(200), deadline=5000)
@given(state=STATES)
def test_encode_decode_round_trips_exactly(state):
    """Nested states of tensors (any dtype, 0-d, empty, non-contiguous), arrays, numpy scalars, Python scalars
    (nan, -0.0, big ints), tuples, lists, dicts and this module's dataclass come back exactly as they were."""
    back = checkpoint.decode(checkpoint.encode(state), allowed=ALLOWED)
    assert _same(state, back), (state, back)


SNAPSHOTS = st.builds(
    lambda nxt, server, devices, history, trained: checkpoint.Snapshot(
        nxt, server, devices, history, "d" * 16, {"run_id": "r", "tracking_uri": "sqlite:///m.db"}, trained),
    st.integers(0, 10**6), STATES, st.dictionaries(st.integers(0, 600), STATES, max_size=4),
    st.lists(st.dictionaries(st.sampled_from(["round", "acc_mean", "loss"]), st.floats(), max_size=3), max_size=3),
    st.lists(st.integers(0, 600), max_size=4, unique=True).map(tuple))


def _same_snapshot(a: checkpoint.Snapshot, b: checkpoint.Snapshot) -> bool:
    return (a.next_round == b.next_round and _same(a.server_state, b.server_state)
            and _same(dict(a.device_states), dict(b.device_states)) and _same(a.history, b.history)
            and a.config_digest == b.config_digest and a.tracking == b.tracking and a.trained == b.trained)


@settings(FUZZ, max_examples=_n(60), deadline=10_000)
@given(snap=SNAPSHOTS, part_devices=st.integers(1, 3))
def test_written_checkpoints_load_as_written(snap, part_devices, monkeypatch):
    monkeypatch.setattr(checkpoint, "PART_DEVICES", part_devices)  # several part files
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / checkpoint.MAIN_FILE
        checkpoint.write(path, snap, allowed=ALLOWED)
        assert _same_snapshot(snap, checkpoint.load(path, allowed=ALLOWED))


DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.booleans()),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255), st.booleans()),
    st.tuples(st.just("drop-part"), st.integers(0, 10)),
    st.tuples(st.just("empty"), st.booleans()),
)


@settings(FUZZ, max_examples=_n(200), deadline=10_000)
@given(damage=DAMAGE)
def test_a_damaged_checkpoint_is_refused_in_one_line(damage, monkeypatch):
    """Truncated, a byte flipped, a part missing or empty: one CheckpointError line, or (a byte that no reader
    looks at, such as the zip's padding) exactly what was written."""
    monkeypatch.setattr(checkpoint, "PART_DEVICES", 2)
    snap = checkpoint.Snapshot(4, {"w": torch.arange(300.0), "k": FuzzState(np.arange(5), (1, "a"))},
                               {d: {"v": torch.full((40,), float(d))} for d in range(5)},
                               [{"round": 0.0, "acc_mean": 0.5}], "d" * 16, {"run_id": "r"}, (0, 1, 2))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / checkpoint.MAIN_FILE
        checkpoint.write(path, snap, allowed=ALLOWED)
        parts = sorted(Path(tmp).glob("latest.states-*.pt"))
        kind = damage[0]
        if kind == "drop-part":
            parts[damage[1] % len(parts)].unlink()
        else:
            target = path if damage[-1] else parts[damage[1] % len(parts) if kind != "empty" else 0]
            data = bytearray(target.read_bytes())
            if kind == "truncate":
                data = data[: damage[1] % len(data)]
            elif kind == "flip":
                data[damage[1] % len(data)] ^= damage[2]
            else:
                data = bytearray()
            target.write_bytes(bytes(data))
        with warnings.catch_warnings(record=True) as warned:  # a warning would be another line on stderr
            warnings.simplefilter("always")
            try:
                back = checkpoint.load(path, allowed=ALLOWED)
                got = dict(back.device_states)  # the parts too: a damage that load let through shows here
            except checkpoint.CheckpointError as exc:
                note(f"refused: {exc}")
                event("refused")
                assert "\n" not in str(exc), str(exc)
                back = None
        assert not warned, [str(w.message) for w in warned]
        if back is None:
            return
        event("loaded: the damage changed nothing that is read")
        assert _same_snapshot(snap, dataclasses.replace(back, device_states=got)), "a damaged checkpoint loaded other values"


# -- 5. kill points -----------------------------------------------------------------------------------------

class Killed(BaseException):
    """A write stopped at an injected point (as KeyboardInterrupt would: past ``except Exception``)."""


@contextmanager
def _write_steps(on_step: Callable[[int, int, str], None]) -> Iterator[None]:
    """Call ``on_step(write, step, name)`` before each step of each :func:`checkpoint.write` (both counted from
    0) that touches the disk: a part or the main file about to be written (``write NAME``: its temp file is
    created and saved), renamed into place once saved (``replace NAME``), an old part removed (``unlink NAME``)."""
    write, write_atomic, replace, unlink = checkpoint.write, checkpoint._write_atomic, os.replace, Path.unlink
    at = [-1, 0]  # the write, its next step

    def step(name: str) -> None:
        at[1] += 1
        on_step(at[0], at[1] - 1, name)

    def counted_write(*a: Any, **k: Any) -> Any:
        at[0], at[1] = at[0] + 1, 0
        return write(*a, **k)

    def counted_write_atomic(path: Path, obj: Any) -> None:
        step(f"write {path.name}")
        write_atomic(path, obj)

    def counted_replace(src: Any, dst: Any) -> None:
        step(f"replace {Path(dst).name}")
        replace(src, dst)

    def counted_unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name.startswith("latest.states-"):
            step(f"unlink {self.name}")
        unlink(self, missing_ok=missing_ok)

    mp = pytest.MonkeyPatch()
    mp.setattr(checkpoint, "write", counted_write)
    mp.setattr(checkpoint, "_write_atomic", counted_write_atomic)
    mp.setattr(checkpoint.os, "replace", counted_replace)
    mp.setattr(Path, "unlink", counted_unlink)
    try:
        yield
    finally:
        mp.undo()


KILL_ROUNDS = 2  # a first write and one replacing a checkpoint: a third is the second again


def _kill_cfg(directory: Path) -> ExperimentConfig:
    return tiny_config(f"train.rounds={KILL_ROUNDS}", "train.local_steps=1", f"checkpoint.dir={directory}")


@pytest.fixture(scope="module")
def uninterrupted() -> tuple[list[dict], list[list[str]]]:
    """The run never killed: its history, and the steps of each of its checkpoint writes."""
    steps: list[list[str]] = []

    def record(write: int, step: int, name: str) -> None:
        if step == 0:
            steps.append([])
        steps[write].append(name)

    with tempfile.TemporaryDirectory() as tmp, _write_steps(record):
        history = run_local(_kill_cfg(Path(tmp) / "ck")).history
    return history, steps


def _resume_and_compare(directory: Path, full: list[dict]) -> int:
    """Resume the run from ``directory`` (after its checkpoint loads) to the end; its history must be the
    uninterrupted run's, bit for bit. Returns the round it resumed at."""
    cfg = _kill_cfg(directory)
    snap = load_resume(cfg)
    resumed = run_local(cfg, resume=snap)
    same_history(full, resumed.history)
    if snap is None or snap.next_round < KILL_ROUNDS:  # it wrote checkpoints: nothing of the killed write is left
        parts = {p.file for p in checkpoint.load(directory / checkpoint.MAIN_FILE).device_states.parts}
        assert sorted(p.name for p in directory.iterdir()) == sorted({checkpoint.MAIN_FILE, *parts})
    return 0 if snap is None else snap.next_round


def test_a_write_killed_at_any_step_leaves_a_checkpoint_that_resumes_bit_identically(tmp_path, uninterrupted):
    """SIGKILL before each step of each of the run's checkpoint writes: the disk as it was then (copied aside
    while the run goes on; a kill runs no clean-up) holds the old checkpoint or the new one, and each resumes
    bit-identically."""
    full, steps = uninterrupted
    assert len(steps) == KILL_ROUNDS, steps
    assert all(s[:2] == [s[0], s[0].replace("write", "replace")] and "replace latest.pt" in s for s in steps), steps
    assert all(any(n.startswith("unlink") for n in s) for s in steps[1:]), steps
    live = tmp_path / "live" / "ck"
    images: list[tuple[str, Path]] = []

    def image(write: int, step: int, name: str) -> None:
        copy = tmp_path / "images" / f"{write}-{step}"
        shutil.copytree(live, copy)
        for temp in copy.glob(".ckpt-*.tmp"):  # killed while torch.save wrote it: half of it is on disk
            temp.write_bytes(temp.read_bytes()[: temp.stat().st_size // 2])
        images.append((f"write {write} before {name}", copy))

    with _write_steps(image):
        run_local(_kill_cfg(live))
    images.append(("after the last write", live))
    resumed_at = {what: _resume_and_compare(copy, full) for what, copy in images}
    # each write's kill points keep the previous checkpoint until its main file is replaced, then the new one
    assert sorted(set(resumed_at.values())) == list(range(KILL_ROUNDS + 1)), resumed_at


@settings(FUZZ, max_examples=_n(6), deadline=60_000)
@given(write=st.integers(0, KILL_ROUNDS - 1), step=st.integers(0, 20), error=st.sampled_from([Killed, OSError]))
def test_a_write_interrupted_at_any_step_keeps_a_checkpoint_that_resumes_bit_identically(write, step, error,
                                                                                        uninterrupted):
    """An exception (Ctrl-C's KeyboardInterrupt, a full disk's OSError) at a step of a checkpoint write: the
    write cleans up after itself (no temp file, no part of its own left), the directory holds the previous
    checkpoint or the new one, and resuming from it is bit-identical."""
    full, steps = uninterrupted
    step %= len(steps[write])

    def maybe_fail(w: int, s: int, name: str) -> None:
        if (w, s) == (write, step):
            raise error(f"injected before {name}")

    note(f"write {write} fails before {steps[write][step]}")
    with tempfile.TemporaryDirectory() as tmp:
        live = Path(tmp) / "ck"
        with _write_steps(maybe_fail), pytest.raises(error, match="injected"):
            run_local(_kill_cfg(live))
        left = sorted(p.name for p in live.iterdir())
        note(f"left {left}")
        assert not any(n.startswith(".ckpt-") for n in left), left
        if "latest.pt" in left:
            assert len(checkpoint.load(live / checkpoint.MAIN_FILE).device_states) > 0
        assert _resume_and_compare(live, full) in (write, write + 1)


# -- 6. the device model (issue 49): every devices field, traces in every format, the schedulers' invariants --

_EXTREMES = st.sampled_from([0.0, -1.0, 1e-300, 5e-324, 1e300, 1e308, math.inf, math.nan, 10**400, -(10**400)])
_DEVICE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "speed_sigma": st.floats(0, 6) | _EXTREMES, "bandwidth_sigma": st.floats(0, 6) | _EXTREMES,
    "latency_ms": st.floats(0, 1e5) | _EXTREMES, "availability": st.sampled_from(["always", "diurnal", "iid", "x"]),
    "online_fraction": st.floats(0, 1) | _EXTREMES, "period_hours": st.floats(1e-4, 3) | _EXTREMES,
    "slot_minutes": st.sampled_from([0.5, 1, 5, 7.5, 15, 60]) | _EXTREMES,
    "phase": st.sampled_from(["random", "groups", "x"]), "phase_jitter": st.floats(0, 1) | _EXTREMES,
    "dropout": st.floats(0, 0.99) | _EXTREMES, "deadline_seconds": st.floats(0, 100) | _EXTREMES,
    "overcommit": st.floats(0, 3) | _EXTREMES, "aggregation": st.sampled_from(["sync", "async"]),
    "async_buffer": st.integers(-1, 6), "staleness": st.sampled_from(["sqrt", "constant", "x"]),
}
_NETWORK_FIELDS = {"bandwidth_mbps": st.floats(1e-7, 1e16) | _EXTREMES, "device_gflops": st.floats(1e-7, 1e16) | _EXTREMES}
#: sections inside the limits, so that most examples reach the schedulers (every kind of availability, both
#: aggregations, windows from a few seconds long)
_VALID_DEVICES = st.fixed_dictionaries({
    "availability": st.sampled_from(["always", "diurnal", "iid"]), "online_fraction": st.floats(0.01, 1),
    "period_hours": st.sampled_from([0.25, 0.5, 1.0]), "slot_minutes": st.sampled_from([0.5, 1, 5, 7.5, 15]),
    "phase": st.sampled_from(["random", "groups"]), "dropout": st.floats(0, 0.9),
    "speed_sigma": st.floats(0, 5), "bandwidth_sigma": st.floats(0, 5), "latency_ms": st.floats(0, 1000),
}).flatmap(lambda base: st.one_of(
    st.fixed_dictionaries({"overcommit": st.floats(0, 2)}),
    st.fixed_dictionaries({"aggregation": st.just("async"), "async_buffer": st.integers(1, 4)}),
).map(lambda policy: {**base, **policy}))
_VALID_NETWORK = st.fixed_dictionaries({"bandwidth_mbps": st.floats(0.1, 100), "device_gflops": st.floats(0.01, 100)})


@pytest.fixture(scope="module")
def device_federation() -> Any:
    """The tiny federation every device example schedules (its fleet is made per example)."""
    from lcfed.run.setup import prepare

    return prepare(tiny_config("method.name=fedavg", "train.participation=0.5")).federation


def _schedule(cfg: ExperimentConfig, fed: Any, rounds: int = 3) -> list[Any]:
    """``rounds`` rounds of the config's scheduler from clock 0, checking its invariants on the way: the clock
    never goes back, kept <= selected <= online (sync), every aggregation ends (or is stopped with one line)."""
    from lcfed.devices.buffered import BufferedScheduler
    from lcfed.devices.clock import SimClock
    from lcfed.devices.schedule import Scheduler, make_fleet

    fleet = make_fleet(cfg, fed)
    assert fleet is not None
    size = 4.0 * fed.spec.size
    now, out, pending = 0.0, [], None
    for rnd in range(rounds):
        clock = SimClock(now, size, size)
        if cfg.devices.aggregation == "async":
            planned = BufferedScheduler(cfg, fed, fleet).plan(rnd, clock, pending)
            timing, pending = planned.timing, planned.pending
            assert len(timing.kept) == cfg.devices.async_buffer
        else:
            timing = Scheduler(cfg, fed, fleet).plan(rnd, clock)
            assert len(timing.kept) <= timing.selected <= timing.online
            assert timing.selected == len(timing.kept) + timing.lost
        assert now <= timing.start <= timing.end and math.isfinite(timing.end)
        now = timing.end
        out.append(timing)
    return out


@settings(FUZZ, max_examples=_n(60), deadline=10_000)
@given(devices=_VALID_DEVICES | st.fixed_dictionaries({}, optional=_DEVICE_FIELDS),
       network=_VALID_NETWORK | st.fixed_dictionaries({}, optional=_NETWORK_FIELDS))
def test_devices_section_validates_or_names_a_field_and_schedules(devices, network, device_federation):
    """Any devices/network section: a ConfigError naming one of their fields, or a fleet whose schedule keeps
    the invariants, the same twice from one seed; refusals found while building (never online, no window long
    enough, a buffer that never fills) are ConfigErrors too."""
    raw = apply_overrides(TINY, [("method.name", "fedavg"), ("train.participation", 0.5)])
    raw["devices"], raw["network"] = {"simulate": True, **devices}, network
    try:
        cfg = from_dict(raw)
    except ConfigError as exc:
        assert exc.field.startswith(("devices.", "network.")) and "\n" not in str(exc), exc
        event("refused by the config check")
        return
    try:
        first = _schedule(cfg, device_federation)
    except ConfigError as exc:
        assert exc.field.startswith("devices.") and "\n" not in str(exc), exc
        event(f"refused before or while scheduling ({exc.field})")
        return
    assert _schedule(cfg, device_federation) == first  # the same seed, the same schedule
    event(f"scheduled ({cfg.devices.aggregation}, {cfg.devices.availability})")


_TIMES = st.one_of(st.floats(0, 100), st.sampled_from([-1.0, math.nan, math.inf, 1e308, 5e-324]), st.integers(0, 100))
_IDS = st.one_of(st.integers(0, 20), st.sampled_from([-1, 2**63 - 1, 2**63, 2**64 - 1, 2**64 + 1]))
_RECORDS = st.lists(st.tuples(_IDS, st.lists(st.tuples(_TIMES, _TIMES), max_size=4), _TIMES), max_size=6)


def _sorted_intervals(gaps: list[float]) -> tuple[list[tuple[float, float]], float]:
    """Intervals from alternating offline / online lengths, and a period past the last."""
    t, out = 0.0, []
    for off, on in zip(gaps[::2], gaps[1::2], strict=False):
        out.append((t + off, t + off + on))
        t += off + on
    return out, t + 1.0


_VALID_RECORDS = st.dictionaries(st.integers(0, 50), st.lists(st.floats(0.01, 10), max_size=8), min_size=1,
                                 max_size=6).map(lambda d: [(cid, *_sorted_intervals(g)) for cid, g in d.items()])


def _write_trace(path: Path, fmt: str, records: list[Any]) -> None:
    """Availability records ``(id, [(active, inactive)], finish_time)`` in ``fmt``, as a user's tool would."""
    import json
    import pickle

    if fmt == "pickle":
        path.write_bytes(pickle.dumps({cid: {"active": [a for a, _ in iv], "inactive": [b for _, b in iv],
                                             "finish_time": ft} for cid, iv, ft in records}))
    elif fmt == "json":  # a list of records: repeated ids reach the checks (a dict's would be refused by JSON's)
        path.write_text(json.dumps([{"id": cid, "active": [a for a, _ in iv], "inactive": [b for _, b in iv],
                                     "finish_time": ft} for cid, iv, ft in records]))
    else:
        rows = [(cid, a, b, ft) for cid, iv, ft in records for a, b in iv] + \
               [(cid, None, None, ft) for cid, iv, ft in records if not iv]
        if fmt == "csv":
            path.write_text("id,active,inactive,finish_time\n" + "".join(
                ",".join("" if v is None else repr(v) for v in row) + "\n" for row in rows))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            cols = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
            pq.write_table(pa.table({"id": pa.array([min(c, 2**64 - 1) if c >= 0 else c for c in cols[0]],
                                                    pa.uint64() if all(c >= 0 for c in cols[0]) else pa.int64())
                                     if all(-(2**63) <= c < 2**64 for c in cols[0]) else pa.array([str(c) for c in cols[0]]),
                                     **{k: pa.array([None if v is None else float(v) for v in col], pa.float64())
                                        for k, col in zip(("active", "inactive", "finish_time"), cols[1:], strict=True)}}),
                           path)


@settings(FUZZ, max_examples=_n(80), deadline=10_000)
@given(records=_VALID_RECORDS | _RECORDS, fmt=st.sampled_from(["json", "csv", "parquet", "pickle"]),
       garbage=st.none() | st.binary(max_size=30))
def test_generated_traces_read_or_are_one_line(records, fmt, garbage):
    """A trace in any format, pathological values and bytes included: one TraceError line naming the field and
    the file, or checked arrays a fleet is built from (sorted unique ids, intervals inside their periods)."""
    from lcfed.devices.generators import fleet_from_arrays
    from lcfed.devices.traces import TraceError, read_availability

    suffix = {"json": ".json", "csv": ".csv", "parquet": ".parquet", "pickle": ".pkl"}[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"av{suffix}"
        if garbage is not None:
            path.write_bytes(garbage)
        else:
            try:
                _write_trace(path, fmt, records)
            except (OverflowError, ValueError):  # a value the writer itself cannot store
                assume(False)
        try:
            av = read_availability(path)
        except TraceError as exc:
            text = str(exc)
            assert text.startswith(f"devices.availability_trace: {path}: ") and "\n" not in text, text
            event("refused")
            return
    assert np.all(np.diff(av.ids) > 0) and av.ids.min() >= 0
    n = len(av.ids)
    one = np.ones(n, np.float32)
    fleet = fleet_from_arrays(one, one, one, 0 * one, 0 * one, av.offsets, av.starts, av.ends, av.period)
    assert fleet.num_devices == n
    event("read")


@settings(FUZZ, max_examples=_n(40), deadline=10_000)
@given(records=st.dictionaries(st.integers(0, 50), st.tuples(st.floats(0.1, 1e4), st.floats(0.1, 1e6)), min_size=1,
                               max_size=5).map(lambda d: [(k, *v) for k, v in d.items()])
       | st.lists(st.tuples(_IDS, _TIMES, _TIMES), max_size=5), fmt=st.sampled_from(["json", "csv", "pickle"]))
def test_generated_capacity_traces_read_or_are_one_line(records, fmt):
    """A capacity trace of any values (nan, 0, negative, 1e308, 5e-324, ids past 64 bits): one TraceError line, or
    ids sorted and unique with every speed finite and > 0."""
    import json
    import pickle

    from lcfed.devices.traces import TraceError, read_capacity

    rows = [{"id": cid, "computation": comp, "communication": comm} for cid, comp, comm in records]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("cap.pkl" if fmt == "pickle" else f"cap.{fmt}")
        if fmt == "json":
            path.write_text(json.dumps(rows))
        elif fmt == "pickle":
            path.write_bytes(pickle.dumps(rows))
        else:
            path.write_text("id,computation,communication\n" + "".join(
                f"{r['id']},{r['computation']!r},{r['communication']!r}\n" for r in rows))
        try:
            cap = read_capacity(path)
        except TraceError as exc:
            assert str(exc).startswith(f"devices.capacity_trace: {path}: ") and "\n" not in str(exc), exc
            event("refused")
            return
    assert np.all(np.diff(cap.ids) > 0) and cap.ids.min() >= 0
    assert np.all(np.isfinite(cap.computation_ms) & (cap.computation_ms > 0))
    assert np.all(np.isfinite(cap.communication_kbps) & (cap.communication_kbps > 0))
    event("read")
