"""The sample frames of the demo, the benchmarks, the tools and the tests: the real nuScenes frames of
`shared/data`, or a synthetic LiDAR-like frame when they are absent (a fresh install has no shared
data).

It is data loading, apart from the reference networks (sparse_lower/models/) that are run on it, so
that finding and reading a frame loads no network builder.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import SparseLowerError

CENTERPOINT_GRID = (41, 1440, 1440)  # CenterPoint's nuScenes voxel grid (z, y, x), the reference networks' default
NUSCENES_HALF_WIDTH_M = 54.0  # that grid's reach from the sensor in x and y: 720 voxels of 0.075 m
CENTERPOINT_FILE = "nuscenes_centerpoint_voxels.npz"


def data_places(name: str = CENTERPOINT_FILE) -> list[Path]:
    """Where the shared data file is looked for: $SPARSE_LOWER_DATA, else ../shared/data or ./shared/data
    from the cwd."""
    places = [Path(os.environ["SPARSE_LOWER_DATA"]) / name] if "SPARSE_LOWER_DATA" in os.environ else []
    return places + [Path.cwd().parent / "shared" / "data" / name, Path.cwd() / "shared" / "data" / name]


def find_data(name: str = CENTERPOINT_FILE) -> Path | None:
    """The shared data file, at the first of `data_places` that has it."""
    return next((place for place in data_places(name) if place.is_file()), None)


def load_voxels(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(features float32 [N, 5], coords int64 [N, 4] as batch, z, y, x, spatial_shape)."""
    data = np.load(path)
    return (data["features"].astype(np.float32), data["coords"].astype(np.int64),
            tuple(int(v) for v in data["spatial_shape"]))


def real_feeds(name: str = CENTERPOINT_FILE) -> dict[str, np.ndarray]:
    """The shared data frame `name` as the reference networks' feeds, {"features", "coords"}; the tools'
    one way of reading the real frames, refusing with the fix where the file is not found."""
    path = find_data(name)
    if path is None:
        raise SparseLowerError(f"no {name} at {', '.join(map(str, data_places(name)))}",
                               fix="run from the checkout root with ../shared/data beside it, or set SPARSE_LOWER_DATA")
    features, coords, _ = load_voxels(path)
    return {"features": features, "coords": coords}


def synthetic_voxels(count: int = 20000, seed: int = 0, grid=CENTERPOINT_GRID) -> tuple[np.ndarray, np.ndarray, tuple]:
    """A LiDAR-like frame: voxels on a ground plane in rings around the sensor plus a few upright
    objects, so that neighbourhoods are sparse but not isolated, as in a real scan."""
    rng = np.random.default_rng(seed)
    depth, height, width = grid
    radius = rng.uniform(10, min(height, width) / 2 - 1, count)
    angle = rng.uniform(0, 2 * np.pi, count)
    y = (height / 2 + radius * np.sin(angle)).astype(np.int64)
    x = (width / 2 + radius * np.cos(angle)).astype(np.int64)
    z = np.clip(rng.normal(depth * 0.3, 1.5, count), 0, depth - 1).astype(np.int64)
    coords = np.unique(np.column_stack([np.zeros(count, np.int64), z, y, x]), axis=0)
    coords = coords[rng.permutation(len(coords))]
    features = np.column_stack([coords[:, 3] * 0.075 - 54, coords[:, 2] * 0.075 - 54, coords[:, 1] * 0.2 - 5,
                                rng.random(len(coords)), np.zeros(len(coords))]).astype(np.float32)
    return features, coords, tuple(grid)
