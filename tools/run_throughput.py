"""Frames per second of `sparse-lower run` on this machine, locally and on Ray (docs/cli.md: running many
frames).

Writes --frames frames made from the two real nuScenes frames (each turned about the sensor by a
different angle: new scenes with the real density, 17k-80k voxels), then runs CenterPoint's backbone
(SpMiddleResNetFHD, deterministic weights, lowered for the gpu target) over them three ways, one after
the other in this process: one local session of 2 threads, Ray with 2 workers x 1 thread, Ray with
1 worker x 2 threads. Ray's local instance is started before the timed runs (its start is reported
apart); the actors' start is part of each Ray run's time. Every run's outputs must be the local run's
bytes.

    python tools/run_throughput.py [--frames 40] [--keep DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import sparse_lower
from sparse_lower.bench.cases import turned_frame
from sparse_lower.frames.sample import data_places, load_voxels
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.report import render

REAL = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")
RUNS = (("local, 1 session x 2 threads", dict(threads=2)),
        ("Ray, 2 workers x 1 thread", dict(ray=True, workers=2, threads=1)),
        ("Ray, 1 worker x 2 threads", dict(ray=True, workers=1, threads=2)))


def write_frames(folder: Path, count: int) -> tuple:
    frames = []
    for name in REAL:
        path = next(place for place in data_places(name) if place.is_file())
        frames.append(load_voxels(path))
    for i in range(count):
        features, coords, grid = frames[i % len(frames)]
        turned_features, turned_coords = turned_frame(features, coords, grid, 2 * np.pi * i / count)
        np.savez(folder / f"frame{i:04d}.npz", features=turned_features.astype(np.float16),
                 coords=turned_coords.astype(np.int32))
    return frames[0][2]


def same_outputs(a: Path, b: Path) -> bool:
    for path in sorted(a.glob("*.npz")):
        with np.load(path) as left, np.load(b / path.name) as right:
            if left.files != right.files or not all(np.array_equal(left[k], right[k]) for k in left.files):
                return False
    return len(list(a.glob("*.npz"))) == len(list(b.glob("*.npz")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--keep", help="write frames and outputs here instead of a temporary folder")
    args = parser.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.keep or scratch)
        (root / "frames").mkdir(parents=True, exist_ok=True)
        grid = write_frames(root / "frames", args.frames)
        model = sparse_lower.lower(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid))
        start = time.perf_counter()
        ray.init(include_dashboard=False, log_to_driver=False)
        print(f"Ray's local instance started in {time.perf_counter() - start:.1f} s")
        rows = []
        for i, (title, options) in enumerate(RUNS):
            out = root / f"out{i}"
            summary = sparse_lower.run_frames(model, [root / "frames"], out, progress=False, **options)
            assert not summary.failures, summary.failures
            same = "yes" if i == 0 else "yes" if same_outputs(root / "out0", out) else "NO"
            rows.append([title, len(summary.results), f"{summary.wall_s:.1f}", f"{summary.frames_per_s:.2f}", f"{summary.first_s:.1f}",
                         f"{summary.steady_frames_per_s:.2f}",
                         f"{summary.latency_ms(50):.0f}", f"{summary.latency_ms(95):.0f}", same])
        ray.shutdown()
    print(render(["run", "frames", "wall s", "frames/s", "first frame s", "frames/s after it", "p50 ms", "p95 ms", "outputs = local"], rows))


if __name__ == "__main__":
    main()
