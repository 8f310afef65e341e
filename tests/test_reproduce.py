"""`lcfed reproduce table1`: cells on Ray under one MLflow parent run, the tables, and resuming."""

from __future__ import annotations

import mlflow
import pytest

from lcfed.engines.local import run_local
from lcfed.errors import ConfigError
from tests.conftest import tiny_config
from tune_jobs.cli import main
from tune_jobs.reproduce import (
    Cell,
    cell_config,
    parse_seeds,
    partition_label,
    partition_overrides,
    reproduce_table1,
    summarize,
    write_tables,
)

PARTS = ["dirichlet:0.5", "pathological:2"]
METHODS2 = ["fedavg", "lcfed"]


def test_partition_specs():
    assert partition_overrides("dirichlet:0.1") == {"data.partition": "dirichlet", "data.alpha": 0.1,
                                                     "data.samples_per_device": []}
    assert partition_overrides("pathological:3+q50-350") == {
        "data.partition": "pathological", "data.classes_per_device": 3, "data.samples_per_device": [50, 350]}
    assert partition_label("pathological:3+q50-350") == "n=3, 50-350 samples"
    for bad in ("dirichlet", "shards:2", "pathological:x", "primary_secondary:1", "dirichlet:0.1+q50"):
        with pytest.raises(ConfigError, match="--partitions"):
            partition_overrides(bad)


def test_summary_averages_the_last_evaluations():
    hist = [{"train_loss": 1.0}, {"acc_mean": 0.5, "acc_std": 0.2, "acc_weighted": 0.6},
            {"acc_mean": 0.7, "acc_std": 0.1, "acc_weighted": 0.8, "bytes_up_total": 10.0}]
    s = summarize(hist, last=2)
    assert s["acc_mean"] == pytest.approx(0.6) and s["acc_std"] == pytest.approx(0.15)
    assert s["final_acc_mean"] == 0.7 and s["bytes_up_total"] == 10.0 and s["evaluations"] == 2


@pytest.mark.slow  # ~60 s; resumable --out: test_compare's rerun; cells and tables: the tests around it
def test_table1_on_ray_tracks_cells_and_resumes_only_what_is_missing(tmp_path, tracking_uri):
    base = tiny_config("train.rounds=2", "engine.num_cpus=2", "tracking.enabled=true", f"tracking.uri={tracking_uri}",
                       "tracking.experiment=t1")
    out = tmp_path / "t1"
    first = reproduce_table1(base, ["digits"], PARTS, METHODS2, out, {"num_clusters": 2}, quiet=True)
    md = (out / "table1.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert [r.split(" | ")[0][2:] for r in rows] == METHODS2
    assert "Dir(0.5)" in md and "n=2" in md and md.count("**") >= 4  # a best cell per column
    csv_rows = (out / "table1.csv").read_text().strip().splitlines()
    assert len(csv_rows) == 1 + 4 and csv_rows[0].startswith("dataset,partition,method,acc_mean,acc_std")

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("t1")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("table1_parent") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first["parent_run_id"]]
    assert len(parent) == 1 and len(children) == 4 and parent[0].info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(first["parent_run_id"])} >= {"table1.md", "table1.csv"}
    lcfed_child = [c for c in children if c.data.tags["table1_cell"] == "digits__pathological_2__lcfed"][0]
    assert lcfed_child.data.params["method.num_clusters"] == "2"  # method settings reach the methods that have them

    # a cell on Ray gives the in-process numbers of the same config
    cell = Cell("digits", "pathological:2", "lcfed")
    local = run_local(cell_config(base, cell, {"num_clusters": 2}, tmp_path / "x").replace(**{"engine.kind": "local"}))
    assert first["results"][cell.key]["acc_mean"] == pytest.approx(summarize(local.history)["acc_mean"], abs=1e-12)

    # interrupted after this cell's last checkpoint, before its summary: only it is redone, in its MLflow run
    (out / "cells" / f"{cell.key}.json").unlink()
    again = reproduce_table1(base, ["digits"], PARTS, METHODS2, out, {"num_clusters": 2}, quiet=True)
    assert again["parent_run_id"] == first["parent_run_id"]
    assert again["results"][cell.key]["acc_mean"] == first["results"][cell.key]["acc_mean"]
    assert again["results"][cell.key]["run_id"] == lcfed_child.info.run_id
    assert len(client.search_runs([exp.experiment_id])) == 5
    others = {k: v["run_id"] for k, v in again["results"].items() if k != cell.key}
    assert others == {k: v["run_id"] for k, v in first["results"].items() if k != cell.key}

    # another reproduction in the same directory is refused before any work
    with pytest.raises(ConfigError, match="--out"):
        reproduce_table1(base, ["digits"], PARTS, ["fedavg"], out, {"num_clusters": 2}, quiet=True)


def test_cli_rejects_bad_input_before_work(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["reproduce", "table1", "--methods", "fedavg,nope", "--out", out, "--no-track"]) == 2
    assert "--methods" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--partitions", "shards:2", "--out", out, "--no-track"]) == 2
    assert main(["reproduce", "table1", "--method-set", "bogus=1", "--out", out, "--no-track"]) == 2
    assert "--method-set" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_seeded_cells_report_the_mean_over_seeds_with_its_interval(tmp_path):
    """--seeds: a cell per (dataset, partition, method, seed), each its own seed; the table shows the mean over
    seeds ± t_{0.975, n-1} s / sqrt(n) and says how many seeds a cell has while some are missing."""
    import math

    assert parse_seeds("2") == [0, 1] and parse_seeds("4,7") == [4, 7]
    cells = [Cell("digits", "dirichlet:0.5", m, s) for m in ("fedavg", "lcfed") for s in (0, 1, 2)]
    assert cells[1].key == "digits__dirichlet_0.5__fedavg__s1"
    assert cell_config(tiny_config(), cells[2], {}, tmp_path).seed == 2
    accs = {"fedavg": [0.80, 0.82, 0.84], "lcfed": [0.90, 0.91]}  # lcfed's third seed not run yet
    row = {"acc_std": 0.1, "acc_weighted": 0.0, "rounds": 3, "wall_seconds": 1.0}
    results = {c.key: {**row, "acc_mean": accs[c.method][c.seed]} for c in cells if c.seed < len(accs[c.method])}
    md, table_csv = write_tables(tmp_path, cells, results, "t")
    half = 4.302652729749464 * 0.02 / math.sqrt(3)  # s = 0.02 over 3 seeds
    assert f"| fedavg | 82.00 ± {100 * half:.2f} |" in md
    assert "| lcfed | **90.50 ± 6.35 (2/3 seeds)** |" in md  # t_{0.975,1} = 12.706, s = 0.00707
    assert "95 % confidence interval" in md
    assert table_csv.splitlines()[0].startswith("dataset,partition,method,seed,acc_mean")
    assert len(table_csv.splitlines()) == 1 + 5
