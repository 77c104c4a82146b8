"""`sparse-lower bench`'s suites and command line: the cases (run.py) and the scaling curves, or one of
the measurements with a table of their own (threads, vector paths, the portable target, the nna target's
standard tables, the backbone's layers), each written to --out as results.json and results.md."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from ..cli.counts import count
from . import layers, nna_tables, portable, threads, vector_paths
from .provenance import provenance_fields
from .run import run
from .tables import TABLES

# the suites with a table of their own
MEASUREMENTS = {"threads": threads.measure, "vector-paths": vector_paths.measure, "portable": portable.measure,
                "nna-tables": nna_tables.measure, "layers": layers.measure}
SUITES = ("cases", "scaling", *MEASUREMENTS)


def measurement(suite: str, out, repeat: int | None, log=print) -> dict:
    """A suite of MEASUREMENTS, written to `out` as results.json and results.md (its table, as the
    documentation shows it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    repeat = repeat or 5
    result = {"suite": suite, **provenance_fields(), "machine": f"{platform.machine()}, {platform.processor()}",
              "cores": os.cpu_count(), "repeat": repeat, **MEASUREMENTS[suite](repeat, log=log)}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text(TABLES[suite](result) + "\n")
    result["files"] = [str(out / "results.json"), str(out / "results.md")]
    return result


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_from_args(args)


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="bench_results", help="output folder (default bench_results)")
    parser.add_argument("--quick", action="store_true", help="tiny versions of a few cases (a smoke test)")
    parser.add_argument("--cases", default=None, help="comma-separated name globs / substrings, e.g. 'subm,unet/*'")
    parser.add_argument("--repeat", type=count(1), default=None, help="timed runs per system (default 5, quick 3)")
    parser.add_argument("--nna-max-rows", type=count(0), default=50_000,
                        help="skip the nna systems above this many input rows (0: never skip)")
    parser.add_argument("--suite", choices=SUITES, default="cases",
                        help="cases: every case and system (default); scaling: the CenterPoint backbone on 10k to "
                             "1M real-frame-like voxels, time and peak memory, plotted to scaling.png; threads: the "
                             "backbone on 1 thread to every core, ours beside spconv; vector-paths: the backbone's "
                             "float and int8 forms on each vector path of this CPU, and int8's error; portable: the "
                             "portable target against the gpu target, time and peak memory; nna-tables: the nna "
                             "target's tables from the library against in standard ops (plain onnxruntime); layers: "
                             "each conv of the backbone, float, bf16 and int8, against the same run's GEMM peak")
    parser.add_argument("--scaling", action="store_const", dest="suite", const="scaling",
                        help="the same as --suite scaling")


def run_from_args(args, quiet: bool = False) -> int:
    """The suite as `sparse-lower bench` runs it; `quiet` leaves out the progress lines and the tables,
    printing only the files written."""
    log = (lambda *_: None) if quiet else print
    if args.suite in MEASUREMENTS:
        result = measurement(args.suite, args.out, args.repeat, log)
    else:
        result = run(args.out, args.quick, args.cases, args.repeat, args.nna_max_rows or None,
                     scaling=args.suite == "scaling", log=log)
    if quiet:
        print("\n".join(f"wrote {file}" for file in result["files"]))
    else:
        print(Path(args.out, "results.md").read_text())
    return 0 if result.get("cases", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
