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
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import CONV_OPS, conv_geometry
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


def _picture(path: Path, title: str, draw) -> Path:
    """A square figure of one plot in BEV cells with its colour bar, `draw(axis)` returning what the bar reads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 7))
    mapped = draw(axis)
    axis.set_title(title)
    axis.set_xlabel("x cell")
    axis.set_ylabel("y cell")
    figure.colorbar(mapped, ax=axis, fraction=0.046)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def save_bev_picture(dense: np.ndarray, path: Path) -> Path:
    """The bird's-eye view of the backbone output: per BEV cell the largest channel magnitude."""
    bev = np.log1p(np.abs(dense[0]).max(axis=0))  # log: a few bright cells would hide the rest
    return _picture(path, f"CenterPoint backbone output, {bev.shape[0]}x{bev.shape[1]} BEV cells: log(1 + max "
                          f"|channel|)", lambda axis: axis.imshow(bev, origin="lower", cmap="magma"))


def save_sites_picture(heads: np.ndarray, coords: np.ndarray, bev: tuple, path: Path) -> Path:
    """VoxelNeXt's sparse output: every BEV site it keeps, coloured by its strongest heatmap score."""
    from ..models.voxelnext import HEAD_CHANNELS

    starts = np.cumsum([0, *(channels for _, _, channels in HEAD_CHANNELS)])
    heatmaps = [heads[:, start:start + channels] for (_, branch, channels), start in zip(HEAD_CHANNELS, starts)
                if branch == "hm"]
    score = 1 / (1 + np.exp(-np.concatenate(heatmaps, axis=1).max(axis=1)))

    def draw(axis):
        axis.set_xlim(0, bev[1])
        axis.set_ylim(0, bev[0])
        return axis.scatter(coords[:, 2], coords[:, 1], c=score, s=1, cmap="magma")
    return _picture(path, f"VoxelNeXt: {len(coords):,} sparse BEV sites of {bev[0]}x{bev[1]}, strongest heatmap "
                          f"score", draw)


DEMO_TARGETS = ("gpu", "portable")  # the forms one onnxruntime session runs whole on a CPU
DEMO_MODELS = ("centerpoint", "voxelnext")


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
    --model voxelnext runs the fully sparse detector VoxelNeXt instead (OpenPCDet's nuScenes
    configuration, built as source ops: no exporter in the wild writes it): backbone and six heads, its
    output the head channels on the sparse BEV sites, never densified.
    --check also runs the NumPy reference on the imported model and prints the largest error.

    example: sparse-lower demo
             sparse-lower demo --model voxelnext
    """

    name = "demo"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--data", help="voxel .npz (features, coords, spatial_shape)")
        parser.add_argument("--repeat", type=int, default=3, help="timed runs (median reported)")
        parser.add_argument("--model", default="centerpoint", choices=DEMO_MODELS,
                            help="centerpoint (NVIDIA-format export of its backbone, default) or voxelnext")
        parser.add_argument("--picture", help="where to draw the output (default: <model>_bev.png)")
        parser.add_argument("--check", action="store_true", help="compare with the NumPy reference (slow)")
        parser.add_argument("--target", default="gpu", choices=DEMO_TARGETS,
                            help="gpu (custom ops, default) or portable (standard ops, run without the library)")

    def run(self, args, out: Verbosity) -> int:
        # the reference networks are imported on demand: the other commands never load them
        from ..models import CanonicalEmitter, NvidiaEmitter, sp_middle_resnet_fhd, voxelnext

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
        if args.model == "voxelnext":
            imported = clock.time("build VoxelNeXt (source ops)",
                                  lambda: voxelnext(CanonicalEmitter("voxelnext"), np.random.default_rng(0),
                                                    spatial_shape=grid))
        else:
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
        first = clock.time("first run", lambda: session.run(None, feeds))
        runs = [clock.time(f"run {i + 1}", lambda: session.run(None, feeds))[0] for i in range(args.repeat)]
        timed = [ms for stage, ms in clock.stages if stage.startswith("run ")]
        rows = [[stage, f"{ms:,.1f} ms"] for stage, ms in clock.stages if not stage.startswith("run ")]
        rows.append([f"run (median of {len(timed)})", f"{np.median(timed):,.1f} ms"])
        out.say(render(["stage", "time"], rows))
        result = first[0]
        picture = Path(args.picture or f"{args.model}_bev.png")
        if args.model == "voxelnext":
            sites = first[1]
            last = [n for n in imported.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS][-1]
            bev = conv_geometry(last).output_shape
            print(f"output: {len(sites):,} sparse BEV sites of {bev[0]}x{bev[1]} (nothing densified), "
                  f"{result.shape[1]} head channels, mean {result.mean():.4f}, max {result.max():.4f}")
            drawn = save_sites_picture(result, sites, bev, picture)
        else:
            occupied = np.abs(result[0]).max(axis=0) > 0
            print(f"output: {list(result.shape)} float32, {int(occupied.sum()):,} of {occupied.size:,} BEV cells "
                  f"non-zero, mean {result.mean():.4f}, max {result.max():.4f}")
            drawn = save_bev_picture(result, picture)
        if not all(np.array_equal(run, result) for run in runs):
            raise SparseLowerError("runs of the same frame gave different outputs",
                                   fix="report it: every kernel is meant to give the same bits on every run")
        print(f"picture: {drawn.absolute()} (--picture PATH to put it elsewhere)")
        if args.check:
            from .. import reference

            expected = next(iter(reference.run(imported, feeds).values()))
            error = float(np.abs(result - expected).max() / max(np.abs(expected).max(), 1e-12))
            print(f"max relative error against the NumPy reference: {error:.2e}")
            return 0 if error < 1e-4 else 1
        return 0
