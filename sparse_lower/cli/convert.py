"""sparse-lower convert."""

from __future__ import annotations

import numpy as np
import onnx

from ..api import load, lower
from ..importers import SECTION3, detect_format, format_title, import_model
from ..lowering import COMBINES, STRATEGIES, TARGETS
from ..verify import compare, example_inputs
from ..report import render
from .table import before_after


class Convert:
    """Lower the sparse convolutions of an ONNX model for a target.

    Reads IN (section-3 source ops of DESIGN.md, or the NVIDIA Lidar_AI_Solution / AIMET sparse-conv
    ONNX, imported first), rewrites every sparse node and writes OUT.
      gpu     index-builder custom ops -> IndexedUnfold -> MatMul (-> IndexedFold)
      nna     index tables from the custom ops; the compute in standard ops only: one 1x1 Conv per
              kernel tap on [1, C, 1, N] (--fuse-taps: one Conv with K*Cout outputs) and a combine
              method: gather (default), scatter or matmul (scatter matrices, O(K*N^2) memory).
              --max-active N fixes the row capacity so that the compute has static shapes.
      hybrid  the first sparse layer of each branch on the gpu path, the rest on the nna path.
    Run OUT with sparse_lower.create_session, or any onnxruntime session that registers the library
    (python -c "import sparse_lower; print(sparse_lower.get_library_path())"); split it per device
    with `sparse-lower partition`.

    --verify runs the NumPy reference on IN and onnxruntime on OUT with random inputs (or --inputs)
    and prints the largest error per output; the exit status is 1 when an output differs by more
    than --tolerance (relative to the output's largest magnitude).

    example: sparse-lower convert model.onnx -o model.gpu.onnx --target gpu --verify
    """

    name = "convert"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("input", help="source ONNX model")
        parser.add_argument("-o", "--output", required=True, help="where to write the lowered model")
        parser.add_argument("--target", default="gpu", choices=list(TARGETS))
        parser.add_argument("--strategy", default="auto", choices=list(STRATEGIES),
                            help="gpu compute form (default auto)")
        parser.add_argument("--combine", default="gather", choices=list(COMBINES),
                            help="nna combine method (default gather)")
        parser.add_argument("--max-active", type=int, help="nna row capacity (static shapes)")
        parser.add_argument("--fuse-taps", action="store_true", help="nna: one Conv with K*Cout outputs")
        parser.add_argument("--dump-dir", help="write the model after every pass into this folder")
        parser.add_argument("--verify", action="store_true", help="compare reference and lowered model")
        parser.add_argument("--inputs", help=".npz of inputs for --verify (default: random)")
        parser.add_argument("--active", type=int, default=500, help="active sites per random input")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--tolerance", type=float, default=1e-4)

    def run(self, args) -> int:
        source = load(args.input)
        found = detect_format(source)
        if found != SECTION3:
            source = import_model(source)
            print(f"imported {format_title(found)} format into section-3 ops")
        lowered = lower(source, target=args.target, strategy=args.strategy, combine=args.combine,
                        max_active=args.max_active, fuse_taps=args.fuse_taps, dump_dir=args.dump_dir)
        onnx.save(lowered, args.output)
        print(before_after(source, lowered))
        print(f"wrote {args.output}")
        if not args.verify:
            return 0
        feeds = (dict(np.load(args.inputs)) if args.inputs
                 else example_inputs(source, np.random.default_rng(args.seed), active=args.active))
        differences = compare(source, lowered, feeds)
        print(render(["output", "max abs error", "max rel error", "shape"],
                     [[d.output, f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", "ok" if d.shape_ok else "MISMATCH"]
                      for d in differences]))
        failed = [d.output for d in differences if not d.shape_ok or d.max_rel > args.tolerance]
        print(f"verify: {'FAILED for ' + ', '.join(failed) if failed else 'ok'}")
        return 1 if failed else 0
