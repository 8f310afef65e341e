"""The metric catalogue is the one list: the summary, --metric, MLflow's sections, the figure and docs/mlflow.md
read it."""

from __future__ import annotations

import re
from pathlib import Path

from lcfed.run.metric_catalog import CATALOG, FAMILIES, PLOTTED, SECTIONS, SUMMARY, docs_table, objectives
from lcfed.tracking.naming import metric_name, mlflow_key, section

PAGE = Path(__file__).resolve().parents[1] / "docs" / "mlflow.md"


def test_docs_metric_table_is_the_catalogue():
    text = PAGE.read_text()
    block = re.search(r"<!-- metric_catalog -->\n(.*?)\n<!-- /metric_catalog -->", text, re.S)
    assert block, "docs/mlflow.md lost its <!-- metric_catalog --> block"
    assert block.group(1) == docs_table(), "docs/mlflow.md's metric table drifted: regenerate it from docs_table()"


def test_each_metric_once_with_a_section_and_a_direction():
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    for m in CATALOG:
        assert m.section in SECTIONS and m.direction in ("max", "min", None), m
        assert section(m.name) == m.section and section(f"best_{m.name}") == m.section
        assert metric_name(mlflow_key(m.name)) == m.name
    for prefix, where, _, _ in FAMILIES:
        assert section(f"{prefix}x") == where
    assert section("not_a_metric") is None and mlflow_key("not_a_metric") == "not_a_metric"


def test_derived_lists():
    assert SUMMARY[:2] == ("acc_mean", "acc_weighted") and "nmi" in SUMMARY and "bytes_up" not in SUMMARY
    assert set(PLOTTED) == {"acc_mean", "acc_weighted", "acc_p10", "acc_p90"}
    modes = objectives()
    assert modes["acc_mean"] == "max" and modes["test_loss"] == "min" and modes["num_clusters"] is None
    assert "nmi" not in modes  # summarised, not a sweep objective
