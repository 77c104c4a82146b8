"""Writes the tables of README.md and docs/ that come from benchmark results (sparse_lower/bench/tables.py)
anew from their results files: run it after committing a new results file.

    python tools/render_tables.py        # rewrites the documents whose tables changed, and names them
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparse_lower.bench.tables import rendered

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    for document in DOCUMENTS:
        text = document.read_text()
        new = rendered(text, ROOT)
        if new != text:
            document.write_text(new)
            print(f"wrote {document.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
