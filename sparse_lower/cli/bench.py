"""sparse-lower bench."""

from __future__ import annotations

from .outputs import output_folder


class BenchCommand:
    """Run the benchmark suite and write results.json, results.md and plots to --out.

    Cases: single sparse layers (SubM 3^3 16->16 and 64->64, SparseConv 3^3 s2 16->32, SparseDeconv
    2^3 s2 32->16, inverse 3^3 32->16) on the real CenterPoint frame and on uniform random voxels
    (0.1 %, 1 %, 10 % of 41x400x352, capped at 120k voxels), SubM 3x3 16->16 on 1000x1000 images at
    90 % and 99 % sparsity, and the CenterPoint backbone and the sparse UNet on both real frames.
    Systems: ours (gpu auto = fused / unfold / rulebook, nna gather / scatter) and spconv 2.3.8 on one
    thread, ours (gpu auto) and MinkowskiEngine 0.5.4 (when installed: tools/bench/install_minkowski.sh)
    on two, and onnxruntime's dense Conv; medians after a warm-up, index tables timed separately,
    useful GFLOP/s against the measured single-core GEMM peak, peak memory of the network runs, and
    for each network the two-thread run's profile (kernel time per op and per layer) and its share of
    the two-thread GEMM peak. The full suite takes several minutes.

    --suite runs another suite instead: scaling (--scaling), the CenterPoint backbone on 10k to 1M voxels
    made from the real frame, ours on 1 and 2 threads and the peers, time and peak memory (scaling.png);
    threads, the backbone on 1 thread to every core beside spconv; vector-paths, its float and int8 forms
    on each vector path of this CPU and int8's error; portable, the portable target against the gpu
    target; nna-tables, the nna target's tables from the library against in standard ops (--tables
    standard, run in plain onnxruntime); layers, each conv of the backbone, float, bf16 and int8, against
    the GEMM peak measured in the same run. Each writes results.json and results.md, the table docs/ shows.

    example: sparse-lower bench --quick --out /tmp/bench
    """

    name = "bench"

    @staticmethod
    def add_arguments(parser):
        from ..bench.suites import add_arguments

        add_arguments(parser)

    def run(self, args, out) -> int:
        from ..bench.run import selected_cases
        from ..bench.suites import MEASUREMENTS, run_from_args

        if args.suite not in MEASUREMENTS:
            selected_cases(args.cases, args.quick, args.suite == "scaling")  # refused before --out is made
        output_folder(args.out, "--out", out)
        return run_from_args(args, quiet=out.quiet)
