"""sparse_lower.export of TorchSparse 1.4.0 modules (exporter/torchsparse_calls.py), mmdetection3d's pin,
against TorchSparse itself on the CPU: stride-1 convs as SubmanifoldConv, strided ones under the floor rule
(stride = kernel) and under spconv's rule above the frame's smallest coordinate (an odd kernel of another
stride), transposed convs back onto a finer level, batch norms, ReLUs, torchsparse.cat, on random frames and on
the real frames; TorchSparse's own backbones where $SPARSE_LOWER_TORCHSPARSE names a checkout at v2.0.0
(tools/torchsparse_networks.py); and the refusals. TorchSparse is not on PyPI: `bash
tools/bench/install_torchsparse.sh CHECKOUT` builds it from a checkout at v1.4.0 (about 2 minutes), which
CI does not do.

TorchSparse 1.4's CPU kernel hash gives every query the batch of the first row (fixed in 2.0): its kernel maps
are wrong for a frame of several batches. Such frames are compared with TorchSparse run on each batch alone,
which is what the module computes for each."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torchsparse = pytest.importorskip("torchsparse", reason="needs TorchSparse 1.4.0: bash tools/bench/install_torchsparse.sh "
                                                        "CHECKOUT (a checkout of mit-han-lab/torchsparse at v1.4.0)")
import torch  # noqa: E402
import torchsparse.nn as spnn  # noqa: E402

import sparse_lower  # noqa: E402
from conftest import DATA  # noqa: E402
from helpers import load_tool, quantized  # noqa: E402
from sparse_lower.errors import SparseLowerError  # noqa: E402
from sparse_lower.exporter.torchsparse_calls import torchsparse_inference  # noqa: E402

TOOL = load_tool("torchsparse_networks")
TARGETS = ["gpu", "nna", "portable"]


class UNet(torch.nn.Module):
    """A stem of kernel `kernel`, a strided conv (kernel `down`, stride `stride`), a block, a transposed conv
    back, torchsparse.cat with the stem and a 1 × 1 × 1 head (TorchSparse's matmul)."""

    def __init__(self, cin, kernel=3, down=2, stride=2):
        super().__init__()
        self.stem = torch.nn.Sequential(spnn.Conv3d(cin, 8, kernel, bias=True), spnn.BatchNorm(8), spnn.ReLU(True))
        self.down = torch.nn.Sequential(spnn.Conv3d(8, 16, down, stride=stride), spnn.ReLU(True))
        self.block = spnn.Conv3d(16, 16, 3)
        self.up = spnn.Conv3d(16, 8, down, stride=stride, transposed=True)
        self.head = spnn.Conv3d(16, 5, 1, bias=True)

    def forward(self, x):
        s1 = self.stem(x)
        s2 = self.block(self.down(s1))
        return self.head(torchsparse.cat([self.up(s2), s1]))


def frame(rng, extent, count, batch=1, channels=3):
    total = batch * int(np.prod(extent))
    sites = rng.choice(total, min(count, total // 2), replace=False)
    b, *spatial = np.unravel_index(sites, (batch, *extent))
    coords = np.stack([*spatial, b], axis=1).astype(np.int32)
    return rng.standard_normal((len(sites), channels)).astype(np.float32), coords


def seeded(net, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=generator) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
    return net.eval()


def torchsparse_by_batch(net, features, coords):
    """(features, coords) of the module on each batch alone, concatenated (see the module docstring)."""
    parts = []
    for batch in np.unique(coords[:, 3]):
        rows = coords[:, 3] == batch
        with torchsparse_inference(net):
            out = net(torchsparse.SparseTensor(torch.from_numpy(features[rows]), torch.from_numpy(coords[rows])))
        parts.append((out.F.numpy(), out.C.numpy()))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def check_targets(model, net, frames):
    for features, coords in frames:
        want, sites = torchsparse_by_batch(net, features, coords)
        expected = [type("Rows", (), {"F": torch.from_numpy(want), "C": torch.from_numpy(sites)})()]
        for target in TARGETS:
            session = sparse_lower.create_session(sparse_lower.lower(model, target=target))
            error = TOOL.compare(session.run(None, {"features": features, "coords": coords.astype(np.int64)}), expected)
            assert error <= 1e-4, (target, error)


@pytest.mark.parametrize("kernel, down, stride", [(3, 2, 2), (3, 3, 3), (5, 3, 2), (1, 2, 2), (3, 3, 2)])
def test_a_torchsparse_unet_exports_and_matches_torchsparse_on_every_target(kernel, down, stride):
    rng = np.random.default_rng(kernel * 10 + down + stride)
    extent = [13, 11, 9]
    net = seeded(UNet(3, kernel, down, stride), kernel)
    first = frame(rng, extent, 300)
    model = sparse_lower.export(net, torchsparse.SparseTensor(*(torch.from_numpy(a) for a in first)),
                                max_spatial_shape=extent)
    strided = [node for node in model.graph.node if node.op_type == "SparseConv"]
    floor = [any(a.name == "output_sites" and a.s == b"floor" for a in node.attribute) for node in strided]
    assert floor == [down == stride]
    check_targets(model, net, [first, frame(rng, extent, 500, batch=2), frame(rng, extent, 1)])


def test_a_torchsparse_unet_on_the_real_frames():
    frames = [TOOL.frame_input(DATA / name) for name in TOOL.FRAMES.values()]
    net = seeded(UNet(frames[0][0].shape[1]), 0)
    model = sparse_lower.export(net, torchsparse.SparseTensor(*(torch.from_numpy(a) for a in frames[0])),
                                max_spatial_shape=list(TOOL.GRID))
    check_targets(model, net, frames)


def theirs(frame):
    """A (features, (batch, x, y, z)) frame with TorchSparse's coordinate columns, (x, y, z, batch)."""
    return frame[0], np.ascontiguousarray(frame[1][:, [1, 2, 3, 0]])


def test_signed_coordinates_of_the_real_frames_match_torchsparse_on_every_target():
    """TorchSparse on its users' own quantization, floor(xyz / voxel) around the sensor, negative for half of
    every frame: exported once with the export's defaults, run on both frames and a batch of two."""
    voxels = [sparse_lower.frames.sample.load_voxels(DATA / name)[0] for name in TOOL.FRAMES.values()]
    frames = [theirs(quantized(v)) for v in voxels]
    assert all((coords[:, :3] < 0).any() for _, coords in frames)
    halves = [quantized(voxels[0][: len(voxels[0]) // 2]), quantized(voxels[1][: len(voxels[1]) // 3], batch=1)]
    batch = theirs((np.concatenate([f for f, _ in halves]), np.concatenate([c for _, c in halves])))
    net = seeded(UNet(frames[0][0].shape[1]), 0)
    model = sparse_lower.export(net, torchsparse.SparseTensor(*(torch.from_numpy(a) for a in frames[0])))
    check_targets(model, net, [*frames, batch])


@pytest.mark.parametrize("down, stride, shift", [(2, 2, (7, 5, 11)), (3, 3, (600, 1, 12)), (3, 2, (9, 4, 1))])
def test_signed_coordinates_keep_every_level(down, stride, shift):
    """The frame's origin is a multiple of the deepest stride: a frame moved by any amount keeps TorchSparse's
    sites and values at every level, under the floor rule and under spconv's above the frame's minimum."""
    rng = np.random.default_rng(down + stride)
    extent = [13, 11, 9]
    net = seeded(UNet(3, 3, down, stride), down)
    first = frame(rng, extent, 300)
    model = sparse_lower.export(net, torchsparse.SparseTensor(*(torch.from_numpy(a) for a in first)))
    moved = [(f, c - np.array([*shift, 0], np.int32)) for f, c in [first, frame(rng, extent, 400, batch=2)]]
    check_targets(model, net, [first, *moved])


class PointVoxel(torch.nn.Module):
    """SPVCNN's first step (initial_voxelize): points hashed onto voxels, counted and averaged there."""

    def __init__(self):
        super().__init__()
        self.conv = spnn.Conv3d(3, 4, 3)

    def forward(self, points, features):
        import torchsparse.nn.functional as F

        floored = torch.floor(points).int()
        pc_hash = F.sphash(floored)
        sparse_hash = torch.unique(pc_hash)
        idx_query = F.sphashquery(pc_hash, sparse_hash)
        counts = F.spcount(idx_query.int(), len(sparse_hash))
        coords = F.spvoxelize(torch.floor(points), idx_query, counts).int()
        return self.conv(torchsparse.SparseTensor(F.spvoxelize(features, idx_query, counts), coords)).F


def test_point_voxel_functions_are_refused_by_name_and_line():
    """Their results would be the example's constants: the export refuses the first, naming it and its line."""
    rng = np.random.default_rng(0)
    points = np.concatenate([rng.uniform(-4, 4, (200, 3)), np.zeros((200, 1))], axis=1).astype(np.float32)
    features = rng.standard_normal((200, 3)).astype(np.float32)
    with pytest.raises(SparseLowerError, match=r"torchsparse.nn.functional.sphash \(called at .*"
                                               r"test_torchsparse_export.py:\d+\) cannot be exported yet"):
        sparse_lower.export(PointVoxel(), (torch.from_numpy(points), torch.from_numpy(features)))


@pytest.mark.skipif(not os.environ.get("SPARSE_LOWER_TORCHSPARSE"),
                    reason="TorchSparse's backbones are read from its source: set SPARSE_LOWER_TORCHSPARSE to a "
                           "checkout of mit-han-lab/torchsparse at v2.0.0")
@pytest.mark.parametrize("name", TOOL.NETWORKS)
def test_torchsparses_own_backbones_match_it_on_every_target(name):
    worst = TOOL.check(Path(os.environ["SPARSE_LOWER_TORCHSPARSE"]), name, DATA, list(TOOL.FRAMES), TARGETS)
    assert worst <= 1e-4


@pytest.mark.parametrize("layer, message", [
    (lambda: spnn.Conv3d(3, 4, 3, dilation=2), r"TorchSparse 1.4 ignores the dilation"),
    (lambda: spnn.Conv3d(3, 4, 2), r"kernel \[2, 2, 2\] and stride \[1, 1, 1\] .* cannot be exported yet"),
    (lambda: spnn.Conv3d(3, 4, 4, stride=2), r"kernel \[4, 4, 4\] and stride \[2, 2, 2\] .* cannot be exported yet"),
])
def test_convs_without_a_source_op_are_refused_naming_the_module_and_line(layer, message):
    features, coords = frame(np.random.default_rng(0), [6, 6, 6], 40)
    with pytest.raises(SparseLowerError, match=message) as error:
        sparse_lower.export(torch.nn.Sequential(layer()), torchsparse.SparseTensor(torch.from_numpy(features),
                                                                                   torch.from_numpy(coords)))
    assert "node '0'" in str(error.value) and "test_torchsparse_export.py" in str(error.value)
