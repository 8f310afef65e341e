"""The docs' reference tables follow the code: README's methods table (which the site's home page includes) the
registry, docs/run.md's config table the dataclasses (the metric table is tests/test_metric_catalog.py's)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from lcfed import registry
from lcfed.config import ExperimentConfig
from lcfed.config.experiment import _SECTIONS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RUN_PAGE = (ROOT / "docs" / "run.md").read_text()


def _table(header: str, text: str = README) -> list[list[str]]:
    start = text.index(header)
    block = text[start:text.index("\n\n", start)].splitlines()[2:]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip("|"))] for row in block]


def test_methods_table_is_the_registry():
    rows = _table("| name | method | what is shared | async |")
    names = [re.fullmatch(r"`(\w+)`", r[0]).group(1) for r in rows]
    builtins = [e.name for e in registry.names("method") if e.origin == "built-in"]
    assert sorted(names) == sorted(builtins)
    for name, row in zip(names, rows, strict=True):
        assert (row[3] == "✓") == registry.method(name).strategy.supports_async, name


def test_methods_privacy_table_is_what_each_strategy_declares_it_reads():
    rows = _table("| name | sums (clipped and noised under central) | per-device reads | `privacy.mode: central` |",
                  (ROOT / "docs" / "methods.md").read_text())
    builtins = [e.name for e in registry.names("method") if e.origin == "built-in"]
    assert sorted(re.fullmatch(r"`(\w+)`", r[0]).group(1) for r in rows) == sorted(builtins)
    for row in rows:
        reads = registry.method(row[0].strip("`")).strategy.reads
        assert row[1:] == [", ".join(reads.sums) or "—", ", ".join(reads.per_device) or "—",
                           "✓" if reads.private else "refused"], row


def test_config_table_names_every_field_of_every_section():
    rows = {re.fullmatch(r"`(\w+)`", r[0]).group(1): r[1] for r in _table("| section | fields (defaults) |", RUN_PAGE)}
    assert set(rows) == {*_SECTIONS, "method"}
    for section, cls in _SECTIONS.items():
        missing = [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in rows[section]]
        assert not missing, f"docs/run.md's config table lacks {section}.{missing}"
    lcfed = registry.method("lcfed").params
    assert all(f"`{f.name}`" in rows["method"] for f in dataclasses.fields(lcfed))
    assert {f.name for f in dataclasses.fields(ExperimentConfig)} == {*_SECTIONS, "method", "name", "seed"}


def test_the_home_page_includes_the_readme_methods_table():
    # one table: the site's home page takes README's between the snippet markers
    assert '--8<-- "README.md:methods"' in (ROOT / "docs" / "index.md").read_text()
    start, end = README.index("[start:methods]"), README.index("[end:methods]")
    assert "| name | method | what is shared | async |" in README[start:end]


def test_the_demos_param_count_on_the_mlflow_page_is_what_a_run_logs():
    from lcfed.config import load_config
    from lcfed.run.setup import prepare
    from lcfed.tracking.inputs import federation_facts, run_params

    cfg = load_config(str(ROOT / "configs" / "demo.yaml"), [])
    logged = run_params(cfg, federation_facts(prepare(cfg).federation), "sqlite:///mlflow.db")
    stated = re.search(r"and (\d+) params for the demo", (ROOT / "docs" / "mlflow.md").read_text())
    assert stated and int(stated.group(1)) == len(logged)
