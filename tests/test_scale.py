"""Scale: grids whose linear index is far beyond 2^31, a million active voxels and batch 16 give the
reference's results, and memory follows the active voxels, never the grid volume.

Peak memory is measured in a fresh child process (a process's resident high-water mark cannot be reset),
which builds the case, lowers it and runs it once.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import onnx
import pytest

from helpers import run_lowered
from oracle import random_sparse
from sparse_lower import reference
from sparse_lower.models import SparseModelBuilder

HUGE_GRID = (4096, 4096, 4096)  # × batch 8: linear sites up to 8·4096³ ≈ 5.5e11, far past 2^31 and 2^32
HUGE_BATCH = 8


def clustered_voxels(rng, batch: int, grid: tuple, clusters: int, size: int = 6) -> np.ndarray:
    """Distinct coords in `clusters` dense blobs of up to size³ sites (LiDAR-like: neighbours exist),
    centred anywhere in the grid, the corners included."""
    centres = rng.integers(0, grid, (clusters, len(grid)))
    centres[:2] = [[0] * len(grid), [g - 1 for g in grid]]
    offsets = rng.integers(-size // 2, size // 2 + 1, (clusters, size ** 3 // 4, len(grid)))
    spatial = np.clip(centres[:, None, :] + offsets, 0, np.array(grid) - 1).reshape(-1, len(grid))
    batches = np.repeat(rng.integers(0, batch, clusters), offsets.shape[1])[:, None]
    return np.unique(np.concatenate([batches, spatial], axis=1), axis=0).astype(np.int64)


def down_up_network(grid: tuple, cin: int = 4) -> onnx.ModelProto:
    """SubM → Relu → SparseConv s2 → SubM → inverse conv back onto the input coords."""
    coarse = tuple((g + 1) // 2 for g in grid)
    builder = SparseModelBuilder(len(grid), cin, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), grid).relu()
    builder.conv("SparseConv", 16, (3, 3, 3), grid, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]).relu()
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), coarse)
    output_padding = [(g + 2 - 2 - 1) % 2 for g in grid]
    builder.conv("SparseDeconv", 8, (3, 3, 3), coarse, target_coords="coords", strides=[2, 2, 2],
                 pads=[1, 1, 1, 1, 1, 1], output_padding=output_padding)
    return builder.build()


def assert_matches_reference(model, feeds: dict, target: str) -> None:
    expected = reference.run(model, feeds)
    got = run_lowered(model, feeds, threads=2, target=target)
    for name, want in expected.items():
        if want.dtype == np.int64:
            np.testing.assert_array_equal(got[name], want)
        else:
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)


def huge_grid_case(seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    coords = clustered_voxels(rng, HUGE_BATCH, HUGE_GRID, clusters=600)
    features = rng.standard_normal((len(coords), 4)).astype(np.float32)
    return down_up_network(HUGE_GRID), {"features": features, "coords": coords}


def million_voxel_case() -> tuple:
    grid = (64, 400, 400)  # 10.24 M sites, about one in ten active: real neighbourhoods
    features, coords = random_sparse(np.random.default_rng(1), 1, 4, grid, count=1_000_000)
    builder = SparseModelBuilder(3, 4, np.random.default_rng(2))
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), grid).relu()
    builder.conv("SparseConv", 8, (3, 3, 3), grid, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    return builder.build(), {"features": features, "coords": coords}


def _peak_of_one_run(case: str, target: str) -> float:
    """(In the child) build, lower and run the case once; the process's peak resident MiB."""
    model, feeds = {"huge": huge_grid_case, "million": million_voxel_case}[case]()
    run_lowered(model, feeds, threads=2, target=target)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_memory_mb(case: str, target: str) -> float:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_peak_of_one_run, (case, target))


@pytest.mark.parametrize("target", ["gpu", "nna"])
def test_a_grid_whose_linear_index_exceeds_2_to_the_31(target):
    model, feeds = huge_grid_case()
    sites = np.ravel_multi_index(feeds["coords"].T, (HUGE_BATCH, *HUGE_GRID))
    assert sites.max() > 2 ** 38
    assert_matches_reference(model, feeds, target)


def test_huge_grid_memory_follows_the_voxels_not_the_volume():
    """8·4096³ = 5.5e11 sites: a single byte per site would be 512 GiB."""
    assert peak_memory_mb("huge", "gpu") < 1024


def test_a_million_active_voxels():
    model, feeds = million_voxel_case()
    assert len(feeds["coords"]) == 1_000_000
    assert_matches_reference(model, feeds, "gpu")


def test_batch_16_equals_16_single_frames():
    """Every batch item alone, through the same lowered model, gives the rows the batched run gives it
    (to rounding: the rulebook groups its taps by the pair counts of the whole batch)."""
    grid = (10, 24, 24)
    model = down_up_network(grid)
    features, coords = random_sparse(np.random.default_rng(3), 16, 4, grid, density=0.05)
    batched = run_lowered(model, {"features": features, "coords": coords}, threads=2)
    assert_matches_reference(model, {"features": features, "coords": coords}, "gpu")
    for item in range(16):
        rows = coords[:, 0] == item
        alone = run_lowered(model, {"features": features[rows], "coords": coords[rows]}, threads=2)
        mine = batched[model.graph.output[1].name][:, 0] == item
        for name, value in alone.items():
            np.testing.assert_allclose(batched[name][mine], value, rtol=1e-5, atol=1e-5)
