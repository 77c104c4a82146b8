"""Bad models and bad inputs get a clear error naming the node (at lowering) or the op (at run time),
never a crash or silently wrong numbers."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from helpers import SUBM, model_with
from oracle import random_sparse
from sparse_lower import SparseLowerError

def refusal(model, *fragments, **options):
    with pytest.raises(SparseLowerError) as info:
        sparse_lower.lower(model, **options)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("attrs, fragment", [
    ({**SUBM, "group": 2}, "group=2 is not supported"),
    ({**SUBM, "kernel_shape": [2, 3]}, "needs odd kernel sizes"),
    ({**SUBM, "strides": [2, 2]}, "needs strides of 1"),
    ({**SUBM, "dilations": [0, 1]}, "dilations=[0, 1] has a value below 1"),
    ({**SUBM, "foo": 1}, "has no attribute 'foo'"),
    ({"kernel_shape": [3, 3]}, "attribute 'spatial_shape' is required"),
    ({**SUBM, "spatial_shape": [8]}, "'spatial_shape' has 1 values, expected 2"),
])
def test_bad_attributes_are_refused_naming_the_node(attrs, fragment):
    refusal(model_with(attrs=attrs), "node 'bad_node'", fragment)


def test_output_extent_below_one_is_refused():
    model = model_with("SparseConv", {"kernel_shape": [5, 5], "spatial_shape": [3, 8]})
    refusal(model, "node 'bad_node'", "output extent [-1, 4]")


def test_weight_shape_mismatch_is_refused():
    model = model_with()
    weights = numpy_helper.from_array(np.zeros((4, 3, 5, 5), np.float32), "W")
    model.graph.initializer[0].CopyFrom(weights)
    refusal(model, "node 'bad_node'", "do not match kernel_shape [3, 3]", "give weights [4, 3, 3, 3]")


@pytest.mark.parametrize("op_type, attrs, fix", [
    ("SubmanifoldConv", SUBM, "np.moveaxis(w, -1, 1) gives [4, 5, 3, 3]"),
    ("SparseDeconv", {"kernel_shape": [3, 3], "spatial_shape": [8, 8], "strides": [2, 2]},
     "np.moveaxis(w, -1, 0) gives [5, 4, 3, 3]"),
])
def test_weights_in_spconvs_layout_are_told_the_transpose(op_type, attrs, fix):
    """spconv's KRSC weights [Cout, *K, Cin], as a user exporting by hand has them: the fix is a transpose."""
    model = model_with(op_type, attrs, cin=5)
    name = model.graph.node[0].input[2]
    krsc = numpy_helper.from_array(np.zeros((4, 3, 3, 5), np.float32), name)  # Cout 4, 3×3 taps, Cin 5
    next(t for t in model.graph.initializer if t.name == name).CopyFrom(krsc)
    refusal(model, "node 'bad_node'", "weights of shape [4, 3, 3, 5] are in spconv's layout [Cout, *kernel, Cin]",
            fix)


def test_feature_channels_must_match_the_weights():
    model = model_with()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5
    refusal(model, "node 'bad_node'", "have 5 channels but the weights expect 3")


@pytest.mark.parametrize("dtype, dims, fragment", [
    (TensorProto.INT32, ["N", 3], "are int32"),
    (TensorProto.INT64, ["N", 3, 1], "have rank 3"),
    (TensorProto.INT64, ["N", 4], "have 4 columns, expected 3"),
])
def test_coords_of_the_wrong_type_are_refused(dtype, dims, fragment):
    model = model_with()
    model.graph.input[1].CopyFrom(helper.make_tensor_value_info("coords", dtype, dims))
    refusal(model, "node 'bad_node'", fragment)


def test_weights_computed_at_run_time_are_refused():
    model = model_with()
    weights = model.graph.initializer.pop(0)
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(weights.dims)))
    refusal(model, "node 'bad_node'", "computed at run time", "initializer")


def test_unknown_op_target_and_strategy_are_refused():
    model = model_with()
    model.graph.node[0].op_type = "SparseMaxPool"
    refusal(model, "unknown op 'sparse::SparseMaxPool'")
    refusal(model_with(), "unknown target 'tpu'", target="tpu")
    refusal(model_with(), "unknown strategy 'fast'", strategy="fast")
    refusal(model_with(), "unknown combine method 'sum'", combine="sum")
    refusal(model_with(), "max_active=0 is neither a positive int nor a sequence of them", max_active=0)


def lowered_session(model):
    return sparse_lower.create_session(sparse_lower.lower(model))


def run_fails(session, feeds, *fragments):
    with pytest.raises((ort.capi.onnxruntime_pybind11_state.Fail,
                        ort.capi.onnxruntime_pybind11_state.RuntimeException,
                        ort.capi.onnxruntime_pybind11_state.InvalidArgument)) as info:
        session.run(None, feeds)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message


STRIDED = {"kernel_shape": [2, 2], "strides": [2, 2], "spatial_shape": [8, 8]}


@pytest.mark.parametrize("op_type, attrs", [("SubmanifoldConv", SUBM), ("SubmanifoldConv", {**SUBM, "kernel_shape": [1, 1]}),
                                            ("SparseConv", STRIDED), ("SparseDeconv", STRIDED)])
def test_run_time_coords_outside_the_grid_or_duplicated_fail_clearly(op_type, attrs, rng):
    session = lowered_session(model_with(op_type, attrs))
    features, coords = random_sparse(rng, 2, 3, (8, 8), count=10)
    builder = {"SubmanifoldConv": "SubmanifoldMap", "SparseConv": "StridedMap", "SparseDeconv": "TransposedMap"}[op_type]
    outside = coords.copy()
    outside[3, 2] = 8
    run_fails(session, {"features": features, "coords": outside}, builder, "outside")
    negative = coords.copy()
    negative[0, 0] = -1
    run_fails(session, {"features": features, "coords": negative}, builder)
    duplicated = coords.copy()
    duplicated[5] = duplicated[2]
    run_fails(session, {"features": features, "coords": duplicated}, builder, "are the same coordinate")


def test_feature_rows_must_match_the_coords(rng):
    session = lowered_session(model_with())
    features, coords = random_sparse(rng, 1, 3, (8, 8), count=10)
    run_fails(session, {"features": features[:7], "coords": coords}, "IndexedConv", "features and coords must pair row by row")


def test_target_coords_outside_the_output_grid_fail_clearly(rng):
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "spatial_shape": [4, 4]}
    session = lowered_session(model_with("SparseDeconv", attrs, target=True))
    features, coords = random_sparse(rng, 1, 3, (4, 4), count=5)
    targets = np.array([[0, 1, 1], [0, 8, 0]], np.int64)
    run_fails(session, {"features": features, "coords": coords, "target_coords": targets}, "TargetMap", "outside")


def test_to_dense_refuses_a_batch_beyond_batch_size(rng):
    nodes = [helper.make_node("ToDense", ["features", "coords"], ["Y"], name="out", domain="sparse",
                              spatial_shape=[4, 4], batch_size=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 2]),
                                           helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("sparse", 1)],
                              ir_version=10)
    session = lowered_session(model)
    coords = np.array([[0, 1, 1], [1, 2, 2]], np.int64)
    run_fails(session, {"features": np.ones((2, 2), np.float32), "coords": coords}, "SiteIndex")
