"""The benchmark suite; a thin wrapper of `sparse_lower.bench.run` (same as `sparse-lower bench`).

    python tools/bench/run.py [--out DIR] [--quick] [--cases PATTERN] [--repeat N] [--nna-max-rows N]
"""

from sparse_lower.bench.run import main

if __name__ == "__main__":
    raise SystemExit(main())
