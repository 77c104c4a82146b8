"""The gpu lowering run in onnxruntime with the custom-op library, against the dense oracle
(docs/source_ops.md) and the NumPy reference, on random single-node models, chains with dense boundaries,
shared index tables and real LiDAR data."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from conftest import DATA
from helpers import chain_model, run_lowered, session
from oracle import (IR_VERSION, OPSET_IMPORTS, assert_matches_oracle, densify, random_conv_config,
                    random_sparse, sparse_node_model)
from sparse_lower import reference
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import SparseModelBuilder, centerpoint_head_stack


@pytest.mark.parametrize("strategy", ["unfold", "rulebook", "fused"])
@pytest.mark.parametrize("seed", range(300))
def test_random_config_matches_dense_oracle(seed, strategy):
    rng = np.random.default_rng(seed)
    config = random_conv_config(rng)
    model, (W, B) = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, config.target_coords is not None, rng)
    outputs = run_lowered(model, config.feeds, strategy=strategy)
    assert_matches_oracle(config, W, B, outputs["out_features"], outputs["out_coords"])
    expected = reference.run(model, config.feeds)
    np.testing.assert_array_equal(outputs["out_coords"], expected["out_coords"])
    np.testing.assert_allclose(outputs["out_features"], expected["out_features"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["unfold", "rulebook", "fused"])
def test_results_do_not_depend_on_the_thread_count(strategy):
    rng = np.random.default_rng(7)
    builder = SparseModelBuilder(3, 8, rng)
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), (20, 40, 40)).relu()
    builder.conv("SparseConv", 16, (3, 3, 3), (20, 40, 40), strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    builder.conv("SparseDeconv", 8, (2, 2, 2), (10, 20, 20), strides=[2, 2, 2])
    model = builder.build()
    features, coords = random_sparse(rng, 2, 8, (20, 40, 40), count=3000)
    feeds = {"features": features, "coords": coords}
    runs = [run_lowered(model, feeds, threads=t, strategy=strategy) for t in (1, 2, 8)]
    for other in runs[1:]:
        for name, value in runs[0].items():
            np.testing.assert_array_equal(other[name], value)


@pytest.mark.parametrize("strategy", ["unfold", "rulebook", "fused"])
def test_dense_boundaries_and_shared_tables(rng, strategy):
    model = chain_model()
    X = densify(*random_sparse(rng, 2, 2, (6, 8), density=0.3), 2, (6, 8))
    outputs = run_lowered(model, {"X": X}, strategy=strategy)
    np.testing.assert_allclose(outputs["Y"], reference.run(model, {"X": X})["Y"], rtol=1e-5, atol=1e-5)

    lowered = sparse_lower.lower(model, strategy=strategy)
    ops = [n.op_type for n in lowered.graph.node]
    assert not [n for n in lowered.graph.node if n.domain == "sparse"]
    # The first SubM unfolds from the dense input (its table holds dense sites); the next two share one.
    assert ops.count("SubmanifoldMap") == 2, "the two SubM layers on feature rows share one table"
    first_unfold = next(n for n in lowered.graph.node if n.op_type == "IndexedUnfold")
    assert first_unfold.input[0] == "X", "the first conv unfolds straight from the dense input"
    fold = next(n for n in lowered.graph.node if n.output[0] == "Y")
    assert fold.op_type == "IndexedFold", "the last conv's rows are folded straight into the dense output"


def test_to_sparse_and_to_dense_alone(rng):
    X = densify(*random_sparse(rng, 3, 4, (5, 6, 7), density=0.2), 3, (5, 6, 7))
    nodes = [helper.make_node("ToSparse", ["X"], ["features", "coords"], name="in", domain="sparse"),
             helper.make_node("ToDense", ["features", "coords"], ["Y"], name="out", domain="sparse",
                              spatial_shape=[5, 6, 7], batch_size=3)]
    graph = helper.make_graph(nodes, "boundary", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4, 5, 6, 7])],
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 4]),
                               helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 4]),
                               helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4, 5, 6, 7])])
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)
    outputs = run_lowered(model, {"X": X})
    expected = reference.run(model, {"X": X})
    for name in ("features", "coords", "Y"):
        np.testing.assert_array_equal(outputs[name], expected[name])


def test_inverse_deconv_restores_the_forward_coords(rng):
    S = (9, 10, 11)
    builder = SparseModelBuilder(3, 4, rng)
    builder.conv("SparseConv", 8, (3, 3, 3), S, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    down = builder.build()
    output_padding = [(s + 2 - 2 - 1) % 2 for s in S]
    node = helper.make_node("SparseDeconv", ["sparseconv0.features", "sparseconv0.coords", "Wup", "", "coords"],
                            ["up", "up_coords"], name="inverse", domain="sparse", kernel_shape=[3, 3, 3],
                            strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1], output_padding=output_padding,
                            spatial_shape=[5, 5, 6])
    down.graph.node.append(node)
    down.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3, 3)).astype(np.float32), "Wup"))
    del down.graph.output[:]
    down.graph.output.extend([helper.make_tensor_value_info("up", TensorProto.FLOAT, ["N", 4]),
                              helper.make_tensor_value_info("up_coords", TensorProto.INT64, ["N", 4])])
    features, coords = random_sparse(rng, 2, 4, S, count=200)
    feeds = {"features": features, "coords": coords}
    outputs = run_lowered(down, feeds)
    expected = reference.run(down, feeds)
    np.testing.assert_array_equal(outputs["up_coords"], coords)
    np.testing.assert_allclose(outputs["up"], expected["up"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["rulebook", "fused", "unfold"])
def test_deconv_onto_its_own_coords_is_not_a_submanifold_conv(rng, strategy):
    """Targets that are the input coords tensor itself, stride 1, no pads: the centre tap reads row
    o + 1, not row o, so only a SubmanifoldConv may take its centre tap as a plain MatMul."""
    S = (6, 7, 8)
    node = helper.make_node("SparseDeconv", ["features", "coords", "W", "", "coords"], ["out", "out_coords"],
                            domain="sparse", kernel_shape=[3, 3, 3], spatial_shape=list(S))
    graph = helper.make_graph(
        [node], "deconv_onto_itself",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("out_coords", TensorProto.INT64, ["N", 4])],
        [numpy_helper.from_array(rng.standard_normal((4, 5, 3, 3, 3)).astype(np.float32), "W")])
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)
    features, coords = random_sparse(rng, 2, 4, S, density=0.4)
    feeds = {"features": features, "coords": coords}
    outputs = run_lowered(model, feeds, strategy=strategy)
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(outputs["out_coords"], coords)
    np.testing.assert_allclose(outputs["out"], expected["out"], rtol=1e-4, atol=1e-5)


def test_float16_features_are_computed_in_float32(rng):
    model, _ = sparse_node_model("SubmanifoldConv", {"kernel_shape": [3, 3], "spatial_shape": [8, 8]}, 3, 4, 2,
                                 True, False, rng)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    features, coords = random_sparse(rng, 1, 3, (8, 8), count=20)
    feeds = {"features": features.astype(np.float16), "coords": coords}
    outputs = run_lowered(model, feeds)
    expected = reference.run(model, feeds)
    np.testing.assert_allclose(outputs["out_features"], expected["out_features"], rtol=1e-4, atol=1e-5)


def test_dump_dir_holds_the_model_after_every_pass(tmp_path, rng):
    model, _ = sparse_node_model("SparseConv", {"kernel_shape": [3], "spatial_shape": [9]}, 2, 2, 1, True, False, rng)
    sparse_lower.lower(model, dump_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00_input.onnx", "01_validate.onnx",
                                                          "02_widen-float16.onnx", "03_scatter-to-dense.onnx",
                                                          "04_lower-gpu.onnx", "05_fuse-epilogues.onnx",
                                                          "06_sort-first-sites.onnx", "07_check.onnx"]
    onnx.checker.check_model(onnx.load(tmp_path / "07_check.onnx"))


@pytest.mark.skipif(not (DATA / "nuscenes_centerpoint_voxels.npz").exists(), reason="shared data absent")
def test_real_centerpoint_frame_matches_the_reference():
    features, coords, grid = load_voxels(DATA / "nuscenes_centerpoint_voxels.npz")
    model = centerpoint_head_stack(spatial_shape=grid)
    feeds = {"features": features, "coords": coords}
    outputs = run_lowered(model, feeds, threads=2)
    expected = reference.run(model, feeds)
    for name, value in expected.items():
        assert outputs[name].shape == value.shape
        np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("declare", ["no shapes", "no types"])
def test_loosely_declared_models_lower_to_valid_onnx(rng, declare):
    # onnx.helper's defaults: IR version 14 (newer than onnxruntime reads) and inputs/outputs declared
    # without shapes, or outputs without any type. The lowered model is valid ONNX and runs.
    W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("SubmanifoldConv", ["f", "c", "W"], ["of", "oc"], name="subm", domain="sparse",
                              kernel_shape=[3, 3], spatial_shape=[8, 8]),
             helper.make_node("Relu", ["of"], ["y"])]
    if declare == "no shapes":
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("oc", TensorProto.INT64, None)]
    else:
        outputs = [helper.make_empty_tensor_value_info("y"), helper.make_empty_tensor_value_info("oc")]
    graph = helper.make_graph(nodes, "loose", [helper.make_tensor_value_info("f", TensorProto.FLOAT, None),
                                                helper.make_tensor_value_info("c", TensorProto.INT64, None)],
                              outputs, [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS)
    lowered = sparse_lower.lower(model)
    onnx.checker.check_model(lowered)
    assert lowered.ir_version == 10
    features, coords = random_sparse(rng, 2, 3, (8, 8), count=30)
    feeds = {"f": features, "c": coords}
    got = sparse_lower.create_session(lowered).run(["y", "oc"], feeds)
    model.ir_version = IR_VERSION
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(got[1], expected["oc"])
    np.testing.assert_allclose(got[0], expected["y"], rtol=1e-5, atol=1e-5)


def residual_stack(rng) -> onnx.ModelProto:
    """SubM → Relu → SubM → Relu → SubM → Add(the first Relu) → Relu → SubM: a basic block's epilogues."""
    builder = SparseModelBuilder(3, 4, rng)
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), (6, 8, 8)).relu()
    block_input = builder.features
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), (6, 8, 8)).relu()
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), (6, 8, 8), bias=False).add(block_input).relu()
    builder.conv("SubmanifoldConv", 8, (1, 3, 3), (6, 8, 8))
    return builder.build()


def unfused(model: onnx.ModelProto, **options) -> onnx.ModelProto:
    """`model` lowered for the gpu target without the epilogue fusion."""
    from sparse_lower.lowering import Options
    from sparse_lower.passes.lower import LowerSparse
    from sparse_lower.passes.manager import PassManager
    from sparse_lower.passes.validate import ValidateSourceOps

    return PassManager([ValidateSourceOps(), LowerSparse("gpu", Options(**options))]).run(model)


def test_epilogues_fuse_into_the_conv_bitwise(rng):
    model = residual_stack(rng)
    lowered = sparse_lower.lower(model, check_each_pass=True)
    convs = [n for n in lowered.graph.node if n.op_type == "IndexedConv"]
    assert not [n.op_type for n in lowered.graph.node if n.op_type in ("Relu", "Add")]
    assert [helper.get_attribute_value(a) for n in convs for a in n.attribute] == [b"relu"] * 3
    assert [len(n.input) for n in convs] == [5, 5, 6, 5], "the third conv reads the block input as its residual"
    features, coords = random_sparse(rng, 2, 4, (6, 8, 8), density=0.3)
    feeds = {"features": features, "coords": coords}
    expected = reference.run(model, feeds)
    plain = session(unfused(model, strategy="auto")).run(None, feeds)
    for threads in (1, 2):
        outputs = session(lowered, threads).run(None, feeds)
        for got, want, name in zip(outputs, plain, ("features", "coords")):
            np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_allclose(outputs[0], expected[lowered.graph.output[0].name], rtol=1e-5, atol=1e-5)


def test_epilogues_stay_where_they_cannot_fuse(rng):
    """A conv output read twice or returned, an Add of a broadcast constant: those ops stay."""
    builder = SparseModelBuilder(2, 4, rng)
    builder.conv("SubmanifoldConv", 4, (3, 3), (8, 8))
    read_twice = builder.features
    builder.relu().add(read_twice)  # the conv output feeds both the Relu and the Add
    builder.conv("SubmanifoldConv", 4, (3, 3), (8, 8))
    builder.initializers.append(numpy_helper.from_array(np.ones(4, np.float32), "shift"))
    builder.add("shift").relu()  # a per-channel shift, broadcast over the rows: not a residual
    model = builder.build()
    lowered = sparse_lower.lower(model, check_each_pass=True)
    assert sorted(n.op_type for n in lowered.graph.node if n.op_type in ("Relu", "Add")) == ["Add", "Add", "Relu", "Relu"]
    features, coords = random_sparse(rng, 1, 4, (8, 8), density=0.5)
    feeds = {"features": features, "coords": coords}
    outputs = session(lowered).run(None, feeds)
    for got, want in zip(outputs, session(unfused(model, strategy="auto")).run(None, feeds)):
        np.testing.assert_array_equal(got, want)


def test_a_returned_conv_output_keeps_its_relu(rng):
    builder = SparseModelBuilder(1, 2, rng)
    builder.conv("SubmanifoldConv", 3, (3,), (9,))
    returned = builder.features
    model = builder.relu().build()
    model.graph.output.append(helper.make_tensor_value_info(returned, TensorProto.FLOAT, [None, 3]))
    lowered = sparse_lower.lower(model, check_each_pass=True)
    assert [n.op_type for n in lowered.graph.node if n.op_type in ("Relu", "Add")] == ["Relu"]
