"""The documentation's performance tables are written from results files (sparse_lower/bench/tables.py,
tools/render_tables.py), never typed: each marked table must be what its results file renders to, and
the benchmark's own results.md what its results.json renders to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparse_lower.bench.run import markdown
from sparse_lower.bench.tables import TABLES, marked_tables, provenance, rendered

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKED = [(document, *table) for document in DOCUMENTS for table in marked_tables(document.read_text())]


def test_the_readme_has_its_speed_table_marked():
    assert [(d.name, name) for d, name, _, _ in MARKED if d.name == "README.md"] == [("README.md", "speed")]


@pytest.mark.parametrize("document, name, results, written", MARKED,
                         ids=[f"{d.relative_to(ROOT)}:{name}" for d, name, _, _ in MARKED])
def test_a_marked_table_is_what_its_results_file_renders_to(document, name, results, written):
    result = json.loads((ROOT / results).read_text())
    assert written == TABLES[name](result), f"run python tools/render_tables.py ({document.name}, table {name})"
    assert provenance(result) in written  # the machine, its units, the date and the commit


def test_rendering_changes_nothing_but_the_tables():
    text = (ROOT / "README.md").read_text()
    stale = text.replace("| 778.6 |", "| 1.0 |")
    assert stale != text and rendered(stale, ROOT) == text


@pytest.mark.parametrize("folder", [ROOT / "docs" / "performance", *(ROOT / "docs" / "performance" / name
                                                                      for name in ("scaling", "voxelnext"))])
def test_the_benchmarks_results_md_is_its_results_json(folder):
    result = json.loads((folder / "results.json").read_text())
    assert (folder / "results.md").read_text() == markdown(result)


def test_a_new_run_records_what_its_tables_say():
    from sparse_lower.bench.run import provenance_fields

    fields = provenance_fields()
    assert set(fields) == {"cpu", "vector_units", "date", "commit"} and all(fields.values())
    assert len(fields["date"]) == 10 and fields["date"][4] == "-"
