#!/usr/bin/env python3
"""The long property-based campaign of tests/test_properties.py (not run in CI).

CI runs a fixed, derandomized few hundred examples; this script runs fresh random ones: EXAMPLES in all,
split evenly over the property tests (gpu, nna, hybrid, portable targets), two pytest workers, and prints the
examples run and the mismatches found per test. Exit status 1 when any example fails; hypothesis then
prints the shrunk falsifying example.

    python tools/fuzz.py --examples 10000
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests" / "test_properties.py"
PROPERTY_TESTS = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10_000, help="examples in all (default 10000)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    args = parser.parse_args()
    env = {**os.environ, "SPARSE_LOWER_HYPOTHESIS_PROFILE": "campaign",
           "SPARSE_LOWER_FUZZ_EXAMPLES": str(-(-args.examples // PROPERTY_TESTS))}
    command = [sys.executable, "-m", "pytest", str(TESTS), "-q", "-p", "no:cacheprovider", "-n", str(args.workers),
               "--hypothesis-show-statistics"]
    start = time.perf_counter()
    # Outside the source tree, so that `sparse_lower` is the installed package (with its built library).
    result = subprocess.run(command, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=False)
    print(result.stdout[-20_000:], result.stderr[-5_000:], sep="\n")
    counts = re.findall(r"(\d+) passing examples, (\d+) failing examples", result.stdout)
    passing, failing = (sum(int(c[i]) for c in counts) for i in (0, 1))
    print(f"campaign: {passing + failing} examples, {failing} failing, {time.perf_counter() - start:.0f} s, "
          f"pytest exit status {result.returncode}")
    return 1 if failing or result.returncode else 0


if __name__ == "__main__":
    raise SystemExit(main())
