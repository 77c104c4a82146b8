"""sparse_lower.export of arithmetic within the rows of sparse features (UNetV2's channel reduction,
channel slices, reductions) and of dense tails (what a detector computes with torch after `.dense()`: a
BEV neck and heads, written by torch.onnx into the same file): the exported model, lowered for every
target, against spconv and torch themselves on random frames (2-D and 3-D, batches, an empty frame), and
the refusals of what would mix rows."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason='needs torch and spconv: pip install ".[spconv]"')
spconv = pytest.importorskip("spconv.pytorch", reason='needs torch and spconv: pip install ".[spconv]"')

import sparse_lower  # noqa: E402
from helpers import run_lowered  # noqa: E402
from oracle import random_sparse  # noqa: E402
from sparse_lower.errors import SparseLowerError  # noqa: E402
from sparse_lower.exporter.spconv_calls import spconv_inference  # noqa: E402
from sparse_lower.exporter.traced_calls import untraced  # noqa: E402

from torch import nn  # noqa: E402

TARGETS = [("gpu", {}), ("nna", {}), ("hybrid", {}), ("portable", {}), ("nna", {"max_active": 400})]
SHAPES = {2: (16, 12), 3: (6, 16, 12)}


def _norms(module):
    """Batch-norm statistics and affine terms drawn, so that folding them is tested."""
    for m in module.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return module


def _example(ndim, batch, rows, channels=4, seed=0):
    features, coords = random_sparse(np.random.default_rng(seed), batch, channels, SHAPES[ndim], count=rows)
    tensor = spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)),
                                     list(SHAPES[ndim]), batch)
    return tensor, {"features": features, "coords": coords}


def _by_site(features, coords):
    """Rows in the lexicographic order of their coords: how two runs' sparse outputs are compared."""
    return features[np.lexsort(np.asarray(coords, np.int64).T[::-1])]


class ChannelNet(nn.Module):
    """A conv, then UNetV2's channel reduction (features.view(n, groups, -1).sum(dim=2)) and other
    arithmetic within rows, concatenated and convolved again."""

    def __init__(self, ndim):
        super().__init__()
        subm = {2: spconv.SubMConv2d, 3: spconv.SubMConv3d}[ndim]
        self.first = spconv.SparseSequential(subm(4, 16, 3, bias=False, indice_key="a"), nn.BatchNorm1d(16), nn.ReLU())
        self.last = subm(26, 8, 3, bias=True, indice_key="a")

    def forward(self, x):
        x = self.first(x)
        f = x.features
        n = f.shape[0]
        pieces = [f.view(n, 4, -1).sum(dim=2),  # UNetV2.channel_reduction
                  f.reshape(n, 2, 8).amax(dim=2), f.view(n, 8, 2).max(dim=2)[0],
                  f.view(n, 4, 4).permute(0, 2, 1).flatten(1).mean(dim=1, keepdim=True),
                  f[:, 3:9], f[:, ::5], f[:, 5].unsqueeze(1)]
        low, high = torch.split(torch.cat(pieces, dim=1), [10, 16], dim=1)
        return self.last(x.replace_feature(torch.cat([high, low], dim=1)))


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("batch", [1, 2])
def test_arithmetic_within_rows_exports_and_matches_spconv_on_every_target(ndim, batch):
    torch.manual_seed(ndim + batch)
    net = _norms(ChannelNet(ndim)).eval()
    example, feeds = _example(ndim, batch, 60 * batch, seed=batch)
    model = sparse_lower.export(net, example)
    assert {"Reshape", "ReduceSum", "ReduceMax", "ReduceMean", "Slice", "Transpose"} <= {n.op_type for n in
                                                                                         model.graph.node}
    with spconv_inference(net):
        out = net(_example(ndim, batch, 60 * batch, seed=batch)[0])
    want = _by_site(out.features.numpy(), out.indices.numpy())
    for target, options in TARGETS:
        got = run_lowered(model, feeds, target=target, **options)
        np.testing.assert_allclose(_by_site(got["out_features"], got["out_coords"]), want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{target} {options}")


class _Rows(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.conv = spconv.SubMConv3d(4, 8, 3, bias=False)
        self.body = body

    def forward(self, x):
        return self.body(self.conv(x).features)


@pytest.mark.parametrize("body", [
    lambda f: f.view(-1), lambda f: f.reshape(40, 4), lambda f: f.sum(dim=0), lambda f: f.mean(),
    lambda f: f[:3], lambda f: f[:, [0, 2]], lambda f: torch.split(f, 10, dim=0)[1],
    lambda f: f.view(20, 2, 4).permute(1, 0, 2), lambda f: f.max(dim=0)[0] - f.amin(dim=0),
])
def test_what_mixes_rows_exports_as_torch_writes_it(body):
    """Reductions and reshapes across rows are torch.onnx's: a submanifold conv keeps its input's rows, so
    even a row taken by position is the module's."""
    example, feeds = _example(3, 1, 20)
    net = _Rows(body).eval()
    model = sparse_lower.export(net, example)
    with spconv_inference(net):
        want = net(_example(3, 1, 20)[0]).numpy()
    for target in ("gpu", "portable"):
        np.testing.assert_allclose(run_lowered(model, feeds, target=target)["output"], want, rtol=1e-4, atol=1e-5)


class _AfterStride(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = spconv.SparseConv3d(4, 8, 3, 2, 1)

    def forward(self, x):
        return self.conv(x).features[:5]


def test_rows_read_by_position_after_a_strided_conv_are_caught_by_the_check():
    """A strided layer's rows come sorted from the source ops and in spconv's own order from spconv: the
    export's check against the module catches a module that reads them by position."""
    example, _ = _example(3, 1, 40)
    with pytest.raises(SparseLowerError, match="output 'output' differs from the module's on the example") as caught:
        sparse_lower.export(_AfterStride().eval(), example)
    assert "read rows by their coordinates" in caught.value.fix
    assert sparse_lower.export(_AfterStride().eval(), example, check=False).graph.node


class Detector(nn.Module):
    """A CenterPoint-style detector at small scale: a sparse backbone, `.dense()` (3-D: its depth folded
    into the channels, as OpenPCDet's HeightCompression does), then a dense BEV neck of two scales
    (strided Conv2d, ConvTranspose2d back, concatenation, upsampling) and heads (a heatmap through a
    sigmoid, a box regression); it returns the sparse features too, and the BEV map before the neck."""

    def __init__(self, ndim):
        super().__init__()
        subm = {2: spconv.SubMConv2d, 3: spconv.SubMConv3d}[ndim]
        down = {2: spconv.SparseConv2d, 3: spconv.SparseConv3d}[ndim]
        self.ndim = ndim
        self.backbone = spconv.SparseSequential(subm(4, 8, 3, bias=False, indice_key="a"), nn.BatchNorm1d(8), nn.ReLU(),
                                                down(8, 8, 3, 2, 1, bias=False), nn.BatchNorm1d(8), nn.ReLU())
        bev = 8 * (3 if ndim == 3 else 1)
        block = lambda cin, cout, stride: nn.Sequential(  # noqa: E731
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.level1, self.level2 = block(bev, 16, 1), block(16, 16, 2)
        self.up = nn.Sequential(nn.ConvTranspose2d(16, 16, 2, 2, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.heatmap = nn.Sequential(block(32, 16, 1), nn.Conv2d(16, 3, 1), nn.Sigmoid())
        self.boxes = nn.Sequential(nn.Conv2d(32, 8, 3, 1, 1), nn.Upsample(scale_factor=2, mode="nearest"))

    def forward(self, x):
        sparse = self.backbone(x)
        bev = sparse.dense()
        if self.ndim == 3:
            n, c, d, h, w = bev.shape
            bev = bev.view(n, c * d, h, w)
        return {"sparse": sparse, "bev": bev, **self.heads(bev)}

    def heads(self, bev):
        first = self.level1(bev)
        neck = torch.cat([first, self.up(self.level2(first))], dim=1)
        return {"heatmap": self.heatmap(neck), "boxes": self.boxes(neck)}


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_detector_with_a_dense_neck_and_heads_exports_as_one_file_and_matches_torch(ndim, batch):
    torch.manual_seed(ndim * 3 + batch)
    net = _norms(Detector(ndim)).eval()
    example, feeds = _example(ndim, batch, 50 * batch, seed=batch)
    model = sparse_lower.export(net, example)
    ops = {n.op_type for n in model.graph.node}
    assert {"ToDense", "Conv", "ConvTranspose", "Concat", "Sigmoid", "Resize"} <= ops
    assert [o.name for o in model.graph.output] == ["output0_features", "output0_coords", "output1", "output2",
                                                    "output3"]
    with spconv_inference(net):
        want = net(_example(ndim, batch, 50 * batch, seed=batch)[0])
    expected = {"output1": want["bev"].numpy(), "output2": want["heatmap"].numpy(), "output3": want["boxes"].numpy()}
    sparse = _by_site(want["sparse"].features.numpy(), want["sparse"].indices.numpy())
    for target, options in TARGETS:
        got = run_lowered(model, feeds, target=target, **options)
        np.testing.assert_allclose(_by_site(got["output0_features"], got["output0_coords"]), sparse, rtol=1e-4,
                                   atol=1e-4, err_msg=f"{target} {options}")
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4, err_msg=f"{target} {options} {name}")


def test_the_detectors_file_takes_an_empty_frame():
    torch.manual_seed(0)
    net = _norms(Detector(3)).eval()
    model = sparse_lower.export(net, _example(3, 1, 40)[0])
    empty = {"features": np.zeros((0, 4), np.float32), "coords": np.zeros((0, 4), np.int64)}
    with torch.no_grad():  # spconv takes no empty frame: the heads of an empty BEV map
        want = net.heads(torch.zeros(1, 24, *(s // 2 for s in SHAPES[3][1:])))
    for target, options in TARGETS[:4]:
        got = run_lowered(model, empty, target=target, **options)
        assert got["output0_features"].shape == (0, 8) and not got["output1"].any()
        np.testing.assert_allclose(got["output2"], want["heatmap"].numpy(), rtol=1e-5, atol=1e-6, err_msg=target)
        np.testing.assert_allclose(got["output3"], want["boxes"].numpy(), rtol=1e-5, atol=1e-6, err_msg=target)


class TwoScales(nn.Module):
    """A tail that reads two `.dense()` results: the coarse level upsampled to the fine one's grid, the two
    concatenated and convolved (a multi-scale BEV neck)."""

    def __init__(self):
        super().__init__()
        self.fine = spconv.SubMConv2d(4, 8, 3, bias=False, indice_key="a")
        self.coarse = spconv.SparseConv2d(8, 8, 3, 2, 1, bias=True)
        self.up = nn.ConvTranspose2d(8, 8, 2, 2)
        self.out = nn.Sequential(nn.Conv2d(16, 4, 3, 1, 1), nn.ReLU())

    def forward(self, x):
        fine = self.fine(x)
        coarse = self.coarse(fine)
        return self.out(torch.cat([fine.dense(), self.up(coarse.dense())], dim=1))


def test_a_tail_reading_two_dense_results_exports_and_matches_torch():
    torch.manual_seed(5)
    net = TwoScales().eval()
    example, feeds = _example(2, 2, 90)
    model = sparse_lower.export(net, example)
    assert sum(n.op_type == "ToDense" for n in model.graph.node) == 2
    with spconv_inference(net):
        want = net(_example(2, 2, 90)[0]).numpy()
    for target, options in TARGETS:
        got = run_lowered(model, feeds, target=target, **options)["output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{target} {options}")


class Frozen(nn.Module):
    """Values computed from the frame outside the trace, feeding the output: what SPVCNN's point branch does
    through TorchSparse's C++ functions (NumPy stands in here), which the trace fixes at the example's values."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = spconv.SubMConv2d(4, 4, 3, indice_key="a")

    def forward(self, features, coords):
        if self.how == "extension":  # as a C++ extension computes it: where the trace does not see it
            with untraced():
                return torch.bincount(coords[:, 0].long()).float() * features.sum()
        if self.how == "numpy":  # every output from NumPy's view of the inputs: the model keeps no input
            counts = np.bincount(coords[:, 0].numpy()).astype(np.float32)
            return torch.from_numpy(counts) * torch.from_numpy(features.numpy().sum(0)[:1])
        x = self.conv(spconv.SparseConvTensor(features, coords, list(SHAPES[2]), 2))
        if self.how == "tolist":  # the features through a Python list, added to the conv's (which reads them)
            return x.replace_feature(torch.tensor(features.tolist()) + x.features)
        return x.replace_feature(x.features * (int(coords[:, 0].max()) + 1))  # the batch count fixed


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("how, said", [
    ("numpy", r"copies a tensor's data out of torch while it is traced \(\S+test_export_tails.py:\d+"),
    ("tolist", r"copies a tensor's data out of torch while it is traced \(\S+test_export_tails.py:\d+\)"),
    ("extension", r"does not read its inputs 'features', 'coords': its outputs are constants: .* \(by code torch "
                  r"does not see: a C\+\+ extension")])
def test_a_value_computed_from_the_frame_outside_the_trace_is_refused_whatever_check_says(how, said, check):
    _, feeds = _example(2, 2, 60)
    with pytest.raises(SparseLowerError, match=said):
        sparse_lower.export(Frozen(how), (torch.from_numpy(feeds["features"]),
                                          torch.from_numpy(feeds["coords"].astype(np.int32))), check=check)


def test_a_number_fixed_while_every_input_is_read_stays_a_warning():
    """The batch count read as a Python number (mmdetection3d's `int(coors[-1, 0]) + 1`): its inputs are still
    read, so the value is said (a SparseLowerWarning with its line), not refused."""
    _, feeds = _example(2, 2, 60)
    with pytest.warns(sparse_lower.errors.SparseLowerWarning, match=r"test_export_tails.py:\d+: Converting"):
        model = sparse_lower.export(Frozen("count"), (torch.from_numpy(feeds["features"]),
                                                      torch.from_numpy(feeds["coords"].astype(np.int32))))
    assert {value.name for value in model.graph.input} == {"features", "coords"}
