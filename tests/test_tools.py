"""The scripts under tools/ (benchmarks and report generators, run on demand, never by CI otherwise)
still start: they import the package and each other, so a rename elsewhere must not leave one broken
until someone next runs it (a measurement script once imported a helper that had been renamed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.mark.parametrize("script", sorted(TOOLS.glob("*.py")), ids=lambda path: path.name)
def test_tool_starts(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=TOOLS.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
