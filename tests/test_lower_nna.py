"""The nna and hybrid targets (docs/lowered_forms.md) run in onnxruntime against the dense oracle and the
NumPy reference: every combine method, with and without a fixed capacity, one Conv per tap or fused,
the image and the rows layout;
multi-layer chains; the patent's worked examples; capacity and size refusals."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from conftest import DATA
from helpers import chain_model, session
from oracle import (IR_VERSION, OPSET_IMPORTS, assert_matches_oracle, densify, random_conv_config,
                    random_sparse, sparse_node_model)
from sparse_lower import reference
from sparse_lower.capacity import level_rows, pair_rows
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import SparseModelBuilder, centerpoint_head_stack

COMBINES = ("gather", "scatter", "matmul", "pairs", "unfold")
ONE_PRODUCT_PER_TAP = ("gather", "scatter", "matmul", "pairs")  # unfold: one per layer
FRAME_FILES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")


@pytest.mark.parametrize("capacity", [False, True])
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("seed", range(120))
def test_random_config_matches_dense_oracle(seed, combine, capacity):
    rng = np.random.default_rng(seed)
    config = random_conv_config(rng)
    model, (W, B) = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, config.target_coords is not None, rng)
    expected = reference.run(model, config.feeds)
    max_active = None
    if capacity:  # room for the input and output rows, plus slack that stays padding
        max_active = max(len(config.coords), len(expected["out_coords"]), 1) + int(rng.integers(0, 5))
    taps = int(np.prod(config.attrs["kernel_shape"]))
    try:
        lowered = sparse_lower.lower(model, target="nna", combine=combine, max_active=max_active,
                                     fuse_taps=bool(seed % 2) and combine not in ("pairs", "unfold"),
                                     layout="rows" if seed % 4 >= 2 else "image",
                                     check_each_pass=True)
    except sparse_lower.SparseLowerError as error:
        # the matmul combine's scatter matrices [K, max_active, max_active (+ a zero column)] over 1 GiB are
        # refused when lowered, as the library would refuse to build them
        assert combine == "matmul" and taps * max_active * (max_active + 1) * 4 > 2 ** 30, error
        return
    assert not (combine == "matmul" and max_active and taps * max_active ** 2 * 4 > 2 ** 30)
    out_features, out_coords = session(lowered).run(["out_features", "out_coords"], config.feeds)
    assert_matches_oracle(config, W, B, out_features, out_coords)
    np.testing.assert_allclose(out_features, expected["out_features"], rtol=1e-4, atol=1e-5)


def test_the_compute_is_standard_ops_with_static_shapes_under_a_capacity():
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    for combine in COMBINES:
        lowered = onnx.shape_inference.infer_shapes(sparse_lower.lower(model, target="nna", combine=combine,
                                                                       max_active=2000))
        values = {v.name: v for v in (*lowered.graph.value_info, *lowered.graph.output)}
        convs = [n for n in lowered.graph.node if n.op_type == "Conv"]
        assert len(convs) == 3 * (27 if combine in ONE_PRODUCT_PER_TAP else 1), "one 1x1 Conv per tap (or layer)"
        for node in convs:
            assert node.domain == "" and list(node.attribute[0].ints) == [1, 1]
            for name in (*node.input[:1], *node.output):
                dims = values[name].type.tensor_type.shape.dim
                assert all(d.HasField("dim_value") for d in dims), (combine, name)
                assert dims[0].dim_value == 1 and dims[2].dim_value == 1  # the [1, C, 1, N] layout
        assert not [n for n in lowered.graph.node if n.op_type == "IndexedUnfold"]


@pytest.mark.parametrize("combine", COMBINES)
def test_the_rows_layout_computes_on_two_dimensional_tensors(combine):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    lowered = onnx.shape_inference.infer_shapes(sparse_lower.lower(model, target="nna", combine=combine,
                                                                   max_active=2000, layout="rows"))
    parts = sparse_lower.partition(lowered)
    nna = [name for name, device in parts.assignment.items() if device == "nna"]
    values = {v.name: v for v in (*lowered.graph.value_info, *lowered.graph.output, *lowered.graph.input)}
    nodes = {n.name: n for n in lowered.graph.node}
    per_layer = 27 * (2 if combine == "matmul" else 1) if combine in ONE_PRODUCT_PER_TAP else 1
    assert Counter(nodes[name].op_type for name in nna)["MatMul"] == 3 * per_layer
    # no image, and no transpose of features (the pairs combine transposes its int64 tables on the host)
    assert not [n for n in lowered.graph.node if n.op_type == "Conv" or (n.op_type == "Transpose" and n.name in nna)]
    for name in nna:
        for tensor in (*nodes[name].input, *nodes[name].output):
            if tensor in values:  # the scatter matrices [K, M, N] are the only 3-D tensor
                dims = values[tensor].type.tensor_type.shape.dim
                assert len(dims) <= (3 if tensor.endswith("/S") else 2), (name, tensor)
                assert all(d.HasField("dim_value") for d in dims), (name, tensor)
        if nodes[name].op_type in ("Gather", "ScatterElements"):
            assert nodes[name].attribute[0].i == 0, "sites on axis 0"


@pytest.mark.parametrize("layout", ["image", "rows"])
@pytest.mark.parametrize("target", ["nna", "hybrid"])
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("max_active", [None, 2000])
def test_multi_layer_stack_matches_the_reference(target, combine, max_active, layout, rng):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=800)
    feeds = {"features": features, "coords": coords}
    lowered = sparse_lower.lower(model, target=target, combine=combine, max_active=max_active, layout=layout,
                                 check_each_pass=True)
    got = dict(zip(["f", "c"], session(lowered, threads=2).run(None, feeds)))
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(got["c"], expected["sparseconv4.coords"])
    np.testing.assert_allclose(got["f"], expected["sparseconv4.features"], rtol=1e-4, atol=1e-5)
    ops = Counter(n.op_type for n in lowered.graph.node)
    if target == "hybrid":
        per_tap = "Conv" if layout == "image" else "MatMul"
        products = ops[per_tap] - (2 * 27 if combine == "matmul" and per_tap == "MatMul" else 0)
        per_layer = 27 if combine in ONE_PRODUCT_PER_TAP else 1
        assert ops["IndexedConv"] == 1 and products == 2 * per_layer, "first layer on the gpu path, the rest nna"
    if max_active:  # padded rows flow through the ReLUs: only the model output is sliced back
        nna_layers = 2 if target == "hybrid" else 3
        listed = re.compile(r"/tap\d+/tap_sources|/bound")  # the pairs combine's int64 lists, cut per tap
        slices = sum(n.op_type == "Slice" and not listed.search(n.output[0]) for n in lowered.graph.node)
        assert slices == 1 + (nna_layers if combine == "scatter" else 0)  # + each scatter's dump column


@pytest.mark.parametrize("target", ["nna", "hybrid"])
def test_dense_boundaries(target, rng):
    model = chain_model()
    X = densify(*random_sparse(rng, 2, 2, (6, 8), density=0.3), 2, (6, 8))
    expected = reference.run(model, {"X": X})["Y"]
    for max_active in (None, 64):
        lowered = sparse_lower.lower(model, target=target, max_active=max_active)
        (y,) = session(lowered).run(None, {"X": X})
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
        ops = Counter((n.op_type, *(a.s for a in n.attribute if a.name == "mode")) for n in lowered.graph.node)
        assert ops["ActiveSites",] == 1 and ops["IndexedFold", b"dense"] == 1, "the boundaries stay on the custom ops"


@pytest.mark.parametrize("combine", COMBINES)
def test_results_do_not_depend_on_the_thread_count(combine, rng):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=1500)
    feeds = {"features": features, "coords": coords}
    lowered = sparse_lower.lower(model, target="nna", combine=combine)
    runs = [session(lowered, threads).run(None, feeds) for threads in (1, 2, 8)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def patent_example_model(combine):
    """The patent's worked example: three active sites p1 (1, 1), p2 (1, 2), p3 (2, 2) of a 2D image,
    one channel, a 3×3 submanifold conv with weights w1..w9 in row-major tap order."""
    W = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    node = helper.make_node("SubmanifoldConv", ["p", "coords", "W"], ["q", "q_coords"], name="patent",
                            domain="sparse", kernel_shape=[3, 3], spatial_shape=[4, 4])
    graph = helper.make_graph([node], "patent", [helper.make_tensor_value_info("p", TensorProto.FLOAT, [3, 1]),
                                                 helper.make_tensor_value_info("coords", TensorProto.INT64, [3, 3])],
                              [helper.make_tensor_value_info("q", TensorProto.FLOAT, [3, 1]),
                               helper.make_tensor_value_info("q_coords", TensorProto.INT64, [3, 3])],
                              [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)
    return sparse_lower.lower(model, target="nna", combine=combine, max_active=3)


@pytest.mark.parametrize("combine", COMBINES)
def test_patent_three_site_example(combine):
    p = np.array([[2.0], [3.0], [5.0]], np.float32)
    coords = np.array([[0, 1, 1], [0, 1, 2], [0, 2, 2]], np.int64)
    w = dict(enumerate(range(1, 10), start=1))  # w1..w9
    # Each output is the sum of the partial outputs (one 1x1 conv per tap) that reach it:
    q1 = w[5] * p[0] + w[6] * p[1] + w[9] * p[2]  # p2 is q1's right neighbour, p3 its lower right
    q2 = w[4] * p[0] + w[5] * p[1] + w[8] * p[2]
    q3 = w[1] * p[0] + w[2] * p[1] + w[5] * p[2]
    lowered = patent_example_model(combine)
    assert Counter(n.op_type for n in lowered.graph.node)["Conv"] == (9 if combine in ONE_PRODUCT_PER_TAP else 1)
    q, q_coords = session(lowered).run(None, {"p": p, "coords": coords})
    np.testing.assert_array_equal(q_coords, coords)
    np.testing.assert_allclose(q, np.stack([q1, q2, q3]), rtol=1e-6)


def test_patent_scatter_matrices_of_the_example():
    lowered = patent_example_model("matmul")
    matrices = next(n.output[0] for n in lowered.graph.node if n.op_type == "ScatterMatrices")
    lowered.graph.output.append(helper.make_tensor_value_info(matrices, TensorProto.FLOAT, [9, 3, 3]))
    coords = np.array([[0, 1, 1], [0, 1, 2], [0, 2, 2]], np.int64)
    S = session(lowered).run([matrices], {"p": np.ones((3, 1), np.float32), "coords": coords})[0]
    expected = np.zeros((9, 3, 3), np.float32)
    for tap, output, source in [(4, 0, 0), (4, 1, 1), (4, 2, 2),  # the centre tap: the identity
                                (5, 0, 1), (8, 0, 2), (3, 1, 0), (7, 1, 2), (0, 2, 0), (1, 2, 1)]:
        expected[tap, output, source] = 1
    np.testing.assert_array_equal(S, expected)


def test_patent_graph_shape_128_to_256_on_1000_sites():
    builder = SparseModelBuilder(2, 128, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 256, (3, 3), (100, 100), bias=False)
    lowered = onnx.shape_inference.infer_shapes(
        sparse_lower.lower(builder.build(), target="nna", combine="matmul", max_active=1000))
    values = {v.name: v for v in lowered.graph.value_info}
    initializers = {t.name: t for t in lowered.graph.initializer}

    def shape(name):
        return [d.dim_value for d in values[name].type.tensor_type.shape.dim]

    convs = [n for n in lowered.graph.node if n.op_type == "Conv"]
    assert len(convs) == 9
    assert {tuple(initializers[n.input[1]].dims) for n in convs} == {(256, 128, 1, 1)}
    assert {tuple(shape(n.input[0])) for n in convs} == {(1, 128, 1, 1000)}
    assert {tuple(shape(n.output[0])) for n in convs} == {(1, 256, 1, 1000)}
    (scatter_matrices,) = [n for n in lowered.graph.node if n.op_type == "ScatterMatrices"]
    assert shape(scatter_matrices.output[0]) == [9, 1000, 1000]
    products = [n for n in lowered.graph.node if n.op_type == "MatMul"]
    assert len(products) == 9 and {tuple(shape(n.input[1])) for n in products} == {(1000, 1000)}


def test_more_active_rows_than_max_active_is_a_clear_error(rng):
    model, _ = sparse_node_model("SubmanifoldConv", {"kernel_shape": [3, 3], "spatial_shape": [8, 8]}, 2, 3, 2,
                                 True, False, rng)
    features, coords = random_sparse(rng, 1, 2, (8, 8), count=30)
    lowered = sparse_lower.lower(model, target="nna", max_active=20)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument) as info:
        session(lowered).run(None, {"features": features, "coords": coords})
    assert "x has 30 rows, more than the capacity 20 (max_active); raise max_active to at least 30" in str(info.value)


def _down_and_back(rng, grid=(8, 24, 24)):
    """Level 0: a SubM; level 1: a strided conv and a SubM on its sites; back to level 0: the inverse conv
    onto the input coords, then a SubM."""
    coarse = [(s - 1) // 2 + 1 for s in grid]
    padding = [(s + 2 - 2 - 1) % 2 for s in grid]
    return (SparseModelBuilder(3, 4, rng)
            .conv("SubmanifoldConv", 8, (3, 3, 3), grid).relu()
            .conv("SparseConv", 16, (3, 3, 3), grid, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
            .conv("SubmanifoldConv", 16, (3, 3, 3), coarse).relu()
            .conv("SparseDeconv", 8, (3, 3, 3), coarse, target_coords="coords", strides=[2, 2, 2],
                  pads=[1, 1, 1, 1, 1, 1], output_padding=padding)
            .conv("SubmanifoldConv", 4, (3, 3, 3), grid).build())


@pytest.mark.parametrize("layout", ["image", "rows"])
@pytest.mark.parametrize("combine", COMBINES)
def test_a_capacity_per_level(combine, layout, rng):
    """max_active=(level 0, level 1): the strided conv's outputs and the SubM on them get level 1's
    capacity, the inverse conv returns to level 0's; the numbers are the reference's."""
    model = _down_and_back(rng)
    features, coords = random_sparse(rng, 2, 4, (8, 24, 24), count=400)
    feeds = {"features": features, "coords": coords}
    down = (SparseModelBuilder(3, 4, np.random.default_rng(0)).conv("SubmanifoldConv", 8, (3, 3, 3), (8, 24, 24))
            .conv("SparseConv", 16, (3, 3, 3), (8, 24, 24), strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]).build())
    coarse_rows = len(reference.run(down, feeds)["sparseconv1.coords"])
    capacities = (450, coarse_rows + 7)
    lowered = sparse_lower.lower(model, target="nna", combine=combine, layout=layout, max_active=list(capacities),
                                 check_each_pass=True)
    got = dict(zip(["f", "c"], session(lowered, threads=2).run(None, feeds)))
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(got["c"], coords)
    np.testing.assert_allclose(got["f"], expected["submanifoldconv6.features"], rtol=1e-4, atol=1e-5)
    inferred = onnx.shape_inference.infer_shapes(lowered)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    sites = {layer: {dim for name, dims in shapes.items() if name.startswith(f"{layer}/tap") for dim in dims}
             for layer in ("submanifoldconv0", "submanifoldconv3", "sparsedeconv5")}
    assert capacities[1] in sites["submanifoldconv3"] and capacities[0] not in sites["submanifoldconv3"]
    assert capacities[0] in sites["submanifoldconv0"] and capacities[1] not in sites["submanifoldconv0"]
    assert {capacities[0], capacities[0] + 1} & sites["sparsedeconv5"], "its outputs are back on level 0 (+ a dump column)"


def test_level_rows_measures_every_level(rng):
    model = _down_and_back(rng)
    frames = [dict(zip(("features", "coords"), random_sparse(rng, 2, 4, (8, 24, 24), count=count))) for count in (400, 300)]
    down = (SparseModelBuilder(3, 4, rng).conv("SubmanifoldConv", 8, (3, 3, 3), (8, 24, 24))
            .conv("SparseConv", 16, (3, 3, 3), (8, 24, 24), strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]).build())
    coarse = max(len(reference.run(down, feeds)["sparseconv1.coords"]) for feeds in frames)
    assert level_rows(model, frames) == [400, coarse]
    lowered = sparse_lower.lower(model, target="nna", max_active=level_rows(model, frames))
    for feeds in frames:  # the measured capacities hold the frames they were measured on
        session(lowered).run(None, feeds)


def test_a_level_over_its_capacity_is_a_clear_error(rng):
    model = _down_and_back(rng)
    features, coords = random_sparse(rng, 2, 4, (8, 24, 24), count=400)
    lowered = sparse_lower.lower(model, target="nna", max_active=[400, 10])
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=r"more than the capacity 10 "):
        session(lowered).run(None, {"features": features, "coords": coords})


@pytest.mark.parametrize("value", [[], [100, 0], "100", [100.0], True, 0])
def test_max_active_is_checked(value):
    with pytest.raises(sparse_lower.SparseLowerError, match="is neither a positive int nor a sequence of them"):
        sparse_lower.lower(centerpoint_head_stack(), target="nna", max_active=value)


def test_scatter_matrices_above_the_size_limit_are_refused(rng):
    model, _ = sparse_node_model("SubmanifoldConv", {"kernel_shape": [3, 3, 3], "spatial_shape": [40, 40, 40]},
                                 1, 1, 3, False, False, rng)
    features, coords = random_sparse(rng, 1, 1, (40, 40, 40), count=4000)
    lowered = sparse_lower.lower(model, target="nna", combine="matmul")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument) as info:
        session(lowered).run(None, {"features": features, "coords": coords})
    assert "ScatterMatrices" in str(info.value) and 'combine="gather"' in str(info.value)


# ----------------------------------------------------------------------------------------------------
# The pairs combine: each tap multiplies only the rows it pairs, as many as max_pairs holds

def _product_rows(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Per layer, the rows each tap's product multiplies, read from the shapes of the lowered graph."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    rows = {}
    for node in model.graph.node:
        if node.op_type == "MatMul":
            rows.setdefault(node.name.split("/")[0], []).append(shapes[node.input[0]][0])
    return rows


@pytest.mark.parametrize("layout", ["image", "rows"])
def test_pairs_multiply_only_the_measured_pairs(layout, rng):
    """Under max_pairs = pair_rows(model, frames), each tap of each layer multiplies its pairs and the
    zero row: the reference's pair count + 1 rows; the numbers are the reference's on every frame."""
    model = _down_and_back(rng)
    frames = [dict(zip(("features", "coords"), random_sparse(rng, 2, 4, (8, 24, 24), count=count))) for count in (400, 300)]
    levels, pairs = level_rows(model, frames), pair_rows(model, frames)
    lowered = sparse_lower.lower(model, target="nna", combine="pairs", layout="rows", max_active=levels,
                                 max_pairs=pairs, check_each_pass=True)
    assert {layer: [n - 1 for n in rows] for layer, rows in _product_rows(lowered).items()} == pairs
    convs = {n.name: n for n in model.graph.node if n.domain == "sparse"}
    for feeds in frames:
        expected = reference.run(model, feeds)
        got = session(lowered, threads=2).run(None, feeds)
        np.testing.assert_allclose(got[0], expected["submanifoldconv6.features"], rtol=1e-4, atol=1e-5)
    first = reference.conv_pairs(convs["submanifoldconv0"], frames[0]["coords"])[0]
    assert [max(len(rows), len(other)) for (_, rows, _), (_, other, _) in
            zip(first, reference.conv_pairs(convs["submanifoldconv0"], frames[1]["coords"])[0])] == pairs["submanifoldconv0"]
    useful = sum(len(rows) for _, rows, _ in first)
    assert useful < 0.5 * 27 * len(frames[0]["coords"]), "most taps pair a fraction of the rows"
    if layout == "image":
        image = sparse_lower.lower(model, target="nna", combine="pairs", max_active=levels, max_pairs=pairs)
        np.testing.assert_allclose(session(image).run(None, frames[0])[0], session(lowered).run(None, frames[0])[0],
                                   rtol=1e-5, atol=1e-6)


def test_a_tap_over_its_max_pairs_is_a_clear_error(rng):
    model = _down_and_back(rng)
    feeds = dict(zip(("features", "coords"), random_sparse(rng, 2, 4, (8, 24, 24), count=400)))
    pairs = pair_rows(model, [feeds])
    counts = pairs["submanifoldconv3"]
    pairs["submanifoldconv3"] = [max(n - 1, 0) for n in counts]  # one pair short on every tap that has any
    tap = next(k for k, n in enumerate(counts) if n)  # the first tap over its capacity is reported
    lowered = sparse_lower.lower(model, target="nna", combine="pairs", max_active=level_rows(model, [feeds]),
                                 max_pairs=pairs)
    message = (rf"tap {tap} has {counts[tap]} pairs, more than the capacity {counts[tap] - 1} "
               rf"\(max_pairs\['submanifoldconv3'\]\[{tap}\]\); raise max_pairs\['submanifoldconv3'\]\[{tap}\] to at least "
               rf"{counts[tap]}")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=message):
        session(lowered).run(None, feeds)


def test_without_max_pairs_a_layer_holds_all_its_rows_per_tap(rng):
    """max_active alone: every tap of every layer holds min(input rows, output rows) pairs, never too few."""
    model = _down_and_back(rng)
    feeds = dict(zip(("features", "coords"), random_sparse(rng, 2, 4, (8, 24, 24), count=400)))
    capacities = level_rows(model, [feeds])
    lowered = sparse_lower.lower(model, target="nna", combine="pairs", max_active=capacities, layout="rows")
    rows = _product_rows(lowered)
    assert set(rows["submanifoldconv0"]) == {capacities[0] + 1}
    assert set(rows["sparseconv2"]) == {min(capacities) + 1}
    np.testing.assert_allclose(session(lowered).run(None, feeds)[0],
                               reference.run(model, feeds)["submanifoldconv6.features"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"combine": "gather", "max_active": 500, "max_pairs": {}}, "max_pairs sizes the pairs combine's"),
    ({"combine": "pairs", "max_pairs": {}}, "max_pairs sizes the pairs combine's"),
    ({"combine": "pairs", "max_active": 500, "max_pairs": [1, 2]}, "max_pairs is a list, not a mapping"),
    ({"combine": "pairs", "max_active": 500, "max_pairs": {"conv9": [1] * 27}}, "names 'conv9', which is not a sparse"),
    ({"combine": "pairs", "max_active": 500, "max_pairs": {"submanifoldconv0": [1] * 26}}, "is not 27 counts >= 0"),
    ({"combine": "pairs", "max_active": 500, "max_pairs": {"submanifoldconv0": [-1] * 27}}, "is not 27 counts >= 0"),
    ({"combine": "pairs", "max_active": 500, "max_pairs": {"submanifoldconv0": [1.5] * 27}}, "is not 27 counts >= 0"),
    ({"combine": "pairs", "fuse_taps": True}, "fuse_taps multiplies every row by all taps"),
])
def test_pair_options_are_checked(options, message):
    with pytest.raises(sparse_lower.SparseLowerError, match=message):
        sparse_lower.lower(centerpoint_head_stack(), target="nna", **options)


@pytest.mark.skipif(not all((DATA / name).exists() for name in FRAME_FILES), reason="shared data absent")
def test_pairs_on_the_real_frames_give_the_per_level_numbers():
    """The CenterPoint head on both nuScenes frames, static shapes from the frames: the pairs combine gives
    the per-level gather form's outputs, multiplying under half its rows."""
    frames = []
    for name in FRAME_FILES:
        features, coords, grid = load_voxels(DATA / name)
        frames.append({"features": features, "coords": coords})
    model = centerpoint_head_stack(spatial_shape=grid)
    levels, pairs = level_rows(model, frames), pair_rows(model, frames)
    per_level = session(sparse_lower.lower(model, target="nna", max_active=levels, layout="rows"), threads=2)
    lowered = sparse_lower.lower(model, target="nna", combine="pairs", max_active=levels, max_pairs=pairs, layout="rows")
    product_rows = sum(sum(rows) for rows in _product_rows(lowered).values())
    assert product_rows < 0.5 * 27 * (2 * levels[0] + levels[0])  # two SubMs and the strided conv read level 0
    paired = session(lowered, threads=2)
    for feeds in frames:
        for got, want in zip(paired.run(None, feeds), per_level.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
