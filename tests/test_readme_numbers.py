"""The README's result tables come from runs: `make demo`'s seed-0 row is what `make demo` prints.

The tables of README section 1 are written by ``benchmarks/readme_tables.py --write`` from real runs
under the portable numerics profile, so they hold on any x86-64 CPU; this test reruns the seed-0
cell of LCFed (what `make demo` runs first: configs/demo.yaml) and compares it with the README's; the
whole table is rerun by ``benchmarks/readme_tables.py --check``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tune_jobs.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_row(table: str, first_cell: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- readme_tables:{table} -->\n(.*?)\n<!-- /readme_tables -->", text, re.S)
    assert block, f"README.md has no {table} table"
    for line in block.group(1).splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells[1:]
    raise AssertionError(f"no row {first_cell!r} in README's {table} table")


def test_make_demos_lcfed_seed_0_cell_is_the_readmes(tmp_path):
    out = tmp_path / "lcfed.json"
    assert main(["run", "-c", str(ROOT / "configs" / "demo.yaml"), "--no-track", "-q", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["provenance"]["numerics"] == "portable" and summary["seed"] == 0
    assert summary["method"] == "lcfed"
    assert f"{100 * summary['last_evals']['acc_mean']:.1f}" == readme_row("demo-seeds", "0")[0]  # LCFed column
