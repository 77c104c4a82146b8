"""The importers (sparse_lower.importers): NVIDIA Lidar_AI_Solution and AIMET/QNN sparse-conv ONNX →
source ops, on graphs of every geometry.

The foreign models are written by hand with onnx.helper (`ForeignGraph`, tests/foreign_graphs.py), in
the forms the real exporters write; tests/test_wild.py holds the files the real exporters wrote. While
it writes a node, `ForeignGraph` also records the layer's meaning in spconv's own terms, and `evaluate`
runs that record in plain NumPy loops over a dict of active sites (tests/spconv_semantics.py): an
evaluation of spconv's semantics that shares nothing with the importer or with the source-op reference
it is compared against.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
import sparse_lower.models
from foreign_graphs import ForeignGraph, Handle, assert_outputs_match, one_conv, scatter_model
from sparse_lower import reference
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError, SparseLowerWarning
from sparse_lower.importers import SOURCE_FORMAT, detect_format, import_model
from spconv_semantics import LEAKY_SLOPE, as_dict


# -- networks --------------------------------------------------------------------------------------

def residual_unet(rng, name_nodes=True) -> ForeignGraph:
    """NVIDIA, 3D: subm blocks with a residual Add, a strided conv, its inverse (same rulebook key) and a
    skip Add; a folded BEV map of the bottleneck through ScatterDense + the non-standard Transpose and
    Reshape."""
    g = ForeignGraph("nvidia", 4, (6, 8, 10), rng, name_nodes=name_nodes)
    a = g.conv(g.x, "subm", 8, 3, key="subm1", activation="ReLU")
    b = g.conv(a, "subm", 8, 3, key="subm1")
    c = g.relu(g.add(a, b))
    d = g.conv(c, "conv", 16, 3, stride=2, padding=1, key="down", activation="LeakyReLU")
    e = g.conv(d, "subm", 16, 3, dilation=2, key="subm2", activation="Sigmoid")
    f = g.conv(e, "inverse", 8, 3, key="down", activation="ReLU")
    skip = g.add(f, c)
    bev = g.scatter_dense(e, "zyx")
    bev = g.reshape(g.transpose(bev, [0, 1, 3, 2, 4]), [g.batch, 16 * 4, 3, 5])
    g.build(skip, bev)
    return g


def aimet_chain(rng, name_nodes=True) -> ForeignGraph:
    """AIMET, what its export holds: a regular conv on (indices, features), a torch ReLU between layers,
    a subm conv and a residual Add on its rows, a strided conv, ScatterDense (format "xyz", no
    transposition) on a non-cubic grid."""
    g = ForeignGraph("aimet", 3, (5, 7, 9), rng, name_nodes=name_nodes)
    a = g.relu(g.conv(g.x, "conv", 6, 2))
    b = g.conv(a, "subm", 6, 3, activation="ReLU")
    c = g.conv(g.add(a, b), "conv", 4, 3, stride=2, padding=1, dilation=1)
    g.build(g.scatter_dense(c, "xyz"))
    return g


def decoder_2d(rng) -> ForeignGraph:
    """2D: subm, a transposed conv with padding and output_padding, ScatterDense in format zyx (which a 2D
    export writes too)."""
    g = ForeignGraph("nvidia", 3, (5, 7), rng)
    a = g.conv(g.x, "subm", 6, (3, 5), activation="ReLU")
    b = g.conv(a, "deconv", 4, 3, stride=2, padding=1, output_padding=1, bias=False)
    g.build(b, g.scatter_dense(b, "zyx"))
    return g


NETWORKS = {"nvidia": residual_unet, "aimet": aimet_chain}


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
@pytest.mark.parametrize("fmt", NETWORKS)
@pytest.mark.parametrize("name_nodes", [True, False])
def test_networks_match_spconv(fmt, name_nodes, rng):
    g = NETWORKS[fmt](rng, name_nodes)
    imported = import_model(g.model)
    for active in (60, 1):
        assert_outputs_match(g, imported, *g.random_input(active))


def respelled(model: onnx.ModelProto, spelling: str) -> onnx.ModelProto:
    """Every weight and bias of the sparse convs spelled as exporters and tools write them: through an
    Identity (torch.onnx's equal initializers stored once), as a Constant node, through a Cast from
    float64, as a Reshape of a flat initializer, as a Transpose of a transposed one (a tool that did not
    fold them), or as an initializer also listed as a graph input (files of IR version < 4)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    read = {name for node in graph.node if node.op_type == "SparseConvolution" for name in node.input[-2:]}
    kept, nodes = [], []
    for tensor in graph.initializer:
        value, name = numpy_helper.to_array(tensor), tensor.name
        if name not in read:
            kept.append(tensor)
        elif spelling == "identity":
            kept.append(numpy_helper.from_array(value, f"{name}.stored"))
            nodes.append(helper.make_node("Identity", [f"{name}.stored"], [name]))
        elif spelling == "constant":
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value)))
        elif spelling == "cast":
            kept.append(numpy_helper.from_array(value.astype(np.float64), f"{name}.wide"))
            nodes.append(helper.make_node("Cast", [f"{name}.wide"], [name], to=tensor.data_type))
        elif spelling == "reshape":
            kept += [numpy_helper.from_array(value.reshape(-1), f"{name}.flat"),
                     numpy_helper.from_array(np.array(value.shape, np.int64), f"{name}.shape")]
            nodes.append(helper.make_node("Reshape", [f"{name}.flat", f"{name}.shape"], [name]))
        elif spelling == "transpose":
            perm = list(range(value.ndim))[::-1]
            kept.append(numpy_helper.from_array(value.transpose(perm), f"{name}.transposed"))
            nodes.append(helper.make_node("Transpose", [f"{name}.transposed"], [name], perm=perm))
        else:  # graph input
            kept.append(tensor)
            graph.input.append(helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    everything = [*nodes, *graph.node]
    del graph.node[:]
    graph.node.extend(everything)
    return model


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
@pytest.mark.parametrize("spelling", ["identity", "constant", "cast", "reshape", "transpose", "graph input"])
@pytest.mark.parametrize("fmt", NETWORKS)
def test_weights_read_through_what_exporters_and_tools_put_around_them(fmt, spelling, rng):
    g = NETWORKS[fmt](rng)
    imported = import_model(respelled(g.model, spelling))
    assert_outputs_match(g, imported, *g.random_input(60))


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
def test_2d_transposed_conv_and_dense_match_spconv(rng):
    g = decoder_2d(rng)
    imported = import_model(g.model)
    assert [n.op_type for n in imported.graph.node] == ["SubmanifoldConv", "Relu", "SparseDeconv", "ToDense",
                                                        "Identity"]
    deconv = imported.graph.node[2]
    attrs = {a.name: helper.get_attribute_value(a) for a in deconv.attribute}
    assert attrs["pads"] == [1, 1, 1, 1] and attrs["output_padding"] == [1, 1] and "dilations" not in attrs
    assert len(deconv.input) == 3  # no bias
    assert_outputs_match(g, imported, *g.random_input(20))


def bevfusion_head(layout: str) -> tuple[ForeignGraph, np.ndarray]:
    """The tail of BEVFusion's encoder as its exporter writes it in the `layout` variant: one strided
    conv with the same weights (tap axes in the file's order), ScatterDense, exptool's permute to
    (Z, X, Y) and the reshape to [B, C·Z, X, Y]; and the coordinates of a frame in that order."""
    zyx_grid = (4, 6, 8)
    grid = zyx_grid if layout == "zyx" else zyx_grid[::-1]
    weights = np.random.default_rng(5).standard_normal((4, 3, 3, 3, 2)) / 3  # [Cout, kz, ky, kx, Cin]
    w = weights if layout == "zyx" else np.ascontiguousarray(weights.transpose(0, 3, 2, 1, 4))
    g = ForeignGraph("nvidia", 2, grid, np.random.default_rng(5), batch=1)
    y = g.conv(g.x, "conv", 4, (3, 3, 3), stride=(2, 1, 1) if layout == "zyx" else (1, 1, 2), padding=1,
               key="spconv1", weight=w)
    dense = g.scatter_dense(y, layout)
    depth = dense[1][2] if layout == "zyx" else dense[1][4]
    x_extent, y_extent = (dense[1][4], dense[1][3]) if layout == "zyx" else (dense[1][2], dense[1][3])
    bev = g.transpose(dense, [0, 1, 2, 4, 3] if layout == "zyx" else [0, 1, 4, 2, 3])
    g.build(g.reshape(bev, [1, 4 * depth, x_extent, y_extent]))
    coords = np.column_stack([np.zeros(12, np.int64), *np.unravel_index(
        np.random.default_rng(6).choice(int(np.prod(zyx_grid)), 12, replace=False), zyx_grid)])
    return g, coords if layout == "zyx" else coords[:, [0, 3, 2, 1]]


def test_bevfusion_exports_in_both_coordinate_orders_compute_the_same():
    """BEVFusion's exporter writes a zyx variant (coords (b, z, y, x), weights' tap axes reversed) and the
    --origin xyz variant (coords (b, x, y, z)); ScatterDense's `format` names that order and transposes
    nothing, and the permute/reshape after it are NVIDIA's non-standard Transpose/Reshape with `dims`.
    Both files compute the same BEV map, BEVFusion's [B, C·Z, X, Y], and name the coords' columns."""
    features = np.random.default_rng(7).standard_normal((12, 2)).astype(np.float16).astype(np.float32)
    bev = {}
    for layout in ("zyx", "xyz"):
        g, coords = bevfusion_head(layout)
        imported = import_model(g.model)
        assert [n.op_type for n in imported.graph.node] == ["SparseConv", "ToDense", "Transpose", "Reshape"]
        report = json.loads(metadata(imported)["sparse_lower.import"])
        assert report["coords"]["coords"] == {"columns": ["batch", *layout], "extents": [None, *g.x.grid]}
        bev[layout] = reference.run(imported, {"0": features, "coords": coords})[g.outputs[0][0]]
        assert_outputs_match(g, imported, features, coords)
    np.testing.assert_allclose(bev["xyz"], bev["zyx"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation, op_type", [("ReLU", "Relu"), ("None", None), ("Sigmoid", "Sigmoid"),
                                                 ("LeakyReLU", "LeakyRelu"), ("relu", "Relu")])
def test_activation_variants(activation, op_type, rng):
    g = ForeignGraph("nvidia", 3, (6, 7), rng)
    out = g.conv(g.x, "conv", 5, 2, stride=2, activation=activation)
    g.build(out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = import_model(g.model)
    ops = [n.op_type for n in imported.graph.node]
    assert ops == ["SparseConv"] + ([op_type] if op_type else []) + ["Identity"]
    notes = [str(w.message) for w in caught]
    if op_type == "LeakyRelu":  # the file has no slope: the one assumed is said
        assert imported.graph.node[1].attribute[0].f == pytest.approx(LEAKY_SLOPE)
        assert len(notes) == 1 and "does not say its slope: read as 0.01" in notes[0], notes
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the caller's slope: nothing left open
            given = import_model(g.model, leaky_relu_alpha=0.1)
        assert given.graph.node[1].attribute[0].f == pytest.approx(0.1)
    else:
        assert notes == []
    assert_outputs_match(g, imported, *g.random_input(30))


@pytest.mark.parametrize("fmt", ["nvidia", "aimet"])
def test_lower_asks_for_the_import_of_a_foreign_file(fmt, rng):
    g = ForeignGraph(fmt, 3, (6, 7, 8), rng)
    g.build(g.conv(g.x, "conv", 4, 3, stride=2))
    with pytest.raises(SparseLowerError, match=r"the model is an export in the .* format \(fix: import it first"):
        sparse_lower.lower(g.model)


def test_convert_takes_the_leaky_relu_slope_the_file_leaves_out(rng, tmp_path, capsys):
    """`convert --leaky-relu-alpha`: the network's slope, where exptool wrote none; no note is left, the
    lowered model uses it, and a bad value is refused before anything is written."""
    g = ForeignGraph("nvidia", 3, (6, 7, 8), rng)
    g.build(g.conv(g.x, "subm", 5, 3, activation="LeakyReLU"))
    source = tmp_path / "leaky.onnx"
    onnx.save(g.model, source)
    out = tmp_path / "leaky.gpu.onnx"
    assert main(["convert", str(source), "-o", str(out), "--leaky-relu-alpha", "0.2"]) == 0
    printed = capsys.readouterr().out
    assert "verify: ok" in printed and "warning" not in printed
    slopes = [a.f for n in onnx.load(out).graph.node if n.op_type == "LeakyRelu" for a in n.attribute]
    assert slopes == [pytest.approx(0.2)]
    with pytest.raises(SparseLowerError, match="leaky_relu_alpha=nan is not a finite number"):
        import_model(g.model, leaky_relu_alpha=float("nan"))


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
@pytest.mark.parametrize("seed", range(6))
def test_random_geometries_match_spconv(seed):
    """Random kernels, strides, paddings and dilations for conv, transposed conv and inverse conv."""
    rng = np.random.default_rng(100 + seed)
    ndim = 2 + seed % 2
    grid = tuple(int(v) for v in rng.integers(5, 9, ndim))
    g = ForeignGraph("nvidia", 2, grid, rng)
    kernel = tuple(int(v) for v in rng.choice([1, 2, 3], ndim))
    stride = tuple(int(v) for v in rng.integers(1, 4, ndim))
    padding = tuple(int(rng.integers(0, k + 1)) for k in kernel)
    dilation = tuple(int(v) for v in rng.integers(1, 3, ndim))
    down = g.conv(g.x, "conv", 3, kernel, stride, padding, dilation, key="k")
    up = g.conv(down, "inverse", 2, kernel, key="k")
    odd = tuple(k | 1 for k in kernel)
    mid = g.conv(down, "subm", 3, odd, dilation=dilation)
    de_stride = tuple(int(v) for v in rng.integers(1, 3, ndim))
    de_pad = tuple(int(rng.integers(0, k)) for k in odd)
    de = g.conv(mid, "deconv", 2, odd, de_stride, de_pad,
                output_padding=tuple(int(rng.integers(0, s)) for s in de_stride))
    g.build(up, de, down)
    imported = import_model(g.model)
    for active in (40, 3):
        assert_outputs_match(g, imported, *g.random_input(active))


def notes(model: onnx.ModelProto) -> list[str]:
    return json.loads(metadata(model)["sparse_lower.import"])["notes"]


def metadata(model: onnx.ModelProto) -> dict:
    return {p.key: p.value for p in model.metadata_props}


STALE = {  # an attribute libspconv ignores, written wrong: imported as the engine runs it, and noted
    "ndim": (dict(ndim=4), "ndim=4 is stale: the weight gives 3 (libspconv reads the weight too)"),
    "in_channels": (dict(in_channels=5), "in_channels=5 is stale: the weight gives 3 (libspconv reads the weight too)"),
    "out_channels": (dict(out_channels=9), "out_channels=9 is stale: the weight gives 4 (libspconv reads the weight "
                                           "too)"),
    "input grid": (dict(input_spatial_shape=[6, 7, 9]), "input_spatial_shape=[6, 7, 9] is stale: the layer before "
                                                        "gives [6, 7, 8] (libspconv derives each grid from the layer "
                                                        "before too)"),
    "output grid": (dict(output_spatial_shape=[3, 4, 5]), "output_spatial_shape=[3, 4, 5] is stale: the layer's "
                                                          "input grid [6, 7, 8] and its kernel, stride, padding and "
                                                          "dilation give [3, 4, 4]"),
    "groups": (dict(groups=2), "groups=2 is ignored: spconv convs have one group, and libspconv ignores groups"),
    "feature shapes": (dict(input_shape=[5, 3], output_shape=[1, 4]), None),  # the traced N: never checked
    "unknown": (dict(bogus=1), "attribute 'bogus' is not one spconv's exporters write; ignored"),
}


@pytest.mark.parametrize("case", STALE)
def test_stale_descriptive_attributes_are_noted_not_used(case, rng):
    """libspconv ignores ndim, the spatial shapes, the channel counts, groups and the feature shapes: it
    reads the weight and takes each grid from the layer before. So does the import; a contradicting
    value is a warning and a metadata note, and the numbers are the engine's."""
    overrides, message = STALE[case]
    g = ForeignGraph("nvidia", 3, (6, 7, 8), rng)
    a = g.conv(g.x, "subm", 3, 3, key="s")
    g.build(g.conv(a, "conv", 4, 3, stride=2, padding=1, **overrides))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = import_model(g.model)
    expected = [] if message is None else [f"node '{g.nodes[-1].name}': {message}"]
    assert notes(imported) == expected
    assert [str(w.message) for w in caught if w.category is SparseLowerWarning] == expected
    assert_outputs_match(g, imported, *g.random_input(40))


def test_missing_descriptive_attributes_are_derived(rng):
    """A file without ndim, channel counts, spatial shapes (after the first conv) or feature shapes still
    imports the way libspconv runs it."""
    g = ForeignGraph("nvidia", 3, (6, 7, 8), rng)
    absent = ("ndim", "in_channels", "out_channels", "output_spatial_shape", "input_shape", "output_shape", "groups",
              "transposed", "inverse", "output_padding", "rulebook")
    a = g.conv(g.x, "subm", 3, 3, drop=absent)
    g.build(g.conv(a, "conv", 4, 3, stride=2, padding=1, drop=(*absent, "input_spatial_shape")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        imported = import_model(g.model)
    assert_outputs_match(g, imported, *g.random_input(40))


def test_first_conv_without_input_grid_is_refused(rng):
    g = ForeignGraph("nvidia", 3, (6, 7, 8), rng)
    g.build(g.conv(g.x, "subm", 3, 3, drop=("input_spatial_shape",)))
    with pytest.raises(SparseLowerError) as raised:
        import_model(g.model)
    assert raised.value.node == g.nodes[-1].name
    assert raised.value.reason == "it reads the network input '0' but declares no input_spatial_shape: the grid " \
                                  "of the input is unknown"


def test_transposed_conv_is_spconvs_and_noted(rng):
    """libspconv ignores `transposed`; the import computes what the exported SparseConvTranspose does."""
    g = ForeignGraph("nvidia", 3, (4, 5, 6), rng)
    g.build(g.conv(g.x, "deconv", 4, 2, stride=2))
    with pytest.warns(SparseLowerWarning, match="transposed=1: imported as spconv's SparseConvTranspose"):
        imported = import_model(g.model)
    assert_outputs_match(g, imported, *g.random_input(30))


def test_int8_export_computes_in_float_and_keeps_its_ranges(rng):
    """The PTQ/QAT export (CUDA-CenterPoint/CUDA-BEVFusion qat exptool): ranges and precisions on convs,
    on Add (also spelled QuantAdd) and on ScatterDense; the import computes float32 from the stored
    weights and keeps every range in the metadata."""
    g = ForeignGraph("nvidia", 3, (6, 7, 8), rng)
    int8 = dict(precision="int8", output_precision="int8", input_dynamic_range=2.5)
    a = g.conv(g.x, "subm", 4, 3, key="s", precision="fp16", output_precision="int8", input_dynamic_range=1.5,
               weight_dynamic_ranges=[0.5, 0.25, 0.75, 1.0])
    b = g.conv(a, "subm", 4, 3, key="s", weight_dynamic_ranges=[1.0] * 4, **int8)
    total = g.add(a, b)
    g.nodes[-1].attribute.extend([helper.make_attribute("input0_dynamic_range", 3.0),
                                  helper.make_attribute("input1_dynamic_range", 3.0),
                                  helper.make_attribute("precision", "int8"),
                                  helper.make_attribute("output_precision", "fp16")])
    g.nodes[-1].op_type = "QuantAdd"
    g.build(g.scatter_dense(total, input_dynamic_range=4.0))
    with pytest.warns(SparseLowerWarning, match=r"an INT8 export \(4 nodes carry ranges\): computed in float32"):
        imported = import_model(g.model)
    assert "QuantAdd" not in {n.op_type for n in imported.graph.node}
    report = json.loads(metadata(imported)["sparse_lower.import"])
    assert sum("INT8 export" in note for note in report["notes"]) == 1
    quantization = report["quantization"]
    names = [n.name for n in g.nodes]
    assert quantization["nodes"] == {
        names[0]: {"input_dynamic_range": 1.5, "weight_dynamic_ranges": [0.5, 0.25, 0.75, 1.0], "precision": "fp16",
                   "output_precision": "int8"},
        names[1]: {"input_dynamic_range": 2.5, "weight_dynamic_ranges": [1.0] * 4, "precision": "int8",
                   "output_precision": "int8"},
        names[2]: {"input0_dynamic_range": 3.0, "input1_dynamic_range": 3.0, "precision": "int8",
                   "output_precision": "fp16"},
        names[3]: {"input_dynamic_range": 4.0}}
    assert_outputs_match(g, imported, *g.random_input(40))


def test_vectorised_output_layout_is_noted(rng):
    g = ForeignGraph("nvidia", 3, (6, 7, 8), rng, batch=1)
    g.build(g.scatter_dense(g.conv(g.x, "subm", 4, 3), output_layout="NCHW32"))
    with pytest.warns(SparseLowerWarning, match="output_layout=NCHW32: TensorRT's vectorised layout"):
        imported = import_model(g.model)
    assert_outputs_match(g, imported, *g.random_input(20))


@pytest.mark.parametrize("stride, warned", [(1, True), (2, False)])
def test_aimet_missing_subm_is_the_writers_zero(stride, warned, rng):
    """AIMET leaves subm=0 out; QNN's converter reads a missing subm as 1. The import follows the writer
    (a regular SparseConv3d, which AIMET's layer wraps, and `rulebook` "subm0" says so) and warns where
    the reader would compute another network: a conv of stride 1."""
    g = ForeignGraph("aimet", 3, (6, 7, 8), rng)
    g.build(g.scatter_dense(g.conv(g.x, "conv", 4, 3, stride=stride, padding=1)))
    assert "subm" not in {a.name for a in g.nodes[0].attribute}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = import_model(g.model)
    assert imported.graph.node[0].op_type == "SparseConv"
    messages = [str(w.message) for w in caught if w.category is SparseLowerWarning]
    assert messages == ([f"node '{g.nodes[0].name}': subm is not written: read as AIMET writes it, 0 (a regular "
                         f"SparseConv3d, which AIMET's layer wraps); QNN's converter reads a missing subm as 1 and "
                         f"would run a submanifold conv here"] if warned else [])
    assert_outputs_match(g, imported, *g.random_input(40))


def test_element_wise_ops_on_sparse_features(rng):
    """A per-channel Mul (a BatchNorm kept as Mul/Add) and a channel Concat of two tensors on the same
    coords stay on those coords; their numbers are the row-wise ones."""
    g = ForeignGraph("nvidia", 2, (6, 7), rng)
    a = g.conv(g.x, "subm", 3, 3)
    b = g.conv(a, "subm", 2, 1)
    scale = g._weight("scale", rng.standard_normal(3))
    g._node("Mul", [a.name, g.initializers[-1].name], ["scaled"])
    g._node("Concat", ["scaled", b.name], ["joined"], axis=1)
    g.program.append(lambda env: env.__setitem__("joined", {
        site: np.concatenate([v * scale, env[b.name][site]]) for site, v in env[a.name].items()}))
    g.build(Handle("joined", a.grid, 5))
    imported = import_model(g.model)
    assert_outputs_match(g, imported, *g.random_input(30))


def test_imported_nvidia_model_structure(rng):
    g = residual_unet(rng)
    imported = import_model(g.model)
    onnx.checker.check_model(imported)
    assert imported.ir_version <= 10
    opsets = {o.domain: o.version for o in imported.opset_import}
    assert opsets == {"": 17, "sparse": 1}  # "ai.onnx" is spelled "", as every tool resolves it
    assert {(n.domain, n.op_type) for n in imported.graph.node} <= {
        ("sparse", "SubmanifoldConv"), ("sparse", "SparseConv"), ("sparse", "SparseDeconv"), ("sparse", "ToDense"),
        ("", "Relu"), ("", "LeakyRelu"), ("", "Sigmoid"), ("", "Add"), ("", "Reshape"), ("", "Transpose"),
        ("", "Identity")}
    declared = {v.name: (v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in
                                                        v.type.tensor_type.shape.dim])
                for v in [*imported.graph.input, *imported.graph.output]}
    # the traced row count (TRACED_ROWS) is gone: every frame has its own N
    assert declared == {"0": (TensorProto.FLOAT, ["N", 4]), "coords": (TensorProto.INT64, ["N", 4]),
                        g.outputs[0].name: (TensorProto.FLOAT, [f"{g.outputs[0].name}_rows", 8]),
                        f"{g.outputs[0].name}_coords": (TensorProto.INT64, [f"{g.outputs[0].name}_rows", 4]),
                        g.outputs[1][0]: (TensorProto.FLOAT, [2, 64, 3, 5])}
    assert [v.name for v in imported.graph.input] == ["0", "coords"]
    assert {t.data_type for t in imported.graph.initializer} <= {TensorProto.FLOAT, TensorProto.INT64}
    weights = {t.name: list(t.dims) for t in imported.graph.initializer}
    convs = {n.op_type: n for n in imported.graph.node if n.domain == "sparse"}
    assert weights[convs["SparseConv"].input[2]] == [16, 8, 3, 3, 3]  # [Cout, Cin, *K]
    inverse = convs["SparseDeconv"]
    assert weights[inverse.input[2]] == [16, 8, 3, 3, 3]  # [Cin, Cout, *K]
    attrs = {a.name: helper.get_attribute_value(a) for a in inverse.attribute}
    # the forward conv's geometry, from its output grid (3, 4, 5) back to its input grid (6, 8, 10)
    assert attrs == dict(kernel_shape=[3, 3, 3], spatial_shape=[3, 4, 5], strides=[2, 2, 2], pads=[1] * 6,
                         dilations=[1, 1, 1], output_padding=[1, 1, 1])
    forward_input = convs["SparseConv"].input[1]
    assert inverse.input[4] == forward_input
    reshape = next(n for n in imported.graph.node if n.op_type == "Reshape" and n.input[0].startswith("transpose"))
    assert numpy_helper.to_array(next(t for t in imported.graph.initializer if t.name == reshape.input[1])).tolist() \
        == [2, 64, 3, 5]
    assert not any(a.name == "dims" for n in imported.graph.node for a in n.attribute)
    report = json.loads(metadata(imported)["sparse_lower.import"])
    assert report == {"format": "nvidia", "title": "NVIDIA Lidar_AI_Solution (libspconv)",
                      "float16_to_float32": ["0", g.outputs[0].name, g.outputs[1][0]],
                      "coords": {"coords": {"columns": ["batch", "z", "y", "x"], "extents": [None, 6, 8, 10]}},
                      "notes": report["notes"][:1], "assumed": {"LeakyReLU slope 0.01": [report["assumed"][
                          "LeakyReLU slope 0.01"][0]]}}
    assert "activation='LeakyReLU' does not say its slope" in report["notes"][0]  # the one assumption made


def test_imported_aimet_model_keeps_its_indices_input(rng):
    g = aimet_chain(rng)
    imported = import_model(g.model)
    inputs = {v.name: (v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
              for v in imported.graph.input}
    assert inputs == {"indices": (TensorProto.INT64, ["N", 4]), "features": (TensorProto.FLOAT, ["N", 3])}
    assert "spconv" not in {o.domain for o in imported.opset_import}
    first = imported.graph.node[0]
    assert (first.op_type, first.input[0], first.input[1]) == ("SparseConv", "features", "indices")


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
@pytest.mark.parametrize("target, options", [("gpu", {}), ("nna", {"combine": "gather"}),
                                              ("nna", {"combine": "scatter", "max_active": 400}), ("hybrid", {})])
@pytest.mark.parametrize("fmt", NETWORKS)
def test_imported_model_lowers_and_runs(fmt, target, options, rng):
    g = NETWORKS[fmt](rng)
    lowered = sparse_lower.lower(import_model(g.model), target=target, **options)
    session = sparse_lower.create_session(lowered)
    features, coords = g.random_input(80)
    names = [o.name for o in session.get_outputs()]
    results = dict(zip(names, session.run(names, g.feeds(features, coords))))
    assert_outputs_match(g, None, features, coords, results)


def test_2d_import_lowers_and_runs(rng):
    g = decoder_2d(rng)
    session = sparse_lower.create_session(sparse_lower.lower(import_model(g.model)))
    features, coords = g.random_input(25)
    names = [o.name for o in session.get_outputs()]
    assert_outputs_match(g, None, features, coords, dict(zip(names, session.run(names, g.feeds(features, coords)))))


def test_source_model_is_returned_unchanged(tmp_path):
    builder = sparse_lower.models.SparseModelBuilder(2, 3, np.random.default_rng(0))
    model = builder.conv("SubmanifoldConv", 4, (3, 3), (5, 6)).build()
    assert detect_format(model) == SOURCE_FORMAT
    assert import_model(model) is model
    onnx.save(model, tmp_path / "m.onnx")
    assert import_model(tmp_path / "m.onnx") == model


def test_default_domain_spelled_ai_onnx_is_the_default_domain(tmp_path):
    """A source-op model whose standard ops are in "ai.onnx" (the spelling NVIDIA's tools use) lowers like
    one in "": every node the lowering adds resolves against the model's opset."""
    builder = sparse_lower.models.SparseModelBuilder(2, 3, np.random.default_rng(0))
    model = builder.conv("SubmanifoldConv", 4, (3, 3), (5, 6)).build()
    model.graph.node.append(helper.make_node("Relu", [model.graph.output[0].name], ["relu"], domain="ai.onnx"))
    model.graph.output[0].name = "relu"
    for opset in model.opset_import:
        if opset.domain == "":
            opset.domain = "ai.onnx"
    for target in ("gpu", "nna", "hybrid"):
        lowered = sparse_lower.lower(model, target=target)
        assert "ai.onnx" not in {o.domain for o in lowered.opset_import} | {n.domain for n in lowered.graph.node}
        onnx.checker.check_model(lowered, full_check=True)


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
def test_detect_format(rng, tmp_path):
    assert detect_format(residual_unet(rng).model) == "nvidia"
    path = tmp_path / "aimet.onnx"
    onnx.save(aimet_chain(rng).model, path)
    assert detect_format(path) == "aimet"


def test_cli_convert_imports_foreign_models(rng, tmp_path, capsys):
    path, out = tmp_path / "scn.onnx", tmp_path / "scn.gpu.onnx"
    onnx.save(residual_unet(rng).model, path)
    assert main(["convert", str(path), "-o", str(out), "--verify", "--active", "50"]) == 0
    text = capsys.readouterr().out
    assert "imported NVIDIA Lidar_AI_Solution" in text and "verify: ok" in text
    assert not [n for n in onnx.load(out).graph.node if n.domain in ("sparse", "")
                and n.op_type in ("SparseConvolution", "SubmanifoldConv")]


# -- refusals --------------------------------------------------------------------------------------

def _bad_inverse(**changes):
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "subm", 3, 3, key="s")
    b = g.conv(a, "conv", 4, 3, stride=2, padding=1, key="down")
    c = g.conv(a if changes.get("wrong_input") else b, "inverse", 3, changes.get("kernel", 3),
               key=changes.get("key", "down"), **changes.get("attrs", {}))
    return g.build(c), g.nodes[-1].name


def _one_tap_inverse():
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    down = g.conv(g.x, "conv", 4, 1, stride=2, key="down")
    return g.build(g.conv(down, "inverse", 3, 1, key="down")), g.nodes[-1].name


def _residual_across_grids():
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "subm", 4, 3)
    b = g.conv(a, "conv", 4, 1)  # a 1x1 regular conv: same grid, but its rows are its own (sorted)
    g.add(a, b)
    return g.build(g.x), g.nodes[-1].name


def _reused_rulebook():
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "conv", 4, 3, stride=2, padding=1, key="k")
    b = g.conv(a, "conv", 4, 3, stride=2, padding=1, key="k")
    return g.build(b), g.nodes[-1].name


def _with_node(op_type, domain="", sparse_input=True, extra_input=None, **attrs):
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "subm", 4, 3)
    if op_type == "Transpose":
        attrs["perm"] = [1, 0]
    inputs = [a.name if sparse_input else "0"]
    if extra_input:
        g.initializers.append(numpy_helper.from_array(np.array([1], np.int64), extra_input))
        inputs.append(extra_input)
    g._node(op_type, inputs, ["odd"], domain=domain, **attrs)
    g.outputs = ()
    model = g.build()
    model.graph.output.append(helper.make_tensor_value_info("odd", TensorProto.FLOAT16, None))
    if domain and domain not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(domain, 1))  # imported, yet unknown to us
    return model, g.nodes[-1].name


def _aimet_indices_later():
    """A later conv on (indices, features): AIMET gives indices to the first layer only (a file with them on
    every layer was our own writer's invention, which no real exporter shares)."""
    g = ForeignGraph("aimet", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "conv", 4, 3, stride=2)
    g.inputs.append(helper.make_tensor_value_info("other", TensorProto.INT32, ["N", 4]))
    g._weight("W", np.ones((4, 3, 3, 3, 4)))
    g._weight("B", np.ones(4))
    g._node("SparseConvolution", ["other", a.name, *[t.name for t in g.initializers[-2:]]], ["y"], domain="spconv",
            ndim=3, kernel_size=[3, 3, 3], input_spatial_shape=[3, 3, 4], rulebook="subm1", subm=1)
    return g.build(), g.nodes[-1].name


def _aimet_dense_form():
    """aimet_torch's dense-input form: SparseConvolution(dense NCDHW graph input, W, B), every site active."""
    g = ForeignGraph("aimet", 3, (6, 7, 8), np.random.default_rng(1))
    g.inputs[:] = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, [1, 3, 6, 7, 8])]
    g._weight("W", np.ones((4, 3, 3, 3, 3)))
    g._weight("B", np.ones(4))
    g._node("SparseConvolution", ["dense", *[t.name for t in g.initializers[-2:]]], ["y"], domain="spconv", ndim=3,
            input_spatial_shape=[6, 7, 8], kernel_size=[3, 3, 3], rulebook="subm0")
    return g.build(), g.nodes[-1].name


def _unnamed():
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1), name_nodes=False)
    out = g.conv(g.conv(g.x, "subm", 4, 3), "subm", 4, 3, activation="GELU")
    return g.build(out), "SparseConvolution#1"


def _missing(name):
    model, node = one_conv()
    attrs = model.graph.node[0].attribute
    attrs.remove(next(a for a in attrs if a.name == name))
    return model, node


def _unsorted():
    model, node = one_conv()
    model.graph.node.insert(0, helper.make_node("Relu", [model.graph.node[0].output[0]], ["r"], name="early"))
    return model, "early"


def _per_channel(shape):
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "subm", 4, 3)
    g._weight("c", np.ones(shape))
    g._node("Mul", [a.name, g.initializers[-1].name], ["scaled"])
    return g.build(Handle("scaled", a.grid, 4)), g.nodes[-1].name


def _graph_input_weight():
    model, node = one_conv()
    weight = model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info(weight.name, TensorProto.FLOAT16, list(weight.dims)))
    del model.graph.initializer[0]
    return model, node


REFUSALS = {
    "unnamed node": (_unnamed, "attribute 'activation'='GELU'"),
    "activation": (lambda: one_conv(activation="GELU"), "attribute 'activation'='GELU'"),
    "flag value": (lambda: one_conv(subm=2), "'subm'=2 is not 0 or 1"),
    "subm and transposed": (lambda: one_conv(transposed=1), "subm=1 contradicts transposed"),
    "precision": (lambda: one_conv(precision="int4"), "attribute 'precision'='int4' is not a precision"),
    "dynamic range": (lambda: one_conv(input_dynamic_range=-1.0), "'input_dynamic_range'=-1.0 is not a dynamic"),
    "missing attribute": (lambda: _missing("kernel_size"), "attribute 'kernel_size' missing"),
    "kernel length": (lambda: one_conv(kernel_size=[3, 3]), "'kernel_size' has 2 values but the layer is 3-D"),
    "kernel and weight": (lambda: one_conv(kernel_size=[3, 3, 1]), "kernel_size=[3, 3, 1] contradicts the weight's taps"),
    "weight rank": (lambda: one_conv(weight_shape=(4, 3, 3, 3)), "weight of shape [4, 3, 3, 3] on a 3-D input"),
    "weight channels": (lambda: one_conv(weight_shape=(4, 3, 3, 3, 2)),
                        "its weight [4, 3, 3, 3, 2] takes 2 input channels but its input '0' has 3"),
    "weight not constant": (_graph_input_weight, "is not a constant"),
    "dilated transposed": (lambda: one_conv(kind="deconv", dilation=2), "dilation=[2, 2, 2]"),
    "inverse without forward": (lambda: _bad_inverse(key="nowhere"), "registered rulebook 'nowhere'"),
    "inverse without key": (lambda: _bad_inverse(key=""), "without a rulebook key"),
    "inverse of subm": (lambda: _bad_inverse(key="s"), "spconv inverts only regular sparse convs"),
    "inverse kernel": (lambda: _bad_inverse(kernel=2, attrs=dict(kernel_size=[2, 2, 2])), "kernel_size=[2, 2, 2]"),
    "one-tap inverse": (_one_tap_inverse, "an inverse conv of one tap: spconv runs it as a 1×1 conv"),
    "inverse stride": (lambda: _bad_inverse(attrs=dict(stride=[3, 3, 3])), "stride=[3, 3, 3] contradicts"),
    "inverse input": (lambda: _bad_inverse(wrong_input=True, attrs=dict(input_spatial_shape=[6, 7, 8])),
                      "not on the output coordinates"),
    "reused rulebook": (_reused_rulebook, "rulebook 'k' was built by"),
    "add across coords": (_residual_across_grids, "Add of sparse tensors on different coordinates"),
    "scatter format": (lambda: scatter_model(layout="yxz"), "'format'='yxz'"),
    "scatter shape": (lambda: scatter_model(output_shape=[2, 4, 8, 7, 6]), "output_shape=[2, 4, 8, 7, 6] is neither"),
    "scatter grid": (lambda: scatter_model(input_spatial_shape=[6, 7, 9]), "input_spatial_shape=[6, 7, 9] contradicts"),
    "scatter layout": (lambda: scatter_model(output_layout="NC4HW"), "'output_layout'='NC4HW' is not understood"),
    "unknown standard op": (lambda: _with_node("Frobnicate"), "unknown op 'Frobnicate'"),
    "non-standard attribute": (lambda: _with_node("Relu", sparse_input=False, **{"alpha": 2}), "Relu has no attribute"),
    "reshape dims and shape": (lambda: _with_node("Reshape", sparse_input=False, extra_input="shape", dims=[1]),
                               "both a shape input and a 'dims'"),
    "not per-channel": (lambda: _per_channel((5, 4)), "is not per-channel"),
    "unsorted graph": (_unsorted, "before any node produces it"),
    "unknown domain op": (lambda: _with_node("Voxelize", domain="lidar"), "unknown op 'lidar::Voxelize'"),
    "non-element-wise op": (lambda: _with_node("Transpose"), "Transpose cannot take the sparse features"),
    "aimet indices on a later layer": (_aimet_indices_later, "AIMET writes (indices, features, W, B) only on the layer"),
    "aimet dense form": (_aimet_dense_form, "AIMET's dense-input form"),
    "aimet subm contradiction": (lambda: one_conv("aimet", rulebook="subm0"), "subm=1 contradicts rulebook='subm0'"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusal_names_the_node_and_the_fix(case):
    build, fragment = REFUSALS[case]
    model, node = build()
    with pytest.raises(SparseLowerError) as raised:
        import_model(model)
    assert fragment in raised.value.reason
    assert raised.value.node == node
    assert raised.value.fix


def test_mixed_formats_are_refused(rng):
    model = residual_unet(rng).model
    model.graph.node.append(helper.make_node("SparseConvolution", ["a", "b", "c"], ["d"], domain="spconv"))
    with pytest.raises(SparseLowerError, match="mixes"):
        import_model(model)


# -- round trip through the wild-format writers of sparse_lower.models --------------------------------

def _small_2d(emitter):
    """A 2D network through the Emitter protocol: subm, strided conv, transposed conv, dense (format "yx")."""
    rng = np.random.default_rng(3)
    x = emitter.input(3, (9, 11), 2)
    x = emitter.conv(x, "subm", rng.standard_normal((6, 3, 3, 3)).astype(np.float32), None, indice_key="s",
                     activation="LeakyReLU")
    x = emitter.conv(x, "conv", rng.standard_normal((8, 2, 3, 6)).astype(np.float32),
                     rng.standard_normal(8).astype(np.float32), stride=2, padding=(0, 1), activation="Sigmoid")
    x = emitter.conv(x, "deconv", rng.standard_normal((4, 3, 3, 8)).astype(np.float32), None, stride=2,
                     padding=1, output_padding=1, activation="ReLU")
    dense = emitter.dense(x)
    return emitter.finish([x, emitter.reshape(dense, (dense.shape[0], int(np.prod(dense.shape[1:]))))])


ROUND_TRIP = {
    "centerpoint": (lambda e: sparse_lower.models.sp_middle_resnet_fhd(e, np.random.default_rng(0),
                                                                       spatial_shape=(41, 24, 24)), (41, 24, 24), 1),
    "unet": (lambda e: sparse_lower.models.sparse_unet(e, np.random.default_rng(0), spatial_shape=(21, 20, 20),
                                                       levels=2), (21, 20, 20), 1),
    "patent_2d": (lambda e: sparse_lower.models.patent_2d_stack(e, np.random.default_rng(0), in_channels=4,
                                                                channels=(8, 6), spatial_shape=(12, 14),
                                                                dense_io=False, bias=True), (12, 14), 1),
    "small_2d": (_small_2d, (9, 11), 2),
}


def _float16_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The canonical model with its weights rounded through float16, as the NVIDIA writer stores them."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(tensor).astype(np.float16).astype(np.float32)
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, tensor.name))
    return model


WRITERS = {  # AIMET's export is 3D only and has no transposed or inverse conv
    "NvidiaEmitter": ROUND_TRIP,
    "NvidiaEmitter-xyz": ROUND_TRIP,
    "AimetEmitter": {"centerpoint": ROUND_TRIP["centerpoint"]},
}


@pytest.mark.filterwarnings("ignore::sparse_lower.errors.SparseLowerWarning")
@pytest.mark.parametrize("emitter, network", [(e, n) for e, networks in WRITERS.items() for n in networks])
def test_round_trip_through_the_format_writers(network, emitter):
    """Written by NvidiaEmitter (both coordinate orders) / AimetEmitter, imported, then run by the reference:
    the outputs of the canonical emitter's source-op model of the same network, in the same order."""
    build, grid, batch = ROUND_TRIP[network]
    canonical = build(sparse_lower.models.CanonicalEmitter())
    if emitter.startswith("NvidiaEmitter"):
        canonical = _float16_weights(canonical)
    writer = getattr(sparse_lower.models, emitter.split("-")[0])
    written = build(writer(coords_order="xyz") if emitter.endswith("xyz") else writer())
    imported = import_model(written)
    onnx.checker.check_model(imported)
    rng = np.random.default_rng(1)
    volume = int(np.prod(grid))
    sites = rng.choice(batch * volume, size=min(300, batch * volume // 2), replace=False)
    coords = np.column_stack([sites // volume, *np.unravel_index(sites % volume, grid)]).astype(np.int64)
    channels = canonical.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    features = rng.standard_normal((len(coords), channels)).astype(np.float16).astype(np.float32)
    want = reference.run(canonical, {"features": features, "coords": coords})
    order = [0, *range(len(grid), 0, -1)] if emitter.endswith("xyz") else list(range(1 + len(grid)))
    inputs = [v.name for v in imported.graph.input]
    feeds = {"0": features, "coords": coords[:, order]} if inputs == ["0", "coords"] else \
        {"features": features, "indices": coords}
    got = reference.run(imported, feeds)
    assert [o.name for o in imported.graph.output] == list(got)

    def split(results):  # the outputs in the source's order, and the coords of its sparse ones
        return ([v for k, v in results.items() if not k.endswith("_coords")],
                [v for k, v in results.items() if k.endswith("_coords")])
    (have, have_coords), (value, value_coords) = split(got), split(want)
    assert len(have) == len(value) and len(have_coords) == len(value_coords)
    for out, expected in zip(have, value):
        scale = max(float(np.abs(expected).max(initial=0)), 1.0)
        if expected.ndim == 2 and value_coords:  # sparse features: rows keyed by their coords
            out = as_dict(out, have_coords.pop(0)[:, order])
            expected = as_dict(expected, value_coords.pop(0))
            assert out.keys() == expected.keys()
            out, expected = np.array([out[k] for k in sorted(out)]), np.array([expected[k] for k in sorted(out)])
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * scale)
