"""sparse-lower run."""

from __future__ import annotations

from pathlib import Path

from ..errors import SparseLowerError
from ..frames import find_frames, is_lowered, run_frames, runnable
from ..frames.files import output_paths
from ..frames.on_ray import ray_module
from ..lowering import TARGETS
from ..model_io import load, recorded_options
from .counts import count
from .outputs import output_folder
from .status import Status
from .verbosity import Verbosity


class RunCommand:
    """Run a model over many frames and write every frame's outputs.

    FRAMES are .npz files with 'features' [N, C] and 'coords' [N, 1+D] (batch first), as in
    ../shared/data, or folders of them. MODEL is lowered first (for --target) when it still holds
    sparse source ops or is a sparse-conv exporter's file; a lowered model runs as it is. Each frame's
    outputs go to OUT_DIR/<frame name>.npz, keyed by the model's output names, written whole or not at
    all. A frame that fails is reported by name and the others go on; the exit status is 1 when any
    failed. --skip-existing leaves out the frames whose output exists: a stopped job resumes, and a
    rerun retries only the failed frames (an output is there only when complete). A bar shows
    frames/s; at the end a summary: frames, failures, wall time, frames/s and the p50/p95 of
    onnxruntime's run time per frame.

    --ray runs the same job on Ray Data (pip install "sparse-lower[ray]"): --workers actors, one
    onnxruntime session of --threads threads each, on the cluster at ADDRESS ("auto": the one this
    machine belongs to; none: a local Ray instance). The frames and OUT_DIR must be at the same paths
    on every node. The outputs are the bytes a local run with the same --threads writes.

    example: sparse-lower run backbone.onnx ../shared/data -o outputs/
             sparse-lower run backbone.onnx frames/ -o outputs/ --ray --workers 2 --threads 1
    """

    name = "run"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("model", help="ONNX model: lowered, or to lower first")
        parser.add_argument("frames", nargs="+", help=".npz frames, or folders of them")
        parser.add_argument("-o", "--output-dir", required=True, help="folder for the outputs (created if missing)")
        parser.add_argument("--target", choices=list(TARGETS),
                            help="the target to lower for, when the model is not lowered (default gpu); a lowered "
                                 "model runs in the form it was lowered to")
        parser.add_argument("--threads", type=count(0),
                            help="onnxruntime threads per session (default, or 0: one per core locally; 1 on Ray)")
        parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                            help="run on Ray Data: a local instance, or the cluster at ADDRESS ('auto', 'ray://…')")
        parser.add_argument("--workers", type=count(1), help="with --ray: actors (default: the cluster's CPUs / threads)")
        parser.add_argument("--compress", action="store_true", help="write compressed .npz (smaller, slower)")
        parser.add_argument("--skip-existing", action="store_true",
                            help="leave out frames whose output exists (resume a stopped job, retry the failed ones)")

    def run(self, args, out: Verbosity) -> int:
        if args.workers is not None and args.ray is None:
            raise SparseLowerError("--workers applies to a run on Ray", fix="add --ray, or leave --workers out")
        if args.ray and Path(args.ray).exists():  # `--ray MODEL FRAMES`: argparse took the model for ADDRESS
            raise SparseLowerError(f"--ray {args.ray}: the address looks like a path",
                                   fix="put --ray after the frames, or give --ray=ADDRESS")
        if args.ray is not None:
            ray_module()
        frames = find_frames(args.frames)  # refused now rather than after a lowering that can take a minute
        if args.target is not None:  # a lowered model runs in its own form: another target is refused
            given = load(args.model)
            form = recorded_options(given).get("target")
            if is_lowered(given) and form != args.target:
                raise SparseLowerError(f"{args.model} is already lowered{f' for the {form} target' if form else ''}: "
                                       f"--target {args.target} cannot change it",
                                       fix=f"run the source model with --target {args.target} (it is lowered first), "
                                           "or leave --target out to run this one as it is")
        output_folder(args.output_dir, "-o", out)
        with Status(out.quiet).step("preparing the model"):
            model, done = runnable(args.model, args.target or "gpu")
        out.say(f"model: {args.model}: {done}")
        try:
            summary = run_frames(model, frames, args.output_dir, target=args.target or "gpu", threads=args.threads,
                                 compress=args.compress, ray=args.ray is not None, ray_address=args.ray or None,
                                 workers=args.workers, skip_existing=args.skip_existing, progress=not out.quiet)
        except KeyboardInterrupt:
            written = sum(path.exists() for path in output_paths(frames, Path(args.output_dir)))
            raise KeyboardInterrupt(f"{written} of {len(frames)} frames' outputs are in {args.output_dir}, each whole; "
                                    "the same command with --skip-existing does the rest") from None
        print(f"run: {summary}")
        out.say(f"outputs: {Path(args.output_dir) / '<frame>.npz'}")
        for warned in summary.warnings:
            print(f"warning: {warned.frame}: {warned.warning}")
        for failure in summary.failures:
            print(f"failed: {failure.frame}: {failure.error}")
        return 1 if summary.failures else 0
