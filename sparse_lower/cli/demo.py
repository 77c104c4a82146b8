"""sparse-lower demo."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from ..api import lower
from ..errors import SparseLowerError
from ..frames.files import COORDS_KEY, FEATURES_KEY, feeds_of, read_frames
from ..verify import non_finite
from ..frames.sample import CENTERPOINT_GRID, NUSCENES_HALF_WIDTH_M, data_places, find_data, synthetic_voxels
from ..importers import import_model
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import CONV_OPS, conv_geometry
from ..report import render
from ..runtime import session_for
from .counts import count
from .outputs import output_file
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


UNTRAINED = "deterministic random weights, not a trained network: the values are not detections"


def _picture(path: Path, title: str, draw, half_m: float | None) -> Path:
    """A square figure of one bird's-eye plot with its colour bar, `draw(axis)` returning what the bar
    reads; in metres about the sensor, which is marked, where the grid's extent is known (`half_m`: the
    distance from the sensor to each edge), else in cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 7.4))
    mapped = draw(axis)
    axis.set_title(f"{title}\n({UNTRAINED})", fontsize=9)
    if half_m is None:
        axis.set_xlabel("x (BEV cell)")
        axis.set_ylabel("y (BEV cell)")
    else:
        axis.set_xlabel("x (m, from the sensor)")
        axis.set_ylabel("y (m, from the sensor)")
        axis.plot([0], [0], marker="^", markersize=9, color="cyan", markeredgecolor="black", linestyle="none",
                  label="the sensor")
        axis.legend(loc="upper right", fontsize=8)
    figure.colorbar(mapped, ax=axis, fraction=0.046)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def half_width_m(grid: tuple) -> float | None:
    """How far the grid reaches from the sensor in x and y, in metres: known for nuScenes' grid only."""
    return NUSCENES_HALF_WIDTH_M if tuple(grid) == CENTERPOINT_GRID else None


def save_bev_picture(dense: np.ndarray, path: Path, half_m: float | None = None) -> Path:
    """The bird's-eye view of the backbone output: per BEV cell the largest channel magnitude."""
    bev = np.log1p(np.abs(dense[0]).max(axis=0))  # log: a few bright cells would hide the rest
    extent = None if half_m is None else (-half_m, half_m, -half_m, half_m)
    return _picture(path, f"CenterPoint backbone output, {bev.shape[0]}x{bev.shape[1]} BEV cells: log(1 + max "
                          f"|channel|)", lambda axis: axis.imshow(bev, origin="lower", cmap="magma", extent=extent),
                    half_m)


def save_sites_picture(heads: np.ndarray, coords: np.ndarray, bev: tuple, path: Path,
                       half_m: float | None = None) -> Path:
    """VoxelNeXt's sparse output: every BEV site it keeps, coloured by its strongest heatmap output
    (a sigmoid, as a trained network's scores would be)."""
    from ..models.voxelnext import HEAD_CHANNELS

    starts = np.cumsum([0, *(channels for _, _, channels in HEAD_CHANNELS)])
    heatmaps = [heads[:, start:start + channels] for (_, branch, channels), start in zip(HEAD_CHANNELS, starts)
                if branch == "hm"]
    score = 1 / (1 + np.exp(-np.concatenate(heatmaps, axis=1).max(axis=1)))
    y, x = coords[:, 1].astype(float), coords[:, 2].astype(float)
    if half_m is not None:  # cell centres in metres about the sensor
        y, x = (y + 0.5) * 2 * half_m / bev[0] - half_m, (x + 0.5) * 2 * half_m / bev[1] - half_m

    def draw(axis):
        axis.set_xlim(*((0, bev[1]) if half_m is None else (-half_m, half_m)))
        axis.set_ylim(*((0, bev[0]) if half_m is None else (-half_m, half_m)))
        return axis.scatter(x, y, c=score, s=1, cmap="magma")
    return _picture(path, f"VoxelNeXt: {len(coords):,} sparse BEV sites of {bev[0]}x{bev[1]}, coloured by the "
                          f"largest sigmoid of the heatmap heads", draw, half_m)


DEMO_TARGETS = ("gpu", "portable")  # the forms one onnxruntime session runs whole on a CPU
DEMO_MODELS = ("centerpoint", "voxelnext", "ptv3")


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
    --model ptv3 runs Pointcept's Point Transformer V3 (its nuScenes configuration, read from the Pointcept
    checkout $SPARSE_LOWER_POINTCEPT, with torch-scatter installed): exported from Pointcept's own module
    by sparse_lower.export, its output 64 features per voxel.
    --check also runs the NumPy reference on the imported model (ptv3: Pointcept's module in PyTorch) and
    prints the largest error.

    example: sparse-lower demo
             sparse-lower demo --model voxelnext
             SPARSE_LOWER_POINTCEPT=~/Pointcept sparse-lower demo --model ptv3
    """

    name = "demo"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--data", help="voxel .npz (features, coords, spatial_shape)")
        parser.add_argument("--repeat", type=count(1), default=3, help="timed runs (median reported)")
        parser.add_argument("--model", default="centerpoint", choices=DEMO_MODELS,
                            help="centerpoint (NVIDIA-format export of its backbone, default), voxelnext, or ptv3 "
                                 "(Pointcept's Point Transformer V3, from $SPARSE_LOWER_POINTCEPT)")
        parser.add_argument("--picture", help="where to draw the output (default: <model>_bev.png)")
        parser.add_argument("--save-model", metavar="PATH.onnx",
                            help="also write the model the demo starts from (centerpoint: the NVIDIA-format export; "
                                 "voxelnext, ptv3: its source ops), for convert, inspect and partition")
        parser.add_argument("--check", action="store_true", help="compare with the NumPy reference (slow)")
        parser.add_argument("--target", default="gpu", choices=DEMO_TARGETS,
                            help="gpu (custom ops, default) or portable (standard ops, run without the library)")

    def run(self, args, out: Verbosity) -> int:
        # the reference networks are imported on demand: the other commands never load them
        from ..models import CanonicalEmitter, NvidiaEmitter, sp_middle_resnet_fhd, voxelnext

        picture = output_file(args.picture or f"{args.model}_bev.png", "--picture", out, example="bev.png")
        saved = output_file(args.save_model, "--save-model", out, example=f"{args.model}.onnx") if args.save_model else None
        path = args.data or find_data()
        if path:
            ((path, frame),) = read_frames([path], folders=False)
            missing = [key for key in (FEATURES_KEY, COORDS_KEY) if key not in frame]
            if missing:
                raise SparseLowerError(f"frame {path}: no {' and '.join(repr(k) for k in missing)} array; it has "
                                       f"{', '.join(sorted(frame)) or 'no arrays'}",
                                       fix="store the voxels as features [N, 5] and coords [N, 4] (batch, z, y, x), "
                                           "as numpy.savez(path, features=..., coords=...)")
            grid = tuple(int(v) for v in frame.get("spatial_shape", CENTERPOINT_GRID))
            if len(grid) != 3 or min(grid) < 1:
                raise SparseLowerError(f"frame {path}: spatial_shape {list(grid)} is not a 3-D grid",
                                       fix="store the voxel grid as spatial_shape=[z, y, x], or leave it out for "
                                           f"CenterPoint's {list(CENTERPOINT_GRID)}")
            said = non_finite({FEATURES_KEY: np.asarray(frame[FEATURES_KEY])})
            if said:
                raise SparseLowerError(f"frame {path}: {said}", fix="give a frame of finite features (a voxelizer's "
                                       "NaN marks a voxel it had no point for: drop those rows)")
            count = len(frame.get("coords", ()))
            out.say(f"frame: {path}: {count:,} voxels on a {'x'.join(map(str, grid))} grid")
        else:
            features, coords, grid = synthetic_voxels()
            path, frame = "the synthetic frame", {"features": features, "coords": coords}
            looked = ", ".join(str(place) for place in data_places())
            out.say(f"frame: no voxel file in {looked}; a synthetic LiDAR-like frame of {len(coords):,} voxels "
                    f"(give one with --data FILE.npz or $SPARSE_LOWER_DATA)")
        clock = Stopwatch()
        if args.model == "ptv3":
            imported, feeds, expected = _point_transformer(frame, clock, args.check)
            written = imported
        elif args.model == "voxelnext":
            imported = clock.time("build VoxelNeXt (source ops)",
                                  lambda: voxelnext(CanonicalEmitter("voxelnext"), np.random.default_rng(0),
                                                    spatial_shape=grid))
            written = imported
        else:
            exported = clock.time("build the NVIDIA-format export",
                                  lambda: sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0),
                                                               spatial_shape=grid))
            written = exported
            with tempfile.TemporaryDirectory() as folder:
                source = Path(folder) / "scn.nvidia.onnx"
                onnx.save(exported, source)
                imported = clock.time("import (NVIDIA format -> source ops)", lambda: import_model(source))
        if saved:
            onnx.save(written, saved)
            print(f"wrote {saved}: the {args.model} model the demo starts from, for `sparse-lower convert`, "
                  "`inspect` and `partition`")
        if args.model != "ptv3":
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
        if args.model == "ptv3":
            print(f"output: {result.shape[0]:,} points x {result.shape[1]} features, mean {result.mean():.4f}, "
                  f"max {result.max():.4f}")
            drawn = save_points_picture(result, feeds["coord"], picture, half_width_m(grid))
        elif args.model == "voxelnext":
            sites = first[1]
            last = [n for n in imported.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS][-1]
            bev = conv_geometry(last).output_shape
            print(f"output: {len(sites):,} sparse BEV sites of {bev[0]}x{bev[1]} (nothing densified), "
                  f"{result.shape[1]} head channels, mean {result.mean():.4f}, max {result.max():.4f}")
            drawn = save_sites_picture(result, sites, bev, picture, half_width_m(grid))
        else:
            occupied = np.abs(result[0]).max(axis=0) > 0
            print(f"output: {list(result.shape)} float32, {int(occupied.sum()):,} of {occupied.size:,} BEV cells "
                  f"non-zero, mean {result.mean():.4f}, max {result.max():.4f}")
            drawn = save_bev_picture(result, picture, half_width_m(grid))
        if not all(np.array_equal(run, result, equal_nan=True) for run in runs):
            raise SparseLowerError("runs of the same frame gave different outputs",
                                   fix="report it: every kernel is meant to give the same bits on every run")
        print(f"picture: {drawn.absolute()} (--picture PATH to put it elsewhere)")
        print(f"note: {UNTRAINED}; they show the deployment path runs, and --check that it computes the network")
        if args.check:
            if args.model != "ptv3":
                from .. import reference

                expected = next(iter(reference.run(imported, feeds).values()))
            error = float(np.abs(result - expected).max() / max(np.abs(expected).max(), 1e-12))
            against = "Pointcept's module in PyTorch" if args.model == "ptv3" else "the NumPy reference"
            print(f"max relative error against {against}: {error:.2e}")
            return 0 if error < 1e-4 else 1
        return 0


def _point_transformer(frame: dict, clock: Stopwatch, check: bool):
    """(the exported PTv3, its feeds, Pointcept's own output where `check`) on the frame's voxels."""
    try:
        from ..checkouts import pointcept
    except ImportError as error:
        raise SparseLowerError(f"--model ptv3 needs torch ({error})", fix='pip install "sparse-lower[spconv,pointcept]"')
    try:
        module = clock.time("build PTv3 (Pointcept's module)", lambda: pointcept.build(pointcept.checkout(), "PTv3"))
    except ImportError as error:
        raise SparseLowerError(f"--model ptv3 needs spconv, torch-scatter and addict ({error})",
                               fix=pointcept.INSTALL) from error
    parts = [pointcept.grid_sampled(np.asarray(frame["features"], np.float32))]  # as Pointcept's pipeline grids it
    model = clock.time("export (sparse_lower.export)", lambda: pointcept.export(module, parts))
    feeds = {key: value.numpy() for key, value in pointcept.point_input(parts, module.channels).items()}
    expected = clock.time("Pointcept's module in PyTorch", lambda: pointcept.run_module(module, parts)) if check else None
    return model, feeds, expected


def save_points_picture(features: np.ndarray, points: np.ndarray, path: Path, half_m: float | None) -> Path:
    """The points seen from above at their (x, y) in metres, coloured by the length of their output features."""
    def draw(axis):
        axis.set_aspect("equal")
        return axis.scatter(points[:, 0], points[:, 1], c=np.linalg.norm(features, axis=1), s=0.5, cmap="magma")
    return _picture(path, f"PTv3: {len(features):,} points, coloured by the length of their {features.shape[1]} "
                          "output features", draw, half_m if half_m is not None else 0.0)
