"""The CLI's conventions: the texts that report what was computed say it as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tune_jobs.cli import main
from tune_jobs.reproduce import Cell, write_tables


def test_methods_prints_each_description_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    (dcpfl,) = [line for line in out.splitlines() if line.startswith("dcpfl ")]
    assert dcpfl.endswith("DC-PFL: dynamic clustering by model discrepancy, splits at the end of rapid-decrease "
                          "periods, layer-wise aggregation.")


def test_table1_says_how_many_evaluations_it_averaged(tmp_path: Path) -> None:
    cells = [Cell("digits", "dirichlet:0.5", m) for m in ("fedavg", "lcfed")]
    row = {"acc_mean": 0.8, "acc_std": 0.1, "acc_weighted": 0.8, "rounds": 2, "wall_seconds": 1.0}
    md, _ = write_tables(tmp_path, cells, {c.key: {**row, "evaluations": 2.0} for c in cells}, "t")
    assert "averaged over the last 2 evaluations;" in md
    md, _ = write_tables(tmp_path, cells, {c.key: {**row, "evaluations": 1.0} for c in cells}, "t")
    assert "averaged over the last evaluation;" in md
    runs = {cells[0].key: {**row, "evaluations": 2.0}, cells[1].key: {**row, "evaluations": 3.0}}
    md, _ = write_tables(tmp_path, cells, runs, "t")
    assert "averaged over the last 2-3 evaluations (as many as each run made, up to 3);" in md
