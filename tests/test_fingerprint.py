"""The kernel fingerprint (lcfed/numerics/fingerprint.py, ``lcfed numerics``): what it hashes, that computing it never
moves a run's numbers, its disk cache, the shipped references, and the runs told apart by it."""

from __future__ import annotations

import json

import pytest
import torch

from lcfed import numerics
from lcfed.numerics import fingerprint, provenance
from lcfed.numerics.fingerprint import Fingerprint
from tune_jobs.cli import main


def test_digest_differing_and_report_by_hand():
    a = Fingerprint({"conv": "11", "matmul": "22"}, {"cpu": "A", "torch": "2.14.1"}, "a")
    b = Fingerprint({"conv": "11", "matmul": "33", "eigh": "44"}, {"cpu": "B", "torch": "2.11.0"}, "b")
    assert a.digest != b.digest and len(a.digest) == 12
    assert a.digest == Fingerprint(dict(reversed(a.kernels.items())), {"cpu": "C"}).digest  # kernels only, any order
    assert a.differing(b) == ["matmul", "eigh"]
    assert Fingerprint.from_dict(a.to_dict()) == a
    with pytest.raises(ValueError, match="version"):
        Fingerprint.from_dict({**a.to_dict(), "version": fingerprint.VERSION + 1})
    lines = list(fingerprint.report(a, [a, b]))
    assert lines[0] == f"  same as a (A; {a.digest})"
    assert lines[1].startswith(f"  differs from b (B; {b.digest}): 2 kernels (matmul, eigh)")
    assert "torch 2.11.0 there, 2.14.1 here" in lines[1]
    assert fingerprint.matching(a, [a, b]) == ["a"]


def test_computing_it_leaves_the_runs_rng_and_threads_alone():
    """A run computes its fingerprint before round 1, in its own process: the global generator and the
    thread count must be as they were (the hashes the same each time: the recomputation in the disk cache test)."""
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    first = fingerprint.compute(1)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3)) and torch.get_num_threads() == threads
    assert first.machine["kernels"] == numerics.kernel_level() and first.machine["threads"] == "1"
    assert {"conv1.fwd", "local.lenet5.sgd", "similarity.projector", "clustering.kmeans"} <= set(first.kernels)


def test_the_disk_cache_is_read_and_a_stale_one_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv(fingerprint.ENV_CACHE, str(tmp_path))
    monkeypatch.setattr(fingerprint, "_computed", {})
    real = fingerprint.for_process(1)
    (cached,) = (tmp_path / "fingerprints").glob("*.json")
    assert Fingerprint.from_dict(json.loads(cached.read_text())).digest == real.digest
    # a cached entry is what a later process reads: altered by hand, it is returned as written
    cached.write_text(json.dumps(Fingerprint({"conv1.fwd": "0" * 16}).to_dict()))
    monkeypatch.setattr(fingerprint, "_computed", {})
    assert fingerprint.for_process(1).kernels == {"conv1.fwd": "0" * 16}
    # one from another fingerprint version is not: it is computed again (the same hashes) and replaced
    cached.write_text(json.dumps({**real.to_dict(), "version": 0}))
    monkeypatch.setattr(fingerprint, "_computed", {})
    assert fingerprint.for_process(1).digest == real.digest
    assert json.loads(cached.read_text())["version"] == fingerprint.VERSION


def test_the_shipped_references_hash_the_kernels_this_lcfed_runs():
    refs = fingerprint.references()
    assert len(refs) >= 2 and len({r.name for r in refs}) == len(refs)
    mine = fingerprint.for_process(1)
    for ref in refs:
        assert list(ref.kernels) == list(mine.kernels), ref.name  # retaken whenever a kernel is added
        assert ref.machine["mkl_cbwr"] == "COMPATIBLE,STRICT" and ref.machine["kernels"] == "AVX2", ref.name
        assert ref.note, ref.name  # how it was taken


def test_lcfed_numerics_prints_compares_and_writes(tmp_path, capsys):
    out = tmp_path / "mine.json"
    code = main(["numerics", "--kernels", "--check", "--json", str(out), "--name", "here"])
    text = capsys.readouterr().out
    mine = fingerprint.for_process(1)
    assert f"kernel fingerprint {mine.digest}  (portable profile, 1 thread, {len(mine.kernels)} kernels)" in text
    assert f"    local.lenet5.sgd {mine.kernels['local.lenet5.sgd']}" in text
    same = fingerprint.matching(mine, fingerprint.references())
    assert code == (0 if same else 1)
    assert ("the same numbers as" in text) == bool(same)
    written = Fingerprint.from_dict(json.loads(out.read_text()))
    assert written.name == "here" and written.digest == mine.digest


def test_runs_from_other_kernels_are_named_before_their_numbers(tmp_path, capsys):
    def summary(name: str, digest: str) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"method": name, "seed": 0, "rounds": 3, "acc_mean": 0.5,
                                    "last_evals": {"acc_mean": 0.5, "rounds": [3]},
                                    "provenance": {"numerics": "portable", "fingerprint": digest}}))
        return str(path)

    files = [summary("a", "aaaaaaaaaaaa"), summary("b", "aaaaaaaaaaaa"), summary("c", "cccccccccccc")]
    assert main(["table", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("warning: these runs come from machines whose kernels differ")
    assert f"aaaaaaaaaaaa: {files[0]}, {files[1]}; cccccccccccc: {files[2]}" in lines[0]
    assert "fingerprint: aaaaaaaaaaaa, cccccccccccc" in lines[-1]
    assert provenance.fingerprint_groups([{"fingerprint": "x"}, {"fingerprint": "x"}], ["a", "b"]) == ""
    assert provenance.fingerprint_groups([{"fingerprint": "x"}, {}], ["a", "b"]) == "x: a; unrecorded: b"
