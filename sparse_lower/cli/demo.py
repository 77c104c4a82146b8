"""sparse-lower demo."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from ..api import lower
from ..errors import SparseLowerError
from ..frames.files import feeds_of, read_frames
from ..frames.sample import CENTERPOINT_GRID, data_places, find_data, synthetic_voxels
from ..importers import import_model
from ..report import render
from ..runtime import session_for
from .verbosity import Verbosity


class Stopwatch:
    """Wall time of named stages, in the order they ran."""

    def __init__(self):
        self.stages: list[tuple[str, float]] = []

    def time(self, stage: str, work):
        start = time.perf_counter()
        result = work()
        self.stages.append((stage, (time.perf_counter() - start) * 1e3))
        return result


def save_bev_picture(dense: np.ndarray, path: Path) -> Path:
    """The bird's-eye view of the backbone output: per BEV cell the largest channel magnitude."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bev = np.log1p(np.abs(dense[0]).max(axis=0))  # log: a few bright cells would hide the rest
    figure, axis = plt.subplots(figsize=(7, 7))
    image = axis.imshow(bev, origin="lower", cmap="magma")
    axis.set_title(f"CenterPoint backbone output, {bev.shape[0]}x{bev.shape[1]} BEV cells: log(1 + max |channel|)")
    axis.set_xlabel("x cell")
    axis.set_ylabel("y cell")
    figure.colorbar(image, ax=axis, fraction=0.046)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


DEMO_TARGETS = ("gpu", "portable")  # the forms one onnxruntime session runs whole on a CPU


class DemoCommand:
    """Run CenterPoint's sparse backbone on a real nuScenes LiDAR frame, from an NVIDIA-format export.

    Builds SpMiddleResNetFHD (det3d, 5 voxel features, BatchNorm folded, deterministic weights) as
    the ONNX file NVIDIA's Lidar_AI_Solution tooling exports (SparseConvolution nodes, FP16 weights,
    no coordinates in the graph), then runs the full flow a user runs:
    import (to the source ops) -> lower (gpu target) -> onnxruntime with the custom-op library,
    or with --target portable, lower to standard ONNX ops -> a plain onnxruntime session (no library),
    on the frame's voxels (../shared/data/nuscenes_centerpoint_voxels.npz, $SPARSE_LOWER_DATA or
    --data; a synthetic LiDAR-like frame when none is found). Prints the time of every stage and a
    summary of the [1, 256, 180, 180] BEV output, and draws it to --picture.
    --check also runs the NumPy reference on the imported model and prints the largest error.

    example: sparse-lower demo
    """

    name = "demo"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--data", help="voxel .npz (features, coords, spatial_shape)")
        parser.add_argument("--repeat", type=int, default=3, help="timed runs (median reported)")
        parser.add_argument("--picture", default="centerpoint_bev.png", help="where to draw the BEV output")
        parser.add_argument("--check", action="store_true", help="compare with the NumPy reference (slow)")
        parser.add_argument("--target", default="gpu", choices=DEMO_TARGETS,
                            help="gpu (custom ops, default) or portable (standard ops, run without the library)")

    def run(self, args, out: Verbosity) -> int:
        # the reference networks are imported on demand: the other commands never load them
        from ..models.centerpoint import sp_middle_resnet_fhd
        from ..models.formats import NvidiaEmitter

        if args.repeat < 1:
            raise SparseLowerError(f"--repeat {args.repeat}: the timed runs are at least 1", fix="give --repeat 1 or more")
        path = args.data or find_data()
        if path:
            ((path, frame),) = read_frames([path], folders=False)
            grid = tuple(int(v) for v in frame.get("spatial_shape", CENTERPOINT_GRID))
            if len(grid) != 3 or min(grid) < 1:
                raise SparseLowerError(f"frame {path}: spatial_shape {list(grid)} is not a 3-D grid",
                                       fix="store the voxel grid as spatial_shape=[z, y, x], or leave it out for "
                                           f"CenterPoint's {list(CENTERPOINT_GRID)}")
            count = len(frame.get("coords", ()))
            out.say(f"frame: {path}: {count:,} voxels on a {'x'.join(map(str, grid))} grid")
        else:
            features, coords, grid = synthetic_voxels()
            path, frame = "the synthetic frame", {"features": features, "coords": coords}
            looked = ", ".join(str(place) for place in data_places())
            out.say(f"frame: no voxel file in {looked}; a synthetic LiDAR-like frame of {len(coords):,} voxels "
                    f"(give one with --data FILE.npz or $SPARSE_LOWER_DATA)")
        clock = Stopwatch()
        exported = clock.time("build the NVIDIA-format export",
                              lambda: sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0),
                                                           spatial_shape=grid))
        with tempfile.TemporaryDirectory() as folder:
            source = Path(folder) / "scn.nvidia.onnx"
            onnx.save(exported, source)
            imported = clock.time("import (NVIDIA format -> source ops)", lambda: import_model(source))
        (feeds,) = feeds_of(imported, [(path, frame)])  # the frame's arrays as the model's inputs, cast to their types
        lowered = clock.time(f"lower ({args.target} target)", lambda: lower(imported, target=args.target))
        opened = "a plain onnxruntime session (no library)" if args.target == "portable" else "the onnxruntime session"
        session = clock.time(f"create {opened}", lambda: session_for(lowered))
        (dense,) = clock.time("first run", lambda: session.run(None, feeds))
        runs = [clock.time(f"run {i + 1}", lambda: session.run(None, feeds))[0] for i in range(args.repeat)]
        timed = [ms for stage, ms in clock.stages if stage.startswith("run ")]
        rows = [[stage, f"{ms:,.1f} ms"] for stage, ms in clock.stages if not stage.startswith("run ")]
        rows.append([f"run (median of {len(timed)})", f"{np.median(timed):,.1f} ms"])
        out.say(render(["stage", "time"], rows))
        occupied = np.abs(dense[0]).max(axis=0) > 0
        print(f"output: {list(dense.shape)} float32, {int(occupied.sum()):,} of {occupied.size:,} BEV cells "
              f"non-zero, mean {dense.mean():.4f}, max {dense.max():.4f}")
        if not all(np.array_equal(run, dense) for run in runs):
            raise SparseLowerError("runs of the same frame gave different outputs",
                                   fix="report it: every kernel is meant to give the same bits on every run")
        print(f"picture: {save_bev_picture(dense, Path(args.picture)).absolute()} (--picture PATH to put it "
              f"elsewhere)")
        if args.check:
            from .. import reference

            expected = next(iter(reference.run(imported, feeds).values()))
            error = float(np.abs(dense - expected).max() / max(np.abs(expected).max(), 1e-12))
            print(f"max relative error against the NumPy reference: {error:.2e}")
            return 0 if error < 1e-4 else 1
        return 0
