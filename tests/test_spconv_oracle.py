"""spconv 2.3.8 itself as the oracle (docs/formats.md): what the canonical forms, the importers and
`sparse_lower.export` produce must compute what spconv computes.

(a) single layers of every kind, spconv (through SpconvEmitter) against a source-op model written
    here from docs/source_ops.md and docs/formats.md alone, lowered for gpu and nna;
(b) the reference networks on the real nuScenes frames: spconv against the canonical model (lowered
    for gpu and nna), the imported NVIDIA / AIMET files (gpu) and the export of the spconv network;
(c) `sparse_lower.export` of spconv module trees against spconv.

spconv's sparse outputs come in its own row order, so sparse results are compared after sorting both
by coordinate; dense results compare directly. Errors are relative to the largest output magnitude.
Skipped where torch and spconv are not installed (`pip install ".[spconv]"`).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("torch", reason='needs torch and spconv: pip install ".[spconv]"')
pytest.importorskip("spconv.pytorch", reason='needs torch and spconv: pip install ".[spconv]"')

import spconv.pytorch as spconv  # noqa: E402
import torch  # noqa: E402
from spconv.pytorch.conv import SparseConvolution  # noqa: E402
from torch import nn  # noqa: E402

import sparse_lower  # noqa: E402
from sparse_lower.errors import SparseLowerError  # noqa: E402
from sparse_lower.frames.sample import load_voxels  # noqa: E402
from sparse_lower.exporter.spconv_calls import spconv_inference  # noqa: E402
from sparse_lower import export  # noqa: E402
from sparse_lower.models.emitter import per_dim  # noqa: E402

from conftest import DATA  # noqa: E402
from oracle import random_sparse  # noqa: E402
from sparse_lower.models.spconv_emitter import SpconvEmitter  # noqa: E402
from sparse_lower.onnx_conventions import SOURCE_DOMAIN  # noqa: E402

# spconv's own .dense() indexes with a list (torch deprecation warning, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")

TARGETS = {"gpu": {}, "nna": {"combine": "gather", "max_active": None}}


def run_lowered(model: onnx.ModelProto, feeds: dict, target: str) -> list:
    """Lower for `target` and run on one onnxruntime thread (the suite runs on 2 cores, `pytest -n 2`)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = sparse_lower.create_session(sparse_lower.lower(model, target=target, **TARGETS[target]),
                                          sess_options=options)
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: feeds[name] for name in names})


def sorted_rows(features: np.ndarray, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort(coords.T[::-1])
    return features[order], coords[order]


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    assert actual.shape == expected.shape
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12))


def sparse_error(actual: tuple, expected: tuple) -> float:
    """The relative error of sparse (features, coords), after checking both hold the same coords."""
    (fa, ca), (fe, ce) = sorted_rows(*actual), sorted_rows(*expected)
    np.testing.assert_array_equal(ca, ce)
    return relative_error(fa, fe)


# ---------------------------------------------------------------------------------------------------
# (a) single layers


def _conv_node(nodes, initializers, kind, features, coords, weight, bias, spatial_shape, geometry, name,
               target_coords=None, forward_shape=None):
    """One spconv layer as its source-op node, written from docs/source_ops.md and docs/formats.md (not from the
    emitters or the exporter, which this file tests)."""
    ndim = len(spatial_shape)
    kernel = list(weight.shape[1:-1])
    stride, padding, dilation, output_padding = (list(per_dim(geometry.get(key, default), ndim)) for key, default in
                                                 (("stride", 1), ("padding", 0), ("dilation", 1),
                                                  ("output_padding", 0)))
    if kind in ("deconv", "inverse"):
        W = np.moveaxis(weight, -1, 0)  # [Cout, *K, Cin] -> [Cin, Cout, *K]
    else:
        W = np.moveaxis(weight, -1, 1)  # -> [Cout, Cin, *K]
    attrs = {"kernel_shape": kernel, "spatial_shape": list(spatial_shape)}
    if kind == "subm":
        op_type = "SubmanifoldConv"
        attrs["dilations"] = dilation
    elif kind == "conv":
        op_type = "SparseConv"
        attrs.update(strides=stride, pads=padding * 2, dilations=dilation)
    elif kind == "deconv":
        op_type = "SparseDeconv"
        attrs.update(strides=stride, pads=padding * 2, output_padding=output_padding)
    else:  # inverse: the forward conv's geometry, and the output padding giving back its input extent
        op_type = "SparseDeconv"
        attrs.update(strides=stride, pads=padding * 2, dilations=dilation,
                     output_padding=[(S + 2 * p - d * (k - 1) - 1) % s for S, k, s, p, d in
                                     zip(forward_shape, kernel, stride, padding, dilation)])
    initializers += [numpy_helper.from_array(np.ascontiguousarray(W, np.float32), f"{name}.W"),
                     numpy_helper.from_array(bias, f"{name}.B")]
    inputs = [features, coords, f"{name}.W", f"{name}.B"] + ([target_coords] if target_coords else [])
    outputs = [f"{name}.features", f"{name}.coords"]
    nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=SOURCE_DOMAIN, **attrs))
    return outputs


def _model(nodes, initializers, cin, cout, ndim, outputs):
    graph = helper.make_graph(
        nodes, "layer",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", cin]),
         helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 1 + ndim])],
        [helper.make_tensor_value_info(outputs[0], TensorProto.FLOAT, [None, cout]),
         helper.make_tensor_value_info(outputs[1], TensorProto.INT64, [None, 1 + ndim])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(SOURCE_DOMAIN, 1)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


LAYERS = {
    "subm_dilated": ("subm", (3, 3, 3), dict(dilation=2)),
    "subm_anisotropic_padding_ignored": ("subm", (1, 3, 5), dict(padding=(2, 0, 1), dilation=(1, 2, 1))),
    "subm_1x1": ("subm", (1, 1, 1), {}),
    "conv_padded_strided": ("conv", (3, 3, 3), dict(stride=2, padding=1)),
    "conv_mixed": ("conv", (2, 3, 3), dict(stride=(1, 2, 3), padding=(0, 1, 2), dilation=(1, 1, 2))),
    "conv_2d": ("conv", (3, 3), dict(stride=2, padding=(1, 0))),
    "deconv": ("deconv", (3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    "deconv_k2s2": ("deconv", (2, 2, 2), dict(stride=2)),
    "deconv_2d": ("deconv", (3, 2), dict(stride=(2, 1), padding=(0, 1))),
    "inverse": ("inverse", (3, 3, 3), dict(stride=2, padding=1)),
    "inverse_mixed": ("inverse", (3, 2, 3), dict(stride=(2, 2, 3), padding=(1, 0, 0), dilation=(1, 1, 2))),
    "inverse_2d": ("inverse", (3, 3), dict(stride=2)),
}


@functools.lru_cache(maxsize=None)
def layer_case(layer: str):
    """(canonical model, spconv network, feeds) for one entry of LAYERS."""
    kind, kernel, geometry = LAYERS[layer]
    rng = np.random.default_rng(sorted(LAYERS).index(layer))
    spatial_shape = (9, 10, 13)[:len(kernel)]
    cin, cout = 4, 6
    features, coords = random_sparse(rng, 2, cin, spatial_shape, density=0.25)
    weight = (rng.standard_normal((cout, *kernel, cin)) / np.sqrt(cin * np.prod(kernel))).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    emitter = SpconvEmitter()
    x = emitter.input(cin, spatial_shape, 2)
    nodes, initializers = [], []
    if kind == "inverse":
        # the forward conv (cin -> cin) that the inverse conv undoes
        forward = (rng.standard_normal((cin, *kernel, cin)) / np.sqrt(cin * np.prod(kernel))).astype(np.float32)
        forward_bias = rng.standard_normal(cin).astype(np.float32)
        y = emitter.conv(x, "conv", forward, forward_bias, indice_key="down", **geometry)
        out = emitter.conv(y, "inverse", weight, bias, indice_key="down")
        down = _conv_node(nodes, initializers, "conv", "features", "coords", forward, forward_bias, spatial_shape,
                          geometry, "down")
        outputs = _conv_node(nodes, initializers, "inverse", *down, weight, bias, y.spatial_shape, geometry, "up",
                             target_coords="coords", forward_shape=spatial_shape)
    else:
        out = emitter.conv(x, kind, weight, bias, **geometry)
        outputs = _conv_node(nodes, initializers, kind, "features", "coords", weight, bias, spatial_shape, geometry,
                             "layer")
    model = _model(nodes, initializers, cin, cout, len(kernel), outputs)
    return model, emitter.finish([out]), {"features": features, "coords": coords}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_single_layer_matches_spconv(layer, target):
    model, network, feeds = layer_case(layer)
    (expected,) = network(feeds["features"], feeds["coords"])
    features, coords = run_lowered(model, feeds, target)
    assert len(expected[1]) > 0
    assert sparse_error((features, coords), expected) < 1e-5


# ---------------------------------------------------------------------------------------------------
# (b) the reference networks on the real frames

FRAMES = {"centerpoint": "nuscenes_centerpoint_voxels.npz", "bevfusion": "nuscenes_bevfusion_voxels.npz"}
NETWORKS = ("sp_middle_resnet_fhd", "sparse_unet")
# form -> (how the model is made, target); NVIDIA's float16 initializers are compared with spconv
# holding the same float16-rounded weights
FORMS = {
    "canonical-gpu": ("canonical", "gpu"),
    "canonical-nna": ("canonical", "nna"),
    "nvidia-import-gpu": ("nvidia", "gpu"),
    "nvidia-import-nna": ("nvidia", "nna"),
    "aimet-import-gpu": ("aimet", "gpu"),
    "aimet-import-nna": ("aimet", "nna"),
}
TOLERANCE = 1e-3


@functools.lru_cache(maxsize=None)
def frame(name: str):
    path = DATA / FRAMES[name]
    if not path.is_file():
        pytest.skip(f"no {path}")
    return load_voxels(path)


@functools.lru_cache(maxsize=2)
def spconv_network(network: str, frame_name: str, weight_dtype=np.float32):
    """(network built with SpconvEmitter, its outputs on the frame)."""
    import sparse_lower.models as models

    features, coords, spatial_shape = frame(frame_name)
    built = getattr(models, network)(SpconvEmitter(weight_dtype), np.random.default_rng(0),
                                     spatial_shape=spatial_shape)
    return built, built(features, coords)


def network_model(network: str, frame_name: str, source: str) -> onnx.ModelProto:
    import sparse_lower.models as models
    from sparse_lower.importers import import_model

    features, coords, spatial_shape = frame(frame_name)
    emitter = {"canonical": models.CanonicalEmitter, "nvidia": models.NvidiaEmitter,
               "aimet": models.AimetEmitter}[source]()
    model = getattr(models, network)(emitter, np.random.default_rng(0), spatial_shape=spatial_shape)
    return model if source == "canonical" else import_model(model)


def run_network(model: onnx.ModelProto, features, coords, target: str) -> list:
    """Feed by type (imported models keep the source's input names), outputs in graph order."""
    feeds = {i.name: features if i.type.tensor_type.elem_type == TensorProto.FLOAT else coords
             for i in model.graph.input}
    return run_lowered(model, feeds, target)


def output_error(outputs: list, expected: list) -> float:
    """The largest relative error over the outputs (a sparse one is a (features, coords) pair)."""
    errors, pending = [], list(outputs)
    for value in expected:
        if isinstance(value, tuple):
            errors.append(sparse_error((pending.pop(0), pending.pop(0)), value))
        else:
            errors.append(relative_error(pending.pop(0), value))
    assert not pending
    return max(errors)


# AIMET's export has no inverse conv, so no UNet
@pytest.mark.parametrize("network, form", [(n, f) for n in NETWORKS for f in FORMS
                                           if not (n == "sparse_unet" and f.startswith("aimet"))])
@pytest.mark.parametrize("frame_name", list(FRAMES))
def test_network_on_real_frame_matches_spconv(frame_name, network, form):
    source, target = FORMS[form]
    features, coords, _ = frame(frame_name)
    _, expected = spconv_network(network, frame_name, np.float16 if source == "nvidia" else np.float32)
    outputs = run_network(network_model(network, frame_name, source), features, coords, target)
    assert output_error(outputs, expected) < TOLERANCE


@pytest.mark.parametrize("network", NETWORKS)
def test_export_of_the_spconv_network_matches_spconv(network):
    """The SpconvEmitter network is an ordinary spconv module tree: export it (on the smaller frame)."""
    features, coords, _ = frame("bevfusion")
    built, expected = spconv_network(network, "bevfusion")
    model = export(built.module, built.sparse_tensor(features, coords))
    assert output_error(run_network(model, features, coords, "gpu"), expected) < TOLERANCE


# ---------------------------------------------------------------------------------------------------
# (c) sparse_lower.export of spconv module trees


def randomize_batch_norms(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Trained-looking BatchNorm statistics, so that a wrong fold shows."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm1d):
            c = m.num_features
            m.running_mean.copy_(torch.rand(c, generator=generator) - 0.5)
            m.running_var.copy_(torch.rand(c, generator=generator) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=generator) + 0.5)
            m.bias.data.copy_(torch.rand(c, generator=generator) - 0.5)
    return module


def sparse_tensor(features, coords, spatial_shape, batch_size):
    return spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)),
                                   list(spatial_shape), batch_size)


def spconv_outputs(module, x) -> list:
    """The module's outputs as NumPy, sparse ones as (features, coords int64)."""
    with spconv_inference(module):
        result = module(x)
    result = result if isinstance(result, (tuple, list)) else [result]
    return [(r.features.numpy(), r.indices.numpy().astype(np.int64)) if isinstance(r, spconv.SparseConvTensor)
            else r.numpy() for r in result]


def assert_export_matches(module, x, tolerance=1e-4) -> onnx.ModelProto:
    """Export `module` on `x`, run the export through the NumPy reference and the gpu lowering, and
    compare both with spconv."""
    model = export(module, x)
    expected = spconv_outputs(module, x)
    feeds = {"features": x.features.numpy(), "coords": x.indices.numpy().astype(np.int64)}
    reference = list(sparse_lower.reference.run(model, feeds).values())
    for outputs in (reference, run_lowered(model, feeds, "gpu")):
        pending = list(outputs)
        for value in expected:
            if isinstance(value, tuple):
                actual = (pending.pop(0), pending.pop(0))
                assert sparse_error(actual, value) < tolerance
            else:
                assert relative_error(pending.pop(0), value) < tolerance
    return model


class BasicBlock(spconv.SparseModule):
    """det3d's SparseBasicBlock: the residual add written on the features with replace_feature."""

    def __init__(self, channels: int, key: str):
        super().__init__()
        self.conv1 = spconv.SubMConv3d(channels, channels, 3, padding=1, bias=False, indice_key=key)
        self.bn1 = nn.BatchNorm1d(channels, eps=1e-3)
        self.relu = nn.ReLU()
        self.conv2 = spconv.SubMConv3d(channels, channels, 3, padding=1, bias=False, indice_key=key)
        self.bn2 = nn.BatchNorm1d(channels, eps=1e-3)

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = out.replace_feature(self.relu(self.bn1(out.features)))
        out = self.conv2(out)
        out = out.replace_feature(self.bn2(out.features))
        out = out.replace_feature(out.features + identity.features)
        return out.replace_feature(self.relu(out.features))


class AddBlock(spconv.SparseModule):
    """A residual through SparseConvTensor.__add__, and one through the conv's fused add_input."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = spconv.SubMConv3d(channels, channels, 3, indice_key="add")
        self.conv2 = spconv.SubMConv3d(channels, channels, 3, indice_key="add")

    def forward(self, x):
        y = self.conv1(x) + x
        return self.conv2(y, add_input=x)


class BevBackbone(spconv.SparseModule):
    """CenterPoint-like: residual blocks, strided convs, then dense and view to [B, C·D, H, W]."""

    def __init__(self, cin: int):
        super().__init__()
        self.stem = spconv.SparseSequential(spconv.SubMConv3d(cin, 8, 3, padding=1, bias=False, indice_key="res0"),
                                            nn.BatchNorm1d(8), nn.ReLU())
        self.block0 = BasicBlock(8, "res0")
        self.down = spconv.SparseSequential(spconv.SparseConv3d(8, 16, 3, stride=2, padding=1, bias=False),
                                            nn.BatchNorm1d(16), nn.ReLU())
        self.block1 = AddBlock(16)
        self.extra = spconv.SparseConv3d(16, 16, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x):
        x = self.extra(self.block1(self.down(self.block0(self.stem(x)))))
        bev = x.dense()
        n, c, d, h, w = bev.shape
        return bev.view(n, c * d, h, w)


class UNet(spconv.SparseModule):
    """An encoder-decoder: inverse conv back onto the skip rows, skip features concatenated."""

    def __init__(self, cin: int):
        super().__init__()
        self.stem = spconv.SubMConv3d(cin, 8, 3, indice_key="subm0")
        self.down = spconv.SparseConv3d(8, 16, (3, 3, 2), stride=(2, 2, 3), padding=(1, 0, 0), indice_key="down")
        self.enc = spconv.SparseSequential(spconv.SubMConv3d(16, 16, 3, indice_key="subm1"), nn.BatchNorm1d(16),
                                           nn.LeakyReLU(0.1))
        self.up = spconv.SparseInverseConv3d(16, 8, (3, 3, 2), indice_key="down", bias=False)
        self.up_bn = nn.BatchNorm1d(8)
        self.head = spconv.SubMConv3d(16, 3, 3, indice_key="subm0")

    def forward(self, x):
        skip = self.stem(x)
        y = self.up(self.enc(self.down(skip)))
        y = y.replace_feature(torch.relu(self.up_bn(y.features)))
        y = y.replace_feature(torch.cat([y.features, skip.features], dim=1))
        out = self.head(y)
        return out.replace_feature(torch.sigmoid(out.features))


class SharedConvOutput(spconv.SparseModule):
    """A batch norm whose input is also read elsewhere: it stays a BatchNormalization."""

    def __init__(self, cin: int):
        super().__init__()
        self.conv = spconv.SubMConv3d(cin, 5, 3, bias=False)
        self.bn = nn.BatchNorm1d(5)

    def forward(self, x):
        y = self.conv(x)
        return y.replace_feature(self.bn(y.features) + y.features)


def transposed_stack(cin: int):
    return spconv.SparseSequential(
        spconv.SparseConvTranspose3d(cin, 6, 3, stride=2, padding=1),
        nn.ReLU(),
        SparseConvolution(3, 6, 6, 2, stride=(1, 2, 2), padding=(0, 1, 0), output_padding=(0, 1, 1),
                          transposed=True),
        spconv.SparseConvTranspose3d(6, 4, 3, stride=1, dilation=2),
    )


def one_by_one_stack(cin: int):
    """spconv's 1x1 fast path, which multiplies by weight.view(Cin, Cout)."""
    return spconv.SparseSequential(spconv.SubMConv3d(cin, 7, 1), nn.ReLU(), spconv.SparseConv3d(7, 3, 1))


class Dense2d(spconv.SparseModule):
    """2D: channels-last dense output permuted back, and a second output."""

    def __init__(self, cin: int):
        super().__init__()
        self.conv = spconv.SparseConv2d(cin, 6, 3, stride=2, padding=1)
        self.subm = spconv.SubMConv2d(6, 6, 3, dilation=2)

    def forward(self, x):
        y = self.subm(self.conv(x))
        return y, y.dense(channels_first=False).permute(0, 3, 1, 2).contiguous().flatten(2)


class GatedRows(spconv.SparseModule):
    """Arithmetic on rows that a translator per torch call would have to know (mmdetection3d's Cylinder3D
    gates one branch by another): products of branches, scalars, tanh, where, LayerNorm, Linear, GELU,
    softmax over channels; torch.onnx writes it all."""

    def __init__(self, cin: int):
        super().__init__()
        self.a = spconv.SubMConv3d(cin, 8, 3, indice_key="g")
        self.b = spconv.SubMConv3d(cin, 8, (3, 1, 1), indice_key="g")
        self.down = spconv.SparseConv3d(8, 8, 3, 2, 1)
        self.norm = nn.LayerNorm(8)
        self.linear = nn.Linear(8, 6)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        gated = a.replace_feature(torch.tanh(a.features) * torch.sigmoid(b.features) * 2.0 - 0.5 / 3)
        gated = gated.replace_feature(torch.where(gated.features > 0, gated.features, gated.features * 0.1))
        y = self.down(gated)
        rows = nn.functional.gelu(self.linear(self.norm(y.features)))
        return y.replace_feature(torch.softmax(rows, dim=1) + rows.mean(dim=0, keepdim=True))


MODULES = {
    "conv_bn_relu": (lambda cin: spconv.SparseSequential(
        spconv.SubMConv3d(cin, 16, 3, bias=False, indice_key="subm1"), nn.BatchNorm1d(16), nn.ReLU(),
        spconv.SparseConv3d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm1d(32), nn.ReLU(),
        spconv.SubMConv3d(32, 8, 3, dilation=2), nn.BatchNorm1d(8)), 3),
    "residual_dense_view": (BevBackbone, 3),
    "batch_norm_not_folded": (SharedConvOutput, 3),
    "unet_inverse_concat": (UNet, 3),
    "transposed": (transposed_stack, 3),
    "one_by_one": (one_by_one_stack, 3),
    "dense_2d_permute": (Dense2d, 2),
    "gated_rows": (GatedRows, 3),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_export_matches_spconv(name):
    make, ndim = MODULES[name]
    generator = torch.Generator().manual_seed(sorted(MODULES).index(name))
    torch.manual_seed(sorted(MODULES).index(name))
    module = randomize_batch_norms(make(4), generator)
    spatial_shape = (11, 14, 16)[-ndim:]
    features, coords = random_sparse(np.random.default_rng(1), 2, 4, spatial_shape, density=0.2)
    model = assert_export_matches(module, sparse_tensor(features, coords, spatial_shape, 2))
    assert model.ir_version == 10
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == [
        ("features", TensorProto.FLOAT), ("coords", TensorProto.INT64)]


def test_export_folds_batch_norm_and_saves(tmp_path):
    module = randomize_batch_norms(MODULES["conv_bn_relu"][0](4), torch.Generator().manual_seed(0))
    features, coords = random_sparse(np.random.default_rng(0), 1, 4, (8, 8, 8), density=0.25)
    model = export(module, sparse_tensor(features, coords, (8, 8, 8), 1), tmp_path / "net.onnx")
    assert [n.op_type for n in model.graph.node] == ["SubmanifoldConv", "Relu", "SparseConv", "Relu",
                                                     "SubmanifoldConv"]
    assert onnx.load(tmp_path / "net.onnx").graph == model.graph


class Lgamma(spconv.SparseModule):
    """A torch call torch.onnx has no ONNX form for."""

    def __init__(self):
        super().__init__()
        self.conv = spconv.SubMConv3d(4, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return y.replace_feature(torch.lgamma(y.features.abs() + 1))


def test_export_refusals_name_the_module_the_call_and_the_line():
    features, coords = random_sparse(np.random.default_rng(0), 1, 4, (8, 8, 8), density=0.25)
    x = sparse_tensor(features, coords, (8, 8, 8), 1)
    with pytest.raises(SparseLowerError, match=r"node 'Lgamma': torch.onnx cannot export aten::lgamma, called as "
                                               r"lgamma at .*test_spconv_oracle.py:\d+") as refusal:
        export(Lgamma(), x)
    assert "register_custom_op_symbolic" in refusal.value.fix
    pool = spconv.SparseSequential(spconv.SubMConv3d(4, 4, 3), spconv.SparseAvgPool3d(2, 2))
    with pytest.raises(SparseLowerError, match=r"node '1': SparseAvgPool3d cannot be exported yet \(called at "
                                               r".*test_spconv_oracle.py:\d+\)"):
        export(pool, x)
    with pytest.raises(SparseLowerError, match="SparseConvTensor or a tuple"):
        export(pool, features)
    with pytest.raises(SparseLowerError, match="the module must be a torch.nn.Module, got function"):
        export(lambda t: t, x)
    with pytest.raises(SparseLowerError, match=r"is a folder, where the model file goes"):
        export(pool, x, Path(__file__).parent)
    three = sparse_tensor(features[:, :3].copy(), coords, (8, 8, 8), 1)
    with pytest.raises(SparseLowerError, match=r"the module failed while it was traced for export, at .*conv.py:\d+: "
                                               r"AssertionError: channel size mismatch"):
        export(spconv.SparseSequential(spconv.SubMConv3d(4, 4, 3)), three)


def test_export_without_spconv_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "spconv.pytorch", None)
    with pytest.raises(SparseLowerError, match=r"sparse-lower\[spconv\]"):
        export(None, None)


def one_tap_network(emitter, rng, spatial_shape=(8, 12, 12), batch_size=1):
    """Layers that spconv runs on its 1x1 fast path (features @ weight.view(Cin, Cout)): a 1x1
    submanifold conv and a 1x1 stride-1 conv, with different channel counts so that a transpose and
    a reinterpretation of the weight memory give different numbers."""
    x = emitter.input(5, spatial_shape, batch_size)
    x = emitter.conv(x, "subm", rng.standard_normal((7, 3, 3, 3, 5)).astype(np.float32), None, padding=1,
                     indice_key="s0", activation="ReLU", name="subm3")
    x = emitter.conv(x, "subm", rng.standard_normal((4, 1, 1, 1, 7)).astype(np.float32),
                     rng.standard_normal(4).astype(np.float32), name="subm1x1")
    x = emitter.conv(x, "conv", rng.standard_normal((6, 1, 1, 1, 4)).astype(np.float32), None, name="conv1x1")
    return emitter.finish([x])


@pytest.mark.parametrize("source", ["canonical", "nvidia"])  # AIMET's export ends dense, not in rows
def test_one_tap_layers_read_their_weights_as_spconv_does(source):
    import sparse_lower.models as models
    from sparse_lower.importers import import_model

    features, coords = random_sparse(np.random.default_rng(1), 1, 5, (8, 12, 12), count=200)
    weight_dtype = np.float16 if source == "nvidia" else np.float32
    expected = one_tap_network(SpconvEmitter(weight_dtype), np.random.default_rng(0))(features, coords)
    emitter = {"canonical": models.CanonicalEmitter, "nvidia": models.NvidiaEmitter}[source]()
    model = one_tap_network(emitter, np.random.default_rng(0))
    model = model if source == "canonical" else import_model(model)
    assert output_error(run_network(model, features, coords, "gpu"), expected) < 1e-5
