"""sparse_lower.export of MinkowskiEngine 0.5.4 modules (exporter/minkowski_calls.py), against MinkowskiEngine
itself on the CPU: its convolutions (stride 1 as SubmanifoldConv, strided under the floor rule, transposed
back onto a finer level), max pooling, batch norms, activations, ME.cat and residual adds, on random
frames and on both real frames; MinkowskiEngine's own MinkUNets from its examples where
$SPARSE_LOWER_MINKOWSKI names a checkout at v0.5.4 (tools/minkowski_networks.py); and the refusals.
MinkowskiEngine has no wheel on PyPI: `bash tools/bench/install_minkowski.sh` builds it (about 7 to 13
minutes on 2 cores), which CI does not spend."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

ME = pytest.importorskip("MinkowskiEngine", reason="needs MinkowskiEngine 0.5.4: bash tools/bench/install_minkowski.sh")
import torch  # noqa: E402

import sparse_lower  # noqa: E402
from conftest import DATA  # noqa: E402
from helpers import load_tool, quantized  # noqa: E402
from sparse_lower.errors import SparseLowerError  # noqa: E402
from sparse_lower.exporter.minkowski_calls import minkowski_inference  # noqa: E402

TOOL = load_tool("minkowski_networks")
TARGETS = [("gpu", {}), ("nna", {}), ("portable", {})]


class UNet(torch.nn.Module):
    """Every call the export reads: a stride-1 conv of kernel K, a strided one (kernel `down`, stride 2), a
    max pooling, batch norms and ReLUs, a residual add, a transposed conv back to the first level, ME.cat."""

    def __init__(self, cin, kernel=3, down=2, dimension=3):
        super().__init__()
        conv = ME.MinkowskiConvolution
        self.stem = conv(cin, 8, kernel_size=kernel, dimension=dimension, bias=True)
        self.bn = ME.MinkowskiBatchNorm(8)
        self.relu = ME.MinkowskiReLU()
        self.down = conv(8, 16, kernel_size=down, stride=2, dimension=dimension)
        self.block = conv(16, 16, kernel_size=3, dimension=dimension)
        self.pool = ME.MinkowskiMaxPooling(kernel_size=2, stride=2, dimension=dimension)
        self.deep = conv(16, 16, kernel_size=3, dimension=dimension)
        self.up_deep = ME.MinkowskiConvolutionTranspose(16, 16, kernel_size=2, stride=2, dimension=dimension)
        self.up = ME.MinkowskiConvolutionTranspose(32, 8, kernel_size=down, stride=2, dimension=dimension)
        self.head = ME.MinkowskiLinear(16, 5)

    def forward(self, x):
        s1 = self.relu(self.bn(self.stem(x)))
        s2 = self.relu(self.down(s1))
        s2 = s2 + self.block(s2)
        s4 = self.deep(self.pool(s2))
        s2 = ME.cat(s2, self.up_deep(s4))
        return self.head(ME.cat(self.up(s2), s1))


def frame(rng, extent, count, batch=2, channels=3):
    total = batch * int(np.prod(extent))
    sites = rng.choice(total, min(count, total // 2), replace=False)
    coords = np.stack(np.unravel_index(sites, (batch, *extent)), axis=1).astype(np.int32)
    return rng.standard_normal((len(sites), channels)).astype(np.float32), coords


def seeded(net, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, ME.MinkowskiBatchNorm):
                m.bn.running_mean.copy_(torch.rand(m.bn.num_features, generator=generator) - 0.5)
                m.bn.running_var.copy_(torch.rand(m.bn.num_features, generator=generator) + 0.5)
    return net.eval()


def minkowski(net, features, coords):
    with minkowski_inference(net):
        return net(ME.SparseTensor(torch.from_numpy(features), torch.from_numpy(coords)))


def check_targets(model, net, frames):
    """Every target on every frame against MinkowskiEngine, rows by site."""
    for features, coords in frames:
        expected = minkowski(net, features, coords)
        for target, options in TARGETS:
            session = sparse_lower.create_session(sparse_lower.lower(model, target=target, **options))
            error = TOOL.compare(session.run(None, {"features": features, "coords": coords.astype(np.int64)}),
                                 [expected])
            assert error <= 1e-4, (target, error)


@pytest.mark.parametrize("kernel, down, dimension", [(3, 2, 3), (5, 3, 3), (1, 2, 3), (3, 2, 2), (3, 3, 2)])
def test_a_minkowski_unet_exports_and_matches_minkowski_engine_on_every_target(kernel, down, dimension):
    rng = np.random.default_rng(kernel * 10 + down + dimension)
    extent = [13, 11, 9][:dimension]
    net = seeded(UNet(3, kernel, down, dimension), kernel)
    first = frame(rng, extent, 300)
    model = sparse_lower.export(net, ME.SparseTensor(torch.from_numpy(first[0]), torch.from_numpy(first[1])),
                                max_spatial_shape=extent)
    kinds = {node.op_type for node in model.graph.node if node.domain == "sparse"}
    assert kinds == {"SubmanifoldConv", "SparseConv", "SparseMaxPool", "SparseDeconv"}
    assert all(any(a.name == "output_sites" and a.s == b"floor" for a in node.attribute)
               for node in model.graph.node if node.op_type in ("SparseConv", "SparseMaxPool"))
    check_targets(model, net, [first, frame(rng, extent, 500), frame(rng, extent, 1, batch=1)])


def test_a_minkowski_unet_on_the_real_frames():
    frames = []
    for name in TOOL.FRAMES.values():
        features, coords, _ = sparse_lower.frames.sample.load_voxels(DATA / name)
        frames.append((features.astype(np.float32), coords.astype(np.int32)))
    net = seeded(UNet(frames[0][0].shape[1]), 0)
    model = sparse_lower.export(net, ME.SparseTensor(*(torch.from_numpy(a) for a in frames[0])),
                                max_spatial_shape=list(TOOL.GRID))
    check_targets(model, net, frames)


def test_signed_coordinates_of_the_real_frames_match_minkowski_engine_on_every_target():
    """MinkowskiEngine on its users' own quantization, negative for half of every frame: exported once, with
    the export's defaults, and run on both frames and a batch of two, every target, against MinkowskiEngine."""
    voxels = [sparse_lower.frames.sample.load_voxels(DATA / name)[0] for name in TOOL.FRAMES.values()]
    frames = [quantized(v) for v in voxels]
    assert all((coords[:, 1:] < 0).any() for _, coords in frames)
    halves = [quantized(voxels[0][: len(voxels[0]) // 2]), quantized(voxels[1][: len(voxels[1]) // 3], batch=1)]
    batch = (np.concatenate([f for f, _ in halves]), np.concatenate([c for _, c in halves]))
    net = seeded(UNet(frames[0][0].shape[1]), 0)
    model = sparse_lower.export(net, ME.SparseTensor(*(torch.from_numpy(a) for a in frames[0])))
    check_targets(model, net, [*frames, batch])


@pytest.mark.parametrize("shift", [(7, 5, 11), (600, 1, 12)])
def test_signed_coordinates_keep_every_level_of_a_stride_three_network(shift):
    """The frame's origin is a multiple of the deepest stride (2 · 3 here): a frame moved by any amount keeps
    MinkowskiEngine's sites and values at every level."""
    rng = np.random.default_rng(11)
    extent = [14, 12, 10]
    net = Classifier(3, ME.MinkowskiGlobalMaxPooling).eval()
    first = frame(rng, extent, 400, batch=2)
    model = sparse_lower.export(net, ME.SparseTensor(torch.from_numpy(first[0]), torch.from_numpy(first[1])))
    moved = [(f, c - np.array([0, *shift], np.int32)) for f, c in [first, frame(rng, extent, 300, batch=3)]]
    check_targets(model, net, [first, *moved])


@pytest.mark.skipif(not os.environ.get("SPARSE_LOWER_MINKOWSKI"),
                    reason="MinkowskiEngine's MinkUNets are read from its examples: set SPARSE_LOWER_MINKOWSKI to a "
                           "checkout of NVIDIA/MinkowskiEngine at v0.5.4")
@pytest.mark.parametrize("name", ["MinkUNet14", "MinkUNet34C"])
def test_minkowski_engines_own_minkunets_match_it_on_every_target(name):
    worst = TOOL.check(Path(os.environ["SPARSE_LOWER_MINKOWSKI"]), name, DATA, list(TOOL.FRAMES),
                       ["gpu", "nna", "portable"])
    assert worst <= 1e-4


class Classifier(torch.nn.Module):
    """A ResNet's head: an instance norm, a stride-3 conv, a global pooling of `mode`, a linear layer."""

    def __init__(self, cin, pooling):
        super().__init__()
        self.stem = ME.MinkowskiConvolution(cin, 8, kernel_size=3, stride=2, dimension=3)
        self.norm = ME.MinkowskiInstanceNorm(8)
        self.act = ME.MinkowskiGELU()
        self.down = ME.MinkowskiConvolution(8, 16, kernel_size=3, stride=3, dimension=3)
        self.pool = pooling()
        self.head = ME.MinkowskiLinear(16, 4)

    def forward(self, x):
        return self.head(self.pool(self.down(self.act(self.norm(self.stem(x))))))


@pytest.mark.parametrize("pooling", [ME.MinkowskiGlobalMaxPooling, ME.MinkowskiGlobalAvgPooling,
                                     ME.MinkowskiGlobalSumPooling])
def test_instance_norm_and_global_pooling_match_minkowski_engine_per_batch(pooling):
    rng = np.random.default_rng(7)
    extent = [14, 12, 10]
    net = Classifier(3, pooling).eval()
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.5, 0.5)
    first = frame(rng, extent, 400, batch=3)
    model = sparse_lower.export(net, ME.SparseTensor(torch.from_numpy(first[0]), torch.from_numpy(first[1])),
                                max_spatial_shape=extent)
    assert "Coalesce" in {node.op_type for node in model.graph.node}
    check_targets(model, net, [first, frame(rng, extent, 300, batch=2), frame(rng, extent, 50, batch=1)])


@pytest.mark.parametrize("layer, message", [
    (lambda: ME.MinkowskiAvgPooling(kernel_size=2, stride=2, dimension=3), r"MinkowskiAvgPooling .* cannot be exported"),
    (lambda: ME.MinkowskiSumPooling(kernel_size=2, stride=2, dimension=3), r"MinkowskiSumPooling .* cannot be exported"),
    (lambda: ME.MinkowskiConvolution(3, 4, kernel_size=2, dimension=3), r"stride 1 and an even kernel \[2, 2, 2\]"),
    (lambda: ME.MinkowskiGenerativeConvolutionTranspose(3, 4, kernel_size=2, stride=2, dimension=3),
     r"MinkowskiGenerativeConvolutionTranspose .* cannot be exported"),
])
def test_calls_without_a_source_op_are_refused_naming_the_module_and_line(layer, message):
    net = torch.nn.Sequential(layer())
    features, coords = frame(np.random.default_rng(0), [6, 6, 6], 40)
    with pytest.raises(SparseLowerError, match=message) as error:
        sparse_lower.export(net, ME.SparseTensor(torch.from_numpy(features), torch.from_numpy(coords)))
    assert "node '0'" in str(error.value) and "test_minkowski_export.py" in str(error.value)


def test_repeated_sites_are_refused():
    features, coords = frame(np.random.default_rng(0), [6, 6, 6], 40)
    coords[1] = coords[0]

    class Build(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ME.MinkowskiConvolution(3, 4, kernel_size=3, dimension=3)

        def forward(self, f, c):
            return self.conv(ME.SparseTensor(f, c))

    with pytest.raises(SparseLowerError, match="repeat a site"):
        sparse_lower.export(Build(), (torch.from_numpy(features), torch.from_numpy(coords)))
