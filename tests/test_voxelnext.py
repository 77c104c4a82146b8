"""VoxelNeXt, the fully sparse detector (sparse_lower.models.voxelnext): its source-op form against the same
network in spconv on the real BEVFusion frame and on batches, for every target; `sparse_lower.export` of
the spconv form (VoxelNeXt's own torch code for the merge) gives the same model; and, where an OpenPCDet
checkout is given ($SPARSE_LOWER_OPENPCDET), OpenPCDet's own modules through tools/voxelnext_openpcdet.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason='needs torch and spconv: pip install ".[spconv]"')
pytest.importorskip("spconv.pytorch", reason='needs torch and spconv: pip install ".[spconv]"')

import sparse_lower  # noqa: E402
from conftest import DATA  # noqa: E402
from helpers import run_lowered  # noqa: E402
from sparse_lower.capacity import level_rows, most_members  # noqa: E402
from sparse_lower.frames.sample import load_voxels, synthetic_voxels  # noqa: E402
from sparse_lower.models import HEAD_CHANNELS, CanonicalEmitter, voxelnext  # noqa: E402
from sparse_lower.models.spconv_emitter import SpconvEmitter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _spconv(features, coords, grid, batch=1):
    network = voxelnext(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid, batch_size=batch)
    ((heads, sites),) = network(features, coords)
    order = np.lexsort(sites.T[::-1])
    return heads[order], sites[order]


def _check(model, feeds, expected, targets):
    heads, sites = expected
    for target, options in targets:
        outputs = run_lowered(model, feeds, target=target, **options)
        np.testing.assert_array_equal(outputs["output_coords"], sites, err_msg=target)
        error = np.abs(outputs["output"] - heads).max() / np.abs(heads).max()
        assert error < 1e-4, (target, options, error)


def test_the_head_channels_are_every_branch_of_every_head():
    assert sum(channels for _, _, channels in HEAD_CHANNELS) == 70
    assert [b for h, b, _ in HEAD_CHANNELS if h == 0] == ["center", "center_z", "dim", "rot", "vel", "hm"]


def test_voxelnext_on_the_real_bevfusion_frame_matches_spconv_on_gpu_nna_and_hybrid():
    features, coords, grid = load_voxels(DATA / "nuscenes_bevfusion_voxels.npz")
    features, coords = features.astype(np.float32), coords.astype(np.int64)
    model = voxelnext(CanonicalEmitter("voxelnext"), np.random.default_rng(0), spatial_shape=grid)
    feeds = {"features": features, "coords": coords}
    capacities, members = level_rows(model, [feeds]), most_members(model, [feeds])
    assert len(capacities) == 9 and members > 1  # six levels, the merged rows, the BEV sites, conv_out's
    _check(model, feeds, _spconv(features, coords, grid),
           [("gpu", {}), ("nna", {"max_active": capacities, "max_members": members, "layout": "rows"}),
            ("hybrid", {"max_active": capacities, "max_members": members})])


def test_voxelnext_on_a_batch_of_two_matches_spconv_on_every_target():
    features, coords, grid = synthetic_voxels(1500, seed=1)
    second = coords.copy()
    second[:, 0] = 1
    features = np.concatenate([features, features[::-1]]).astype(np.float32)
    coords = np.concatenate([coords, second]).astype(np.int64)
    model = voxelnext(CanonicalEmitter("voxelnext"), np.random.default_rng(0), spatial_shape=grid, batch_size=2)
    _check(model, {"features": features, "coords": coords}, _spconv(features, coords, grid, batch=2),
           [("gpu", {}), ("nna", {}), ("hybrid", {}), ("portable", {})])


def test_exporting_the_spconv_network_gives_the_source_op_network():
    """The spconv form runs VoxelNeXt's own merge (indices *= k, torch.cat, torch.unique + index_add_);
    sparse_lower.export traces it into the ops the canonical form writes, and the two compute the same."""
    features, coords, grid = synthetic_voxels(1200, seed=2)
    features = features.astype(np.float32)
    network = voxelnext(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid)
    exported = sparse_lower.export(network.module, network.sparse_tensor(features, coords))
    built = voxelnext(CanonicalEmitter("voxelnext"), np.random.default_rng(0), spatial_shape=grid)
    kinds = [n.op_type for n in exported.graph.node if n.domain == "sparse"]
    assert kinds == [n.op_type for n in built.graph.node if n.domain == "sparse"]
    assert kinds.count("Coalesce") == 1
    feeds = {"features": features, "coords": coords.astype(np.int64)}
    ours = run_lowered(exported, feeds)
    theirs = run_lowered(built, feeds)
    np.testing.assert_array_equal(ours["out_coords"], theirs["output_coords"])
    np.testing.assert_allclose(ours["out_features"], theirs["output"], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not os.environ.get("SPARSE_LOWER_OPENPCDET"),
                    reason="OpenPCDet is not on PyPI: set SPARSE_LOWER_OPENPCDET to a checkout of "
                           "open-mmlab/OpenPCDet to run its own VoxelNeXt modules")
def test_openpcdets_own_voxelnext_matches_spconv_on_every_target():
    result = subprocess.run([sys.executable, "tools/voxelnext_openpcdet.py", "--frames", "bevfusion", "--repeat", "1",
                             "--data", str(DATA)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sites identical, 36 branches" in result.stdout
