"""Numerics profiles (lcfed/numerics.py): the same numbers whatever the outer environment asks of torch's
kernels, the profile recorded with every run, and runs under different numerics told apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

from lcfed import numerics
from lcfed.errors import ConfigError
from lcfed.numerics import provenance
from tests.conftest import TINY, tiny_config
from tests.raycluster import ROOT
from tune_jobs.cli import main

pytestmark = [pytest.mark.subprocess]  # what it starts: `make test-core` leaves it out


AVX2 = numerics.cpu_isa() in ("AVX2", "AVX512")
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the portable level (AVX2) needs an x86-64 CPU with AVX2")
OUTER = [*numerics.KEYS, numerics.ENV_PROFILE, numerics.ENV_OUTER]  # what a fresh shell would not have


def run_cli(tmp_path: Path, name: str, outer: dict[str, str], *extra: str) -> dict:
    """``lcfed run`` of the tiny config in a fresh process whose environment sets ``outer`` (and nothing
    else of the profile's variables); its ``--json`` summary."""
    cfg = tmp_path / "tiny.yaml"
    if not cfg.exists():
        cfg.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "rounds": 4}}))
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k not in OUTER}
    env.update(outer, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tune_jobs.cli", "run", "-c", str(cfg), "--no-track", "-q",
                           "--json", str(out), *extra], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def numbers(summary: dict) -> list[float]:
    keys = ("acc_mean", "acc_weighted", "test_loss", "train_loss")
    return [summary[k] for k in keys] + [summary["last_evals"][k] for k in keys]


@needs_avx2
def test_the_same_numbers_whatever_the_outer_environment_asks(tmp_path):
    """Portable (the default) overrides the outer kernel settings in every process: baseline kernels asked
    for (an older CPU's), AVX2 asked for, or nothing asked (this CPU's own) give one set of numbers.
    ``native`` takes what the environment asks, and there the numbers move: the pinning is what holds them."""
    hostile = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "AVX2",
               "OPENBLAS_CORETYPE": "Sandybridge", "NPY_DISABLE_CPU_FEATURES": "X86_V3"}
    cases = {
        "unset": ({},),
        "default": (hostile,),
        # $LCFED_NUMERICS (what a bare `import lcfed` applies) gives way to the config's profile
        "avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "LCFED_NUMERICS": "native"}, "--set", "engine.numerics=portable"),
        "native": (hostile, "--set", "engine.numerics=native"),
    }
    with ThreadPoolExecutor(2) as pool:  # each process spends most of its time importing torch
        futures = {name: pool.submit(run_cli, tmp_path, name, *args) for name, args in cases.items()}
        runs = {name: f.result() for name, f in futures.items()}
    native = runs.pop("native")
    for name, summary in runs.items():
        p = summary["provenance"]
        assert (p["numerics"], p["kernels"], p["onednn_isa"], p["mkl_cbwr"]) == \
            ("portable", "AVX2", "AVX2", "COMPATIBLE,STRICT"), (name, p)
        if name != "avx2":
            assert p["openblas"] == "Haswell" and p["fingerprint"] == runs["unset"]["provenance"]["fingerprint"], name
        assert numbers(summary) == numbers(runs["unset"]), name
    # numpy loaded under $LCFED_NUMERICS=native keeps its kernels: the record says so, and its fingerprint differs
    late = runs["avx2"]["provenance"]
    if late["openblas"] != "Haswell":
        assert "numpy was loaded before this profile applied" in late["numerics_note"]
        assert late["fingerprint"] != runs["unset"]["provenance"]["fingerprint"]
    assert native["provenance"]["numerics"] == "native" and native["provenance"]["kernels"] == "DEFAULT"
    assert numbers(native) != numbers(runs["unset"])  # other kernels, other numbers
    assert native["provenance"]["fingerprint"] != runs["unset"]["provenance"]["fingerprint"]  # and it says so


@needs_avx2
def test_this_suite_runs_the_portable_kernels():
    """Tests that pin exact trajectories rely on the profile, not on the machine: importing lcfed (the
    conftest does, first) pinned this process before its first tensor op."""
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["MKL_CBWR"] == "COMPATIBLE,STRICT"
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    assert numerics.openblas_cores() == "Haswell"  # numpy and scipy loaded after lcfed pinned them
    from threadpoolctl import threadpool_info

    assert {i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"} == {1}
    assert numerics.state()["profile"] == "portable" and numerics.state()["note"] == ""


def test_profiles_by_hand(monkeypatch):
    env, note = numerics.pinned_env("native")
    assert env == numerics._OUTER and note == ""
    with pytest.raises(numerics.NumericsError, match="fast"):
        numerics.pinned_env("fast")
    monkeypatch.setattr(numerics, "cpu_isa", lambda: "DEFAULT")
    monkeypatch.setattr(numerics, "is_x86", lambda: True)
    env, note = numerics.pinned_env("portable")
    assert env["ATEN_CPU_CAPABILITY"] == "default" and "lacks AVX2" in note
    monkeypatch.setattr(numerics, "is_x86", lambda: False)
    env, note = numerics.pinned_env("portable")
    assert env == numerics._OUTER and "close to an x86-64" in note


def test_differences_name_the_fields_that_decide_the_numbers():
    a = {"numerics": "portable", "kernels": "AVX2", "torch": "2.14.1", "cpu": "A"}
    assert provenance.differences([a, {**a, "cpu": "B"}]) == []  # portable: the CPU model does not matter
    assert provenance.differences([{**a, "numerics": "native"}, {**a, "cpu": "B"}]) == \
        ["numerics: native, portable", "cpu: A, B"]
    assert provenance.differences([a, {}]) == ["numerics: portable, unrecorded", "kernels: AVX2, unrecorded",
                                             "torch: 2.14.1, unrecorded"]


def test_a_bad_profile_is_a_config_error():
    with pytest.raises(ConfigError, match=r"engine\.numerics.*portable.*native"):
        tiny_config("engine.numerics=fast")


def test_the_table_says_when_runs_ran_under_different_numerics(tmp_path, capsys):
    def summary(name: str, provenance: dict) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"method": name, "seed": 0, "rounds": 3, "acc_mean": 0.5,
                                    "last_evals": {"acc_mean": 0.5, "rounds": [3]}, "provenance": provenance}))
        return str(path)

    same = {"numerics": "portable", "kernels": "AVX2", "torch": "2.14.1"}
    assert main(["table", summary("a", same), summary("b", same)]) == 0
    assert "different numerics" not in capsys.readouterr().out
    assert main(["table", summary("a", same), summary("c", {**same, "numerics": "native", "kernels": "AVX512"})]) == 0
    out = capsys.readouterr().out
    assert "different numerics" in out and "numerics: native, portable" in out and "kernels: AVX2, AVX512" in out


def test_native_in_a_child_restores_the_outer_environment_not_the_pinned_one():
    """A process that lcfed started (a Ray worker, a Tune trial) inherits the pinned variables; ``native``
    there restores what the user's environment said, which the parent passed down."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2",  # as pinned by a parent whose user asked for 'default'
           numerics.ENV_OUTER: json.dumps({"ATEN_CPU_CAPABILITY": "default"}), "PYTHONPATH": str(ROOT)}
    code = "from lcfed import numerics; print(numerics.activate('native')['level'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "DEFAULT", out.stderr[-2000:]
