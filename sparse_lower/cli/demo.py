"""sparse-lower demo."""

from __future__ import annotations

import time

import numpy as np

from ..api import lower
from ..models import centerpoint_head_stack
from ..models.voxels import find_data, load_voxels, synthetic_voxels
from ..runtime import create_session
from ..verify import compare
from ..report import render


def _median_ms(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


class Demo:
    """Lower and run the first CenterPoint sparse layers on a real nuScenes LiDAR frame.

    Builds SubM 5->16, SubM 16->16 and a strided SparseConv 16->32 (3x3x3) on the 41x1440x1440 grid,
    lowers it for the gpu target, runs it in onnxruntime with the custom-op library on the frame's
    voxels (../shared/data/nuscenes_centerpoint_voxels.npz, $SPARSE_LOWER_DATA, or --data; a
    synthetic LiDAR-like frame when none is found), checks it against the NumPy reference and prints
    the timings.

    example: sparse-lower demo
    """

    name = "demo"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--data", help="voxel .npz (features, coords, spatial_shape)")
        parser.add_argument("--repeat", type=int, default=5, help="timed runs (median reported)")

    def run(self, args) -> int:
        path = args.data or find_data()
        if path:
            features, coords, grid = load_voxels(path)
            print(f"frame: {path}: {len(coords):,} voxels on a {'x'.join(map(str, grid))} grid")
        else:
            features, coords, grid = synthetic_voxels()
            print(f"frame: no shared data found; synthetic LiDAR-like frame of {len(coords):,} voxels")
        model = centerpoint_head_stack(spatial_shape=grid)
        start = time.perf_counter()
        lowered = lower(model, target="gpu")
        lower_ms = (time.perf_counter() - start) * 1e3
        feeds = {"features": features, "coords": coords}
        session = create_session(lowered)
        outputs = session.run(None, feeds)
        run_ms = _median_ms(lambda: session.run(None, feeds), args.repeat)
        differences = compare(model, lowered, feeds)
        print(render(["stage", "time"], [["lower (compile)", f"{lower_ms:.1f} ms"],
                                         ["run lowered model (onnxruntime, median)", f"{run_ms:.1f} ms"]]))
        print(f"output: {outputs[0].shape[0]:,} active sites x {outputs[0].shape[1]} channels")
        worst = max(d.max_rel for d in differences)
        print(f"max relative error against the NumPy reference: {worst:.2e}")
        return 0 if worst < 1e-4 else 1
