"""The documentation's performance tables are written from results files (sparse_lower/bench/tables.py,
tools/render_tables.py), never typed: each marked table must be what its results file renders to, and
the benchmark's own results.md what its results.json renders to."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from sparse_lower.bench.run import markdown
from sparse_lower.bench.provenance import provenance
from sparse_lower.bench.tables import TABLES, marked_tables, rendered, results

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WRITTEN = [d for d in DOCUMENTS if not (d.name == "results.md" and (d.parent / "results.json").exists())]
MARKED = [(document, *table) for document in DOCUMENTS for table in marked_tables(document.read_text())]


def test_the_readme_has_its_speed_table_marked():
    assert [(d.name, name) for d, name, _, _ in MARKED if d.name == "README.md"] == [("README.md", "speed")]


@pytest.mark.parametrize("document, name, file, written", MARKED,
                         ids=[f"{d.relative_to(ROOT)}:{name}" for d, name, _, _ in MARKED])
def test_a_marked_table_is_what_its_results_file_renders_to(document, name, file, written):
    result = results(ROOT / file)
    assert written == TABLES[name](result), f"run python tools/render_tables.py ({document.name}, table {name})"
    for run in result if isinstance(result, list) else [result]:
        if "commit" in run:  # the machine and its units where one measured it, the date and the commit
            assert (provenance(run) if "cores" in run else f"{run['date']}, commit {run['commit']}") in written
    assert isinstance(result, list) or "commit" in result  # the toolchains' oldest rows predate provenance


# A table of measured figures: a header naming a time, a rate or a speed-up.
MEASURED = re.compile(r"^\|.*(\bms\b|GFLOP|speed-up|frames/s|GMACs|× useful).*\|$")
RECORD = re.compile(r"<!-- record: .*\bcommit ([0-9a-f]{7,40}) -->")


def measured_tables(text: str) -> list[tuple[int, str, str]]:
    """(line, header, the line before the table) of every table of measured figures outside a marked one."""
    inside, found, lines = False, [], text.splitlines()
    for number, line in enumerate(lines):
        inside = (inside or line.startswith("<!-- table ")) and not line.startswith("<!-- end of table")
        starts = line.startswith("|") and not (number and lines[number - 1].startswith("|"))
        if starts and not inside and MEASURED.match(line.strip()):
            found.append((number + 1, line, lines[number - 1] if number else ""))
    return found


@pytest.mark.parametrize("document", WRITTEN, ids=lambda d: str(d.relative_to(ROOT)))
def test_measured_figures_are_rendered_or_a_named_record(document):
    """No table of measured figures is typed in: each is rendered from its results file (a run's results.md
    is, as its own test checks), or is the record
    of a run this repository cannot repeat (a GPU machine, 16 cores, a study removed since), right under
    a `<!-- record: … commit C -->` line naming a commit that holds the script that measured it."""
    for number, header, before in measured_tables(document.read_text()):
        record = RECORD.match(before.strip())
        assert record, f"{document.name}:{number}: {header[:80]}… is neither a marked table nor a record"
        commit = record[1]
        known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
        if (ROOT / ".git").exists() and not (ROOT / ".git" / "shallow").exists():
            assert known.returncode == 0, f"{document.name}:{number}: no commit {commit}"


def test_measured_tables_are_found():
    text = "x\n| a | ms |\n|---|---|\n| 1 | 2 |\n<!-- table t: f -->\n| b | ms |\n<!-- end of table t -->\n"
    assert [number for number, _, _ in measured_tables(text)] == [2]


def test_rendering_changes_nothing_but_the_tables():
    text = (ROOT / "README.md").read_text()
    stale = text.replace("| 815.0 |", "| 1.0 |")
    assert stale != text and rendered(stale, ROOT) == text


@pytest.mark.parametrize("folder", [ROOT / "docs" / "performance", *(ROOT / "docs" / "performance" / name
                                                                      for name in ("scaling", "speed", "voxelnext"))])
def test_the_benchmarks_results_md_is_its_results_json(folder):
    result = json.loads((folder / "results.json").read_text())
    assert (folder / "results.md").read_text() == markdown(result)


@pytest.mark.parametrize("suite", ["threads", "vector-paths", "portable", "nna-tables"])
def test_a_suites_results_md_is_its_table(suite):
    folder = ROOT / "docs" / "performance" / suite.replace("-", "_")
    result = json.loads((folder / "results.json").read_text())
    assert result["suite"] == suite and (folder / "results.md").read_text() == TABLES[suite](result) + "\n"


def test_the_kernel_instruction_counts_results_md_is_its_table():
    folder = ROOT / "docs" / "performance" / "aarch64"
    result = json.loads((folder / "results.json").read_text())
    assert (folder / "results.md").read_text() == TABLES["kernel-instructions"](result) + "\n"


def test_a_new_run_records_what_its_tables_say():
    from sparse_lower.bench.provenance import provenance_fields

    fields = provenance_fields()
    assert set(fields) == {"cpu", "vector_units", "date", "commit"} and all(fields.values())
    assert len(fields["date"]) == 10 and fields["date"][4] == "-"
