"""sparse_lower.export of what fully sparse detectors do besides convolving (VoxelNeXt's coordinate scaling,
row concatenation, torch.unique + index_add_, spconv's SparseMaxPool): the exported model, lowered for
every target, against spconv itself on random frames (2-D and 3-D, batches), and the refusal of what it
cannot (an average pooling)."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason='needs torch and spconv: pip install ".[spconv]"')
spconv = pytest.importorskip("spconv.pytorch", reason='needs torch and spconv: pip install ".[spconv]"')

import sparse_lower  # noqa: E402
from helpers import run_lowered  # noqa: E402
from oracle import random_sparse  # noqa: E402
from sparse_lower.errors import SparseLowerError  # noqa: E402
from sparse_lower.exporter.spconv_calls import spconv_inference  # noqa: E402

TARGETS = [("gpu", {}), ("nna", {}), ("hybrid", {}), ("portable", {})]


def _bn(channels):
    norm = torch.nn.BatchNorm1d(channels, eps=1e-3)
    norm.running_mean.uniform_(-0.5, 0.5)
    norm.running_var.uniform_(0.5, 2.0)
    norm.weight.data.uniform_(0.5, 1.5)
    norm.bias.data.uniform_(-0.5, 0.5)
    return norm


class MergingNet(torch.nn.Module):
    """VoxelNeXt's pattern at small scale: two strided levels; the deeper one's indices scaled onto the
    first's grid in place, both concatenated, the first spatial axis dropped and coinciding sites summed
    (torch.unique + index_add_), a site-dilating conv on the merged grid, then a max pooling (strided, or
    submanifold) and a 1×1 head."""

    def __init__(self, ndim, channels=6, submanifold_pool=False):
        super().__init__()
        conv = {2: (spconv.SubMConv2d, spconv.SparseConv2d), 3: (spconv.SubMConv3d, spconv.SparseConv3d)}[ndim]
        low = {2: spconv.SparseConv1d, 3: spconv.SparseConv2d}[ndim]
        subm_low = {2: spconv.SubMConv1d, 3: spconv.SubMConv2d}[ndim]
        self.first = spconv.SparseSequential(conv[0](2, channels, 3, bias=False, indice_key="subm"), _bn(channels),
                                             torch.nn.ReLU())
        self.down1 = spconv.SparseSequential(conv[1](channels, channels, 3, 2, 1, bias=False), _bn(channels),
                                             torch.nn.ReLU())
        self.down2 = spconv.SparseSequential(conv[1](channels, channels, 3, 2, 1, bias=True), _bn(channels),
                                             torch.nn.ReLU())
        self.out = spconv.SparseSequential(low(channels, channels, 3, 1, 1, bias=False), _bn(channels),
                                           torch.nn.ReLU())
        # the submanifold pooling of VoxelNeXt's max-pool head (spconv's SparseMaxPoolNd take no `subm`)
        self.pool = spconv.pool.SparseMaxPool(ndim - 1, 3, 1, 1, subm=True) if submanifold_pool else \
            spconv.pool.SparseMaxPool(ndim - 1, 2, 2, 0)
        self.head = subm_low(channels, 3, 1, bias=True)

    def forward(self, x):
        x1 = self.down1(self.first(x))
        x2 = self.down2(x1)
        x2.indices[:, 1:] *= 2
        x1 = x1.replace_feature(torch.cat([x1.features, x2.features]))
        x1.indices = torch.cat([x1.indices, x2.indices])
        keep = [0, *range(2, x1.indices.shape[1])]
        unique, inverse = torch.unique(x1.indices[:, keep], dim=0, return_inverse=True)
        merged = x1.features.new_zeros((unique.shape[0], x1.features.shape[1]))
        merged.index_add_(0, inverse, x1.features)
        bev = spconv.SparseConvTensor(merged, unique, x1.spatial_shape[1:], x1.batch_size)
        bev = self.out(bev)
        return self.head(bev), self.pool(bev)


def _sorted(tensor):
    """(features, coords int64) of an spconv tensor in the lexicographic row order of the source ops."""
    coords = tensor.indices.numpy().astype(np.int64)
    order = np.lexsort(coords.T[::-1])
    return tensor.features.numpy()[order], coords[order]


def _frame(rng, ndim, batch, rows):
    shape = {2: (10, 12), 3: (7, 10, 12)}[ndim]
    features, coords = random_sparse(rng, batch, 2, shape, count=rows)
    return shape, features, coords


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("submanifold_pool", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_merging_network_exports_and_matches_spconv_on_every_target(ndim, submanifold_pool, batch):
    torch.manual_seed(ndim * 10 + batch)
    net = MergingNet(ndim, submanifold_pool=submanifold_pool).eval()
    rng = np.random.default_rng(batch)
    shape, features, coords = _frame(rng, ndim, batch, 60 * batch)
    example = spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)),
                                      list(shape), batch)
    model = sparse_lower.export(net, example)
    ops = [n.op_type for n in model.graph.node]
    assert {"Coalesce", "SparseMaxPool", "Mul", "Gather"} <= set(ops)
    with spconv_inference(net):
        head, pooled = net(spconv.SparseConvTensor(torch.from_numpy(features),
                                                   torch.from_numpy(coords.astype(np.int32)), list(shape), batch))
    expected = [_sorted(head), _sorted(pooled)]
    feeds = {"features": features, "coords": coords}
    for target, options in [*TARGETS, ("nna", {"max_active": 400, "max_members": 8, "combine": "unfold"})]:
        outputs = run_lowered(model, feeds, target=target, **options)
        for index, (want, want_coords) in enumerate(expected):
            np.testing.assert_array_equal(outputs[f"output{index}_coords"], want_coords, err_msg=f"{target} {options}")
            np.testing.assert_allclose(outputs[f"output{index}_features"], want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{target} {options}")


def test_the_exported_network_takes_an_empty_frame():
    torch.manual_seed(0)
    net = MergingNet(3).eval()
    shape, features, coords = _frame(np.random.default_rng(0), 3, 1, 50)
    model = sparse_lower.export(net, spconv.SparseConvTensor(torch.from_numpy(features),
                                                             torch.from_numpy(coords.astype(np.int32)), list(shape), 1))
    empty = {"features": np.zeros((0, 2), np.float32), "coords": np.zeros((0, 4), np.int64)}
    for target, options in TARGETS:
        outputs = run_lowered(model, empty, target=target, **options)
        assert all(len(value) == 0 for value in outputs.values()), target


class _Body(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.conv = spconv.SubMConv3d(2, 4, 3, bias=False)
        self.body = body

    def forward(self, x):
        y = self.conv(x)
        return self.body(y), y


def _counts(y):
    unique, inverse, counts = torch.unique(y.indices[:, [0, 2, 3]], dim=0, return_inverse=True, return_counts=True)
    return unique, inverse, counts


@pytest.mark.parametrize("body", [
    lambda y: y.features[:3], lambda y: y.indices[:, [1, 2]], lambda y: y.indices[:, 0] * 7 + y.indices[:, 3],
    _counts, lambda y: y.indices * 2 - 1,
])
def test_coordinate_arithmetic_exports_as_torch_writes_it(body):
    """What the tracer of earlier versions refused (columns taken alone, unique with counts, arithmetic on
    indices) is torch.onnx's now: the export's check runs it against the module."""
    net = _Body(body).eval()
    shape, features, coords = _frame(np.random.default_rng(0), 3, 1, 20)
    example = spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)),
                                      list(shape), 1)
    model = sparse_lower.export(net, example)
    with spconv_inference(net):
        want, _ = net(example)
    want = want if isinstance(want, tuple) else (want,)
    got = run_lowered(model, {"features": features, "coords": coords}, target="portable")
    for index, value in enumerate(want):
        np.testing.assert_allclose(got[f"output{index}"], value.numpy(), rtol=1e-5, atol=1e-6)


def test_average_pooling_is_refused_naming_the_module_and_the_line():
    net = _Body(spconv.SparseAvgPool3d(2)).eval()
    shape, features, coords = _frame(np.random.default_rng(0), 3, 1, 20)
    example = spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)),
                                      list(shape), 1)
    with pytest.raises(SparseLowerError, match=r"node 'body': SparseAvgPool3d cannot be exported yet \(called at "
                                               r".*test_export_merges.py:\d+\)"):
        sparse_lower.export(net, example)


class FrameGrid(torch.nn.Module):
    """mmdetection3d's MinkUNet pattern at small scale: the grid computed from the frame
    (`coors.max(0)[0][1:] + 1`), strided convs of kernel 2 whose extent, floor(S / 2), drops a frame's
    last plane where S is odd, an inverse conv back, and the features returned alone."""

    def __init__(self):
        super().__init__()
        self.stem = spconv.SubMConv3d(2, 6, 3, indice_key="s0")
        self.down = spconv.SparseConv3d(6, 6, 2, 2, indice_key="d1")
        self.down2 = spconv.SparseConv3d(6, 6, (3, 2, 2), (2, 2, 2), padding=(1, 0, 0), indice_key="d2")
        self.up2 = spconv.SparseInverseConv3d(6, 6, (3, 2, 2), indice_key="d2")
        self.up = spconv.SparseInverseConv3d(6, 4, 2, indice_key="d1")

    def forward(self, features, coors):
        grid = coors.max(0)[0][1:] + 1
        x = spconv.SparseConvTensor(features, coors, grid, int(coors[-1, 0]) + 1)
        x = self.stem(x)
        y = self.up2(self.down2(self.down(x)))
        return self.up(y.replace_feature(y.features + 1)).features


def _frame_grid_frame(seed, extent):
    rng = np.random.default_rng(seed)
    _, features, coords = _frame(rng, 3, 1, 80)
    coords[:, 1:] = coords[:, 1:] % np.array(extent)
    coords = np.unique(coords, axis=0)
    coords[-1, 1:] = np.array(extent) - 1  # the largest site, so that the grid is `extent`
    coords = np.unique(coords, axis=0)
    return rng.standard_normal((len(coords), 2)).astype(np.float32), coords.astype(np.int64)


def test_a_grid_computed_from_the_frame_follows_each_frame_on_every_target():
    torch.manual_seed(3)
    net = FrameGrid().eval()
    features, coords = _frame_grid_frame(0, (7, 10, 12))
    model = sparse_lower.export(net, (torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32))),
                                max_spatial_shape=[9, 13, 12])
    grids = [list(next(a.ints for a in n.attribute if a.name == "spatial_shape")) for n in model.graph.node
             if n.domain == "sparse"]
    assert grids[:3] == [[9, 13, 12], [9, 13, 12], [4, 6, 6]]  # written on the bound, scaled by each layer
    for seed, extent in [(1, (7, 10, 12)), (2, (5, 13, 9)), (3, (9, 8, 11)), (4, (6, 6, 6))]:
        features, coords = _frame_grid_frame(seed, extent)
        with spconv_inference(net):
            want = net(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32))).numpy()
        for target, options in [*TARGETS, ("nna", {"max_active": 200})]:
            got = run_lowered(model, {"features": features, "coords": coords}, target=target, **options)["output"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{target} {options} {extent}")


def test_the_default_bound_is_what_the_coordinates_hold_not_the_example():
    """Without max_spatial_shape, a grid computed from the frame is bounded by 2^16 per axis (default_bound),
    not by the example's: a frame larger than the example runs, on gpu and in the portable form's frame-sized
    grids, and one past the bound is refused naming the bound and the option that raises it."""
    torch.manual_seed(3)
    net = FrameGrid().eval()
    features, coords = _frame_grid_frame(0, (7, 10, 12))
    model = sparse_lower.export(net, (torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32))))
    grids = [list(next(a.ints for a in n.attribute if a.name == "spatial_shape")) for n in model.graph.node
             if n.domain == "sparse"]
    assert grids[0] == [65536] * 3
    for extent in [(7, 10, 13), (20, 300, 6000)]:
        features, coords = _frame_grid_frame(1, extent)
        with spconv_inference(net):
            want = net(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32))).numpy()
        for target in ("gpu", "portable"):
            got = run_lowered(model, {"features": features, "coords": coords}, target=target)["output"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{target} {extent}")
    features, coords = _frame_grid_frame(1, (7, 10, 70000))
    session = sparse_lower.create_session(sparse_lower.lower(model, target="gpu"))
    with pytest.raises(Exception) as refused:
        session.run(None, {"features": features, "coords": coords})
    said = str(sparse_lower.runtime.runtime_refusal(refused.value))
    assert re.search(r"outside the grid \[65536, 65536, 65536\].*export it again with a larger max_spatial_shape",
                     said), said
    portable = run_lowered(model, {"features": features, "coords": coords}, target="portable")["output"]
    assert np.isnan(portable).all()
