"""The result tables of docs/run.md come from runs: `make demo`'s first 3 rounds end where the page says, and
(slow) its seed-0 row is what `make demo` prints.

The tables of docs/run.md are written by ``benchmarks/result_tables.py --write`` from real runs
under the portable numerics profile, which also writes the kernel fingerprint those runs had. This test
reruns `make demo`'s LCFed run cut to 3 rounds (the page's ``demo-start`` line, every digit) and, with
``make test-slow``, the seed-0 cell of LCFed (what `make demo` runs first: configs/demo.yaml), and compares them
with the page's when this machine's fingerprint is the stated one: equal fingerprints guarantee equal numbers.
On a machine whose kernels give other bits it skips and says which kernels; it never compares numbers
made by other kernels. The whole table is rerun by ``benchmarks/result_tables.py --check``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lcfed.numerics import fingerprint
from tune_jobs.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_row(table: str, first_cell: str) -> list[str]:
    text = (ROOT / "docs" / "run.md").read_text()
    block = re.search(rf"<!-- result_tables:{table} -->\n(.*?)\n<!-- /result_tables -->", text, re.S)
    assert block, f"docs/run.md has no {table} table"
    for line in block.group(1).splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"no row {first_cell!r} in docs/run.md's {table} table")


def readme_fingerprint() -> str:
    block = re.search(r"<!-- result_tables:fingerprint -->\n.*?`([0-9a-f]{12})`", (ROOT / "docs" / "run.md").read_text(), re.S)
    assert block, "docs/run.md does not state the kernel fingerprint of its tables"
    return block.group(1)


def same_kernels_as_the_page() -> str:
    """The page's fingerprint, when this machine's is the same; else the test skips, naming the kernels."""
    stated = readme_fingerprint()
    mine = fingerprint.for_process(1)  # the demo runs with engine.torch_threads = 1
    if mine.digest != stated:
        refs = [r for r in fingerprint.references() if r.digest == stated]
        differ = mine.differing(refs[0]) if refs else ["(no shipped reference has it)"]
        pytest.skip(f"this machine's kernel fingerprint {mine.digest} is not the docs/run.md tables' {stated} "
                    f"(kernels that differ: {', '.join(differ[:6])}): its numbers are not the page's to the last digit")
    return stated


def test_make_demos_first_three_rounds_end_where_the_page_says(tmp_path):
    same_kernels_as_the_page()
    block = re.search(r"<!-- result_tables:demo-start -->\n.*?cut to (\d+) rounds.*?acc_mean ([0-9.e-]+), "
                      r"train_loss ([0-9.e-]+):", (ROOT / "docs" / "run.md").read_text(), re.S)
    assert block, "docs/run.md has no demo-start line"
    out = tmp_path / "lcfed.json"
    assert main(["run", "-c", str(ROOT / "configs" / "demo.yaml"), "--set", f"train.rounds={block.group(1)}",
                 "--no-track", "-q", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["method"] == "lcfed" and summary["seed"] == 0
    assert (repr(summary["acc_mean"]), repr(summary["train_loss"])) == (block.group(2), block.group(3))


@pytest.mark.slow
def test_make_demos_lcfed_seed_0_cell_is_the_readmes(tmp_path):
    stated = same_kernels_as_the_page()
    out = tmp_path / "lcfed.json"
    assert main(["run", "-c", str(ROOT / "configs" / "demo.yaml"), "--no-track", "-q", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["provenance"]["numerics"] == "portable" and summary["seed"] == 0
    assert summary["provenance"]["fingerprint"] == stated
    assert summary["method"] == "lcfed"
    assert f"{100 * summary['last_evals']['acc_mean']:.1f}" == readme_row("demo-seeds", "0")[0]  # LCFed column
