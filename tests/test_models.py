"""The reference networks (sparse_lower.models): the canonical form passes the checker, lowers for gpu and
nna and matches the NumPy reference on small random inputs and on the real nuScenes frames; its inverse
convs and dense boundaries match the dense oracle; the wild-format writers produce the documented
nodes, attributes, inputs and initializer types, holding the same weights as the canonical form."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from conftest import DATA
from oracle import dense_oracle, densify, gather_sites, random_sparse
from sparse_lower import reference
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import (AimetEmitter, CanonicalEmitter, NvidiaEmitter, patent_2d_stack, patent_example,
                                 sp_middle_resnet_fhd, sparse_unet)
from sparse_lower.models.emitter import Sparse
from sparse_lower.models.layers import ConvPlanner, Values
from sparse_lower.spconv_rules import LEAKY_RELU_ALPHA, source_weight
from sparse_lower.models.patent2d import PATENT_SITES
from sparse_lower.schemas import conv_geometry

SMALL_GRID = (41, 40, 40)  # deep enough in z for CenterPoint's four z-strides (41 → 21 → 11 → 5 → 2)
CONV_ATTRIBUTES = {"ndim", "input_spatial_shape", "output_spatial_shape", "in_channels", "out_channels",
                   "kernel_size", "output_bound", "stride", "dilation", "padding", "transposed", "inverse",
                   "output_padding", "groups", "subm", "rulebook", "activation", "input_shape", "output_shape"}


def centerpoint(emitter, grid=SMALL_GRID):
    return sp_middle_resnet_fhd(emitter, np.random.default_rng(0), spatial_shape=grid)


def unet(emitter, grid=SMALL_GRID):
    return sparse_unet(emitter, np.random.default_rng(0), spatial_shape=grid)


def lowered_outputs(model, feeds, target, **options):
    session = sparse_lower.create_session(sparse_lower.lower(model, target=target, check_each_pass=True, **options))
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_outputs_match(actual, expected, rtol=1e-4, atol=1e-4):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(actual[name], value, err_msg=name)


def lidar_like(rng, grid=SMALL_GRID, count=1500):
    """Random voxels on the small grid with nuScenes-like feature magnitudes."""
    features, coords = random_sparse(rng, 1, 5, grid, count=count)
    return {"features": features * np.array([10, 10, 1.5, 20, 0.15], np.float32), "coords": coords}


def attributes(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def real_frame(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"the real nuScenes frame {path} is absent (shared data not provided)")
    features, coords, grid = load_voxels(path)
    return {"features": features, "coords": coords}, grid


# --- canonical form ---------------------------------------------------------------------------------


def test_centerpoint_structure():
    model = centerpoint(CanonicalEmitter(), grid=(41, 1440, 1440))  # finish() runs the full checker
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["SubmanifoldConv"] == 1 + 4 * 2 * 2 and ops["SparseConv"] == 4 and ops["Add"] == 8
    assert ops["ToDense"] == 1 and ops["Reshape"] == 1
    (output,) = model.graph.output
    assert [d.dim_value for d in output.type.tensor_type.shape.dim] == [1, 256, 180, 180]
    assert all(t.data_type == TensorProto.FLOAT for t in model.graph.initializer if not t.name.endswith(".shape"))
    assert {o.domain: o.version for o in model.opset_import} == {"": 17, "sparse": 1} and model.ir_version == 10
    extents = [conv_geometry(n).output_shape for n in model.graph.node if n.op_type == "SparseConv"]
    assert extents == [(21, 720, 720), (11, 360, 360), (5, 180, 180), (2, 180, 180)]


def test_unet_inverse_convs_take_the_forward_geometry_and_coords():
    model = unet(CanonicalEmitter(), grid=(41, 1440, 1440))
    nodes = {n.name: n for n in model.graph.node}
    for level, (extent, padding) in {1: ((41, 1440, 1440), [0, 1, 1]), 2: ((21, 720, 720), [0, 1, 1]),
                                     3: ((11, 360, 360), [0, 1, 1])}.items():
        down, up = nodes[f"down{level}"], nodes[f"up{level}"]
        attrs = attributes(up)
        assert up.op_type == "SparseDeconv" and len(up.input) == 5
        assert up.input[4] == down.input[1], "target_coords are the forward conv's input coords"
        assert attrs["output_padding"] == padding
        assert list(attrs["spatial_shape"]) == list(conv_geometry(down).output_shape)
        assert conv_geometry(up).output_shape == conv_geometry(down).spatial_shape == extent


@pytest.mark.parametrize("target", ["gpu", "nna"])
@pytest.mark.parametrize("network", [centerpoint, unet])
def test_networks_lower_and_match_the_reference(network, target):
    model = network(CanonicalEmitter())
    feeds = lidar_like(np.random.default_rng(1))
    expected = reference.run(model, feeds)
    assert_outputs_match(lowered_outputs(model, feeds, target), expected)


def test_centerpoint_on_the_real_frame():
    feeds, grid = real_frame("nuscenes_centerpoint_voxels.npz")
    model = centerpoint(CanonicalEmitter(), grid)
    expected = reference.run(model, feeds)["output"]
    assert expected.shape == (1, 256, 180, 180)
    active = expected[expected != 0]
    assert 0.1 < np.sqrt(np.mean(active ** 2)) < 10, "activations neither explode nor vanish"
    np.testing.assert_allclose(lowered_outputs(model, feeds, "gpu")["output"], expected, rtol=1e-4, atol=1e-4)


def test_unet_on_the_real_frame():
    feeds, grid = real_frame("nuscenes_bevfusion_voxels.npz")
    model = unet(CanonicalEmitter(), grid)
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(expected["output_coords"], feeds["coords"])  # back on the input rows, in order
    assert 0.01 < np.sqrt(np.mean(expected["output"] ** 2)) < 10
    assert_outputs_match(lowered_outputs(model, feeds, "nna"), expected)


def test_patent_example_by_hand():
    model = patent_example(CanonicalEmitter())
    p = np.array([[2.0], [3.0], [5.0]], np.float32)
    w = dict(enumerate(range(1, 10), start=1))
    expected = np.array([[w[5] * 2 + w[6] * 3 + w[9] * 5], [w[4] * 2 + w[5] * 3 + w[8] * 5],
                         [w[1] * 2 + w[2] * 3 + w[5] * 5]], np.float32)
    feeds = {"features": p, "coords": PATENT_SITES}
    for outputs in (reference.run(model, feeds), lowered_outputs(model, feeds, "nna", combine="matmul")):
        np.testing.assert_array_equal(outputs["output_coords"], PATENT_SITES)
        np.testing.assert_allclose(outputs["output"], expected, rtol=1e-6)


def patent_image(rng, channels, grid=(20, 24), batch=2, density=0.1):
    features, coords = random_sparse(rng, batch, channels, grid, density=density)
    return densify(features, coords, batch, grid)


@pytest.mark.parametrize("target", ["gpu", "nna", "hybrid"])
def test_patent_stack_with_dense_io_matches_the_dense_oracle(target):
    """Layer by layer: dense Conv, kept at the input's active pixels, ReLU between layers."""
    rng = np.random.default_rng(2)
    model = patent_2d_stack(CanonicalEmitter(), rng, in_channels=6, channels=(8, 8, 4), spatial_shape=(20, 24),
                            batch_size=2, bias=True)
    assert [i.name for i in model.graph.input] == ["X"] and model.graph.node[0].op_type == "ToSparse"
    x = patent_image(np.random.default_rng(3), 6)
    mask = np.any(x != 0, axis=1, keepdims=True)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    y = x
    for index in range(3):
        y = dense_oracle("SubmanifoldConv", {"kernel_shape": [3, 3]}, y, weights[f"subm{index}.W"],
                         weights[f"subm{index}.B"]) * mask
        y = np.maximum(y, 0) if index < 2 else y
    expected = reference.run(model, {"X": x})["output"]
    np.testing.assert_allclose(expected, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lowered_outputs(model, {"X": x}, target)["output"], y, rtol=1e-4, atol=1e-4)


# --- the emitter's conversions, against the dense oracle -------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_inverse_conv_matches_conv_transpose_at_the_forward_input_sites(seed):
    """conv then inverse, random geometry (odd and even extents, so both output paddings): the inverse
    output sits on the forward input rows, in order, and equals there the dense ConvTranspose of the
    forward output with the forward geometry (docs/source_ops.md)."""
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(2, 4))
    grid = tuple(int(v) for v in rng.integers(5, 12, ndim))  # large enough for any kernel drawn here
    kernel, stride = rng.integers(1, 4, ndim), rng.integers(1, 4, ndim)
    padding, dilation = rng.integers(0, kernel), rng.integers(1, 3, ndim)
    emitter = CanonicalEmitter()
    x = emitter.input(3, grid, 2)
    w1 = rng.standard_normal((4, *kernel, 3)).astype(np.float32)
    y = emitter.conv(x, "conv", w1, None, stride=stride, padding=padding, dilation=dilation, indice_key="k")
    w2 = rng.standard_normal((2, *kernel, 4)).astype(np.float32)
    b2 = rng.standard_normal(2).astype(np.float32)
    model = emitter.finish([emitter.conv(y, "inverse", w2, b2, indice_key="k", activation="LeakyReLU")])
    features, coords = random_sparse(rng, 2, 3, grid, density=0.3)
    result = reference.run(model, {"features": features, "coords": coords})
    np.testing.assert_array_equal(result["output_coords"], coords)
    forward, inverse = (n for n in model.graph.node if n.domain == "sparse")
    hidden, hidden_coords = reference.sparse_conv(features, coords, weight_of(model, forward), **attributes(forward))
    inverse_attrs = attributes(inverse)
    hidden_dense = densify(hidden, hidden_coords, 2, inverse_attrs["spatial_shape"])
    dense = dense_oracle("SparseDeconv", inverse_attrs, hidden_dense, weight_of(model, inverse), b2)
    assert dense.shape[2:] == grid
    expected = gather_sites(dense, coords)
    expected = np.where(expected > 0, expected, LEAKY_RELU_ALPHA * expected)
    np.testing.assert_allclose(result["output"], expected, rtol=1e-4, atol=1e-4)


def weight_of(model, node):
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == node.input[2])


def test_every_kind_and_activation_lowers_and_matches():
    rng = np.random.default_rng(4)
    emitter = CanonicalEmitter()
    x = emitter.input(3, (12, 14), 2)
    w = lambda cin, cout, k: (rng.standard_normal((cout, *k, cin)) / np.sqrt(cin * np.prod(k))).astype(np.float32)
    x = emitter.conv(x, "subm", w(3, 4, (3, 3)), None, dilation=2, activation="Sigmoid")
    y = emitter.conv(x, "conv", w(4, 6, (3, 2)), np.ones(6, np.float32), stride=(2, 3), padding=1, indice_key="down")
    z = emitter.conv(y, "deconv", w(6, 5, (2, 3)), None, stride=2, output_padding=(1, 0), activation="LeakyReLU")
    back = emitter.add(emitter.conv(y, "inverse", w(6, 4, (3, 2)), None, indice_key="down", activation="ReLU"), x)
    model = emitter.finish([z, back])
    assert [o.name for o in model.graph.output] == ["output_0", "output_0_coords", "output_1", "output_1_coords"]
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Sigmoid"] == ops["LeakyRelu"] == ops["Relu"] == ops["Add"] == 1 and ops["SparseDeconv"] == 2
    features, coords = random_sparse(rng, 2, 3, (12, 14), density=0.2)
    feeds = {"features": features, "coords": coords}
    expected = reference.run(model, feeds)
    for target in ("gpu", "nna"):
        assert_outputs_match(lowered_outputs(model, feeds, target), expected)


def test_spconv_weights_become_onnx_layouts():
    w = np.arange(2 * 3 * 5 * 4, dtype=np.float32).reshape(2, 3, 5, 4)  # [Cout, k0, k1, Cin]
    planner = ConvPlanner()
    x = Sparse(Values("f", "c", "c"), 4, (10, 10))
    conv = planner.plan(x, "conv", w, None, name="conv", indice_key="k")
    deconv = planner.plan(x, "deconv", w, None, name="deconv", stride=2)
    assert source_weight(w, conv.transposed)[1, 3, 2, 4] == w[1, 2, 4, 3]  # [Cout, Cin, k0, k1]
    assert source_weight(w, deconv.transposed)[3, 1, 2, 4] == w[1, 2, 4, 3]  # [Cin, Cout, k0, k1]


@pytest.mark.parametrize("build, message", [
    (lambda e, x, w: e.conv(x, "deconv", w, None, stride=2, dilation=2), "ignores the dilation"),
    (lambda e, x, w: e.conv(x, "inverse", w, None, indice_key="nowhere"), "needs the indice_key of a strided conv"),
    (lambda e, x, w: e.conv(x, "subm", w, None, stride=2), "odd kernel and stride 1"),
    (lambda e, x, w: e.conv(x, "conv", w[..., :2], None), "is not [Cout"),
    (lambda e, x, w: e.add(x, e.conv(x, "conv", w, None, stride=2)), "add of"),
    (lambda e, x, w: e.add(x, e.conv(x, "conv", w, None, padding=1)), "different rows"),
    (lambda e, x, w: [e.conv(x, "conv", w, None, indice_key="k"), e.conv(x, "conv", w, None, indice_key="k")],
     "already belongs"),
    (lambda e, x, w: e.conv(x, "subm", w, None, activation="GELU"), "unknown activation"),
    (lambda e, x, w: [e.conv(x, "subm", w, None, indice_key="s"),
                      e.conv(e.conv(x, "conv", w, None, padding=1), "subm", w, None, indice_key="s")],
     "only on the same coords"),
])
def test_invalid_layers_are_refused(build, message):
    emitter = CanonicalEmitter()
    x = emitter.input(3, (8, 8, 8), 1)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        build(emitter, x, np.ones((3, 3, 3, 3, 3), np.float32))


# --- wild formats -------------------------------------------------------------------------------------


def test_nvidia_format():
    """What exptool writes (tests/test_wild.py compares it with a file exptool wrote)."""
    model = centerpoint(NvidiaEmitter(), grid=(41, 1440, 1440))
    assert {o.domain: o.version for o in model.opset_import} == {"ai.onnx": 11}
    assert (model.ir_version, model.producer_name, model.graph.name) == (onnx.IR_VERSION, "pytorch", "scn")
    (features,) = model.graph.input
    assert features.name == "0" and features.type.tensor_type.elem_type == TensorProto.FLOAT16
    assert [d.dim_value for d in features.type.tensor_type.shape.dim] == [1, 5]  # the traced zero voxel
    assert Counter(n.op_type for n in model.graph.node) == {"SparseConvolution": 1 + 16 + 4, "Add": 8, "Relu": 8,
                                                             "ScatterDense": 1, "Reshape": 1}
    assert all(t.data_type == TensorProto.FLOAT16 for t in model.graph.initializer)
    initializers = {t.name: t for t in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "SparseConvolution"]
    assert [n.name for n in convs] == [f"conv{i}" for i in range(21)]
    for index, node in enumerate(convs):
        attrs = attributes(node)
        assert set(attrs) | {"rulebook"} == CONV_ATTRIBUTES and node.domain == ""
        assert node.input[1:] == [f"spconv{index}.weight", f"spconv{index}.bias"]
        assert list(initializers[node.input[1]].dims) == [attrs["out_channels"], *attrs["kernel_size"],
                                                          attrs["in_channels"]]
        assert attrs["output_bound"] == 200000 and attrs["groups"] == 1
    first = attributes(convs[0])
    assert first["rulebook"] == b"res0" and first["subm"] == 1 and first["activation"] == b"ReLU"
    assert first["input_shape"] == [1, 5] and first["output_shape"] == [1, 16]
    down = attributes(convs[15])  # conv4.0: the third downsampling, without an indice_key
    assert "rulebook" not in down and down["padding"] == [0, 1, 1] and down["stride"] == [2, 2, 2]
    assert down["output_spatial_shape"] == [5, 180, 180] and down["subm"] == 0
    assert attributes(convs[2])["activation"] == b"None"  # conv1.0.conv2
    scatter, reshape = model.graph.node[-2:]
    assert (scatter.name, reshape.name) == ("scatter0", "reshape0")
    assert attributes(scatter) == {"input_spatial_shape": [2, 180, 180], "format": b"zyx",
                                   "output_shape": [1, 128, 2, 180, 180]}
    assert len(reshape.input) == 1 and attributes(reshape) == {"dims": [1, 256, 180, 180]}
    assert model.graph.output[0].name == reshape.output[0] == str(len(model.graph.node))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)  # as the real files: non-standard Reshape


def test_nvidia_xyz_format():
    """BEVFusion's --origin export: every spatial axis reversed, ScatterDense "xyz", and a Transpose that
    brings the dense axes back before the network's reshape."""
    model = centerpoint(NvidiaEmitter(coords_order="xyz"), grid=(41, 1440, 1440))
    convs = [n for n in model.graph.node if n.op_type == "SparseConvolution"]
    first, last = attributes(convs[0]), attributes(convs[-1])
    assert first["input_spatial_shape"] == [1440, 1440, 41]
    assert last["kernel_size"] == [1, 1, 3] and last["stride"] == [1, 1, 2]
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    assert weights[convs[-1].input[1]] == [128, 1, 1, 3, 128]
    scatter, transpose, reshape = model.graph.node[-3:]
    assert attributes(scatter) == {"input_spatial_shape": [180, 180, 2], "format": b"xyz",
                                   "output_shape": [1, 128, 180, 180, 2]}
    assert attributes(transpose) == {"dims": [0, 1, 4, 3, 2]}
    assert attributes(reshape) == {"dims": [1, 256, 180, 180]}


def test_aimet_format():
    """What aimet_torch's spconv export writes (tests/test_wild.py compares it with a file AIMET wrote)."""
    model = centerpoint(AimetEmitter(), grid=(41, 40, 40))
    assert {o.domain: o.version for o in model.opset_import} == {"": 16, "spconv": 1} and model.ir_version == 8
    indices, features = model.graph.input
    assert (indices.name, indices.type.tensor_type.elem_type) == ("indices", TensorProto.INT32)
    assert [d.dim_value for d in indices.type.tensor_type.shape.dim] == [41 * 40 * 40, 4]  # the whole grid
    assert features.type.tensor_type.elem_type == TensorProto.FLOAT
    assert all(t.data_type == TensorProto.FLOAT for t in model.graph.initializer if "sp_conv_3d" in t.name)
    convs = [n for n in model.graph.node if n.op_type == "SparseConvolution"]
    assert all(n.domain == "spconv" for n in convs)
    assert convs[0].input[:2] == ["indices", "features"] and len(convs[0].input) == 4
    assert all(len(n.input) == 3 and len(n.output) == 1 for n in convs[1:])
    dense = {v.name for v in model.graph.value_info if len(v.type.tensor_type.shape.dim) == 5}
    assert {n.output[0] for n in convs} <= dense
    first, down = attributes(convs[0]), attributes(convs[5])
    assert first["subm"] == 1 and first["rulebook"] == b"subm1" and "batch_size" not in first
    assert "subm" not in down and down["rulebook"] == b"subm0" and "transposed" not in down
    assert down["batch_size"] == 1 and down["spatial_shape"] == down["input_spatial_shape"]
    assert {"output_spatial_shape", "output_shape", "output_padding"}.isdisjoint(down)
    assert {n.op_type for n in model.graph.node} == {"SparseConvolution", "Relu", "Add", "ScatterDense", "Reshape"}
    with pytest.raises(ValueError, match="no inverse conv"):
        unet(AimetEmitter())


@pytest.mark.parametrize("emitter", [NvidiaEmitter, AimetEmitter])
def test_wild_formats_hold_the_canonical_weights(emitter):
    """Same network, same generator: every conv's weight in the wild file is the canonical one in
    spconv layout (rounded to the file's float type), conv by conv in order."""
    canonical = centerpoint(CanonicalEmitter())
    wild = centerpoint(emitter())
    canonical_nodes = [n for n in canonical.graph.node if n.domain == "sparse" and n.op_type != "ToDense"]
    init = lambda model: {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    canonical_init, wild_init = init(canonical), init(wild)
    convs = [n for n in wild.graph.node if n.op_type == "SparseConvolution"]
    assert len(convs) == len(canonical_nodes)
    for node, source in zip(convs, canonical_nodes):
        weight = wild_init[node.input[-2]]
        expected = np.transpose(canonical_init[source.input[2]], (0, *range(2, weight.ndim), 1))
        np.testing.assert_array_equal(weight, expected.astype(weight.dtype))
        np.testing.assert_array_equal(wild_init[node.input[-1]], canonical_init[source.input[3]].astype(weight.dtype))


def test_sparse_only_networks_build_in_every_form():
    for emitter in (CanonicalEmitter(), NvidiaEmitter()):
        model = patent_2d_stack(emitter, np.random.default_rng(0), dense_io=False)
        assert model.graph.output
    with pytest.raises(ValueError, match="3D only"):
        patent_2d_stack(AimetEmitter(), np.random.default_rng(0), dense_io=False)
    with pytest.raises(ValueError, match="has no dense input"):
        patent_2d_stack(NvidiaEmitter(), np.random.default_rng(0))
