"""Hostile feeds at run time: a lowered model fed coords outside the grid, negative, duplicated, of the
wrong dtype or width, features that do not pair with them, more rows than its capacity, or NaN and Inf
features. Each bad feed gets exactly the error message written here, never a crash, a hang or silently
wrong numbers:

* the message is our kernel's, naming the op (the index builder of every target and op) and the row;
* for feeds that contradict the model's declared inputs, it is onnxruntime's own, naming the input;
* NaN/Inf features propagate exactly as onnxruntime's dense Conv propagates them (the oracle of
  docs/source_ops.md): NaN positions identical, infinities identical, finite values close.

Models refused before they run (at lowering, at import, on the command line) are tests/test_errors.py's.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from helpers import STRIDED, SUBM, model_with, to_dense_model, with_input, with_nodes
from oracle import (IR_VERSION, OPSET_IMPORTS, densify, dense_oracle, gather_sites, oracle_active_coords, random_sparse,
                    sparse_node_model)

INVALID_ARGUMENT = ort.capi.onnxruntime_pybind11_state.InvalidArgument


# -- hostile feeds and the models they are fed to ----------------------------------------------------

def dense_boundary_model(x_shape, rng, cout=3):
    """X [B, C, *S] → ToSparse 'in' → SubmanifoldConv 'conv' (3×…×3) → ToDense 'out' → Y, and (W, B)."""
    batch, cin, spatial = x_shape[0], x_shape[1], list(x_shape[2:])
    W = (rng.standard_normal((cout, cin, *[3] * len(spatial))) / 3).astype(np.float32)
    B = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("ToSparse", ["X"], ["f", "c"], name="in", domain="sparse"),
             helper.make_node("SubmanifoldConv", ["f", "c", "W", "B"], ["g", "d"], name="conv", domain="sparse",
                              kernel_shape=[3] * len(spatial), spatial_shape=spatial),
             helper.make_node("ToDense", ["g", "d"], ["Y"], name="out", domain="sparse", spatial_shape=spatial,
                              batch_size=batch)]
    graph = helper.make_graph(nodes, "dense_boundary", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                                       list(x_shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, cout, *spatial])],
                              [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    return helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION), (W, B)


def session(model, **options):
    return sparse_lower.create_session(sparse_lower.lower(model, **options))


def run_error(session, feeds) -> str:
    """The whole message of the run's failure (onnxruntime refuses bad feeds as InvalidArgument)."""
    with pytest.raises(INVALID_ARGUMENT) as info:
        session.run(None, feeds)
    return str(info.value)


def kernel_message(session, feeds) -> str:
    """The message our kernel returned: what follows onnxruntime's 'Status Message: ' prefix."""
    return run_error(session, feeds).split("Status Message: ", 1)[1]


def onnxruntime_message(text):
    return f"[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : {text}"


def changed(array, index, value):
    array = array.copy()
    array[index] = value
    return array


def symbolic_channels(model):
    """Declare the features [N, "C"]: the channel count is known to the lowering, not to the model."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_param = "C"
    return model


def coords_cast_in_the_graph(model):
    """coords32 int32 [N, "D"] → Cast → coords, as the lowering's advice for int32 coords suggests."""
    with_input(model, helper.make_tensor_value_info("coords", TensorProto.INT32, ["N", "D"]))
    model.graph.input[1].name = "coords32"
    return with_nodes(model, helper.make_node("Cast", ["coords32"], ["coords"], name="cast", to=TensorProto.INT64),
                      first=True)


# -- at run time -----------------------------------------------------------------------------------

def test_int32_coords_are_refused_by_the_declared_type(sparse_input):
    features, coords = sparse_input
    assert run_error(session(model_with()), {"features": features, "coords": coords.astype(np.int32)}) == \
        onnxruntime_message("Unexpected input data type. Actual: (tensor(int32)) , expected: (tensor(int64))")


def test_float_coords_are_refused_by_the_declared_type_on_the_nna(sparse_input):
    features, coords = sparse_input
    feeds = {"features": features, "coords": coords.astype(np.float32)}
    assert run_error(session(model_with(), target="nna"), feeds) == \
        onnxruntime_message("Unexpected input data type. Actual: (tensor(float)) , expected: (tensor(int64))")


def test_coords_wider_than_declared_are_refused_by_name(sparse_input):
    features, coords = sparse_input
    wide = np.concatenate([coords, coords[:, :1]], axis=1)
    assert run_error(session(model_with()), {"features": features, "coords": wide}) == onnxruntime_message(
        "Got invalid dimensions for input: coords for the following indices\n index: 1 Got: 4 Expected: 3\n Please "
        "fix either the inputs/outputs or the model.")


@pytest.mark.parametrize("target", ["gpu", "nna"])
def test_features_wider_than_the_weights_are_refused_by_name(target, sparse_input):
    """Formerly a MatMul (gpu) or Reshape (nna) failure deep inside the lowered graph: the lowering now
    declares the channel count it knows, and onnxruntime names the input."""
    _, coords = sparse_input
    assert run_error(session(symbolic_channels(model_with()), target=target),
                     {"features": np.ones((10, 5), np.float32), "coords": coords}) == onnxruntime_message(
        "Got invalid dimensions for input: features for the following indices\n index: 1 Got: 5 Expected: 3\n Please "
        "fix either the inputs/outputs or the model.")


def test_coords_of_the_wrong_width_computed_in_the_graph_fail_in_the_kernel(sparse_input):
    features, coords = sparse_input
    wide = np.concatenate([coords, coords[:, :1]], axis=1).astype(np.int32)
    feeds = {"features": features, "coords32": wide}
    assert kernel_message(session(coords_cast_in_the_graph(model_with())), feeds) == \
        "SubmanifoldMap: coords must have shape [N, 3] (batch and 2 spatial columns), got [10, 4]"


@pytest.mark.parametrize("target, message", [
    ("gpu", "IndexedUnfold: X has 7 rows but coords has 10: features and coords must pair row by row"),
    ("nna", "PairRows: features have 7 rows but coords have 10: features and coords must pair row by row"),
], ids=["gpu", "nna"])
def test_feature_rows_must_pair_with_the_coords(target, message, sparse_input):
    features, coords = sparse_input
    assert kernel_message(session(model_with(), target=target), {"features": features[:7], "coords": coords}) == \
        message


def test_a_batch_index_overflowing_the_linear_sites_is_refused(sparse_input):
    features, coords = sparse_input
    assert kernel_message(session(model_with()), {"features": features, "coords": changed(coords, (1, 0), 2**62)}) == \
        "SiteOrder: row 1 of coords has batch 4611686018427387904, too large for linear sites to fit in int64"


INDEX_BUILDERS = {"SubmanifoldConv": "SubmanifoldMap", "SparseConv": "StridedMap", "SparseDeconv": "TransposedMap"}


@pytest.mark.parametrize("target", ["gpu", "nna", "hybrid"])
@pytest.mark.parametrize("op_type, attrs", [("SubmanifoldConv", SUBM),
                                            ("SubmanifoldConv", {**SUBM, "kernel_shape": [1, 1]}),
                                            ("SparseConv", STRIDED), ("SparseDeconv", STRIDED)],
                         ids=["subm", "subm-1x1", "strided", "transposed"])
def test_coords_outside_the_grid_negative_or_duplicated_are_refused(op_type, attrs, target, rng):
    """Every op's index builder, on every target, names itself, the row and the coordinate; on the targets
    that put a submanifold level's rows in site order, SiteOrder reads the coords first."""
    lowered = session(model_with(op_type, attrs), target=target)
    features, coords = random_sparse(rng, 2, 3, (8, 8), count=10)
    builder = "SiteOrder" if op_type == "SubmanifoldConv" and target != "nna" else INDEX_BUILDERS[op_type]
    outside = changed(coords, (3, 2), 8)
    assert kernel_message(lowered, {"features": features, "coords": outside}) == \
        f"{builder}: coordinate ({outside[3, 0]}, {outside[3, 1]}, 8) of row 3 of coords is outside the grid [8, 8]"
    assert kernel_message(lowered, {"features": features, "coords": changed(coords, (0, 0), -1)}) == \
        f"{builder}: row 0 of coords has a negative batch -1"
    duplicated = changed(coords, 5, coords[2])
    assert kernel_message(lowered, {"features": features, "coords": duplicated}) == \
        f"{builder}: rows 2 and 5 of coords are the same coordinate ({', '.join(map(str, coords[2]))})"


@pytest.mark.parametrize("target, targets, message", [
    ("gpu", [[0, 1, 1], [0, 1, 1]], "TargetMap: rows 0 and 1 of target_coords are the same coordinate (0, 1, 1)"),
    ("nna", [[0, -1, 1]], "TargetMap: coordinate (0, -1, 1) of row 0 of target_coords is outside the output grid "
                          "[8, 8]"),
    ("gpu", [[0, 1, 1], [0, 8, 0]], "TargetMap: coordinate (0, 8, 0) of row 1 of target_coords is outside the "
                                    "output grid [8, 8]"),
], ids=["duplicated on the gpu", "negative on the nna", "outside on the gpu"])
def test_target_coords_duplicated_negative_or_outside_are_refused(target, targets, message, rng):
    features, coords = random_sparse(rng, 1, 3, (4, 4), count=5)
    attrs = {**STRIDED, "spatial_shape": [4, 4]}
    feeds = {"features": features, "coords": coords, "target_coords": np.array(targets, np.int64)}
    assert kernel_message(session(model_with("SparseDeconv", attrs, target=True), target=target), feeds) == message


def test_more_rows_than_max_active_are_refused(sparse_input):
    features, coords = sparse_input
    feeds = {"features": features, "coords": coords}
    assert kernel_message(session(model_with(), target="nna", max_active=4), feeds) == \
        "CapacityPads: x has 10 rows, more than the capacity 4 (max_active); raise max_active to at least 10"


@pytest.mark.parametrize("features, coords, message", [
    (np.ones((3, 2), np.float32), [[0, 1, 1], [0, 1, 2]],
     "PairRows: features have 3 rows but coords have 2: features and coords must pair row by row"),
    (np.ones((2, 2), np.float32), [[0, 1, 1], [0, 1, 1]],
     "SiteIndex: rows 0 and 1 of coords are the same coordinate (0, 1, 1)"),
    (np.ones((2, 2), np.float32), [[0, 1, 1], [1, 2, 2]], "SiteIndex: row 1 of coords has batch 1, not below "
                                                          "batch_size 1"),
], ids=["rows not pairing", "duplicated coords", "batch beyond batch_size"])
def test_to_dense_refuses_feeds_that_are_not_a_sparse_tensor(features, coords, message):
    model = to_dense_model(spatial_shape=[4, 4], batch_size=1)
    assert kernel_message(session(model), {"features": features, "coords": np.array(coords, np.int64)}) == message


def test_to_sparse_refuses_an_input_of_another_rank_by_name(rng):
    model, _ = dense_boundary_model((1, 2, 4, 4), rng)
    assert run_error(session(model), {"X": np.ones((1, 2, 4), np.float32)}) == onnxruntime_message(
        "Invalid rank for input: X Got: 3 Expected: 4 Please fix either the inputs/outputs or the model.")


# -- NaN and Inf ----------------------------------------------------------------------------------------

NON_FINITE_OPS = {
    "SubmanifoldConv": {"kernel_shape": [3, 3], "spatial_shape": [6, 6]},
    "SparseConv": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "spatial_shape": [6, 6]},
    "SparseDeconv": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1],
                     "spatial_shape": [6, 6]},
}
COMPUTE_FORMS = [
    pytest.param("gpu", {"strategy": "unfold"}, id="gpu-unfold"),
    pytest.param("gpu", {"strategy": "rulebook"}, id="gpu-rulebook"),
    pytest.param("gpu", {"strategy": "fused"}, id="gpu-fused"),
    pytest.param("nna", {"combine": "gather"}, id="nna-gather"),
    pytest.param("nna", {"combine": "scatter"}, id="nna-scatter"),
    pytest.param("nna", {"combine": "pairs"}, id="nna-pairs"),
    pytest.param("nna", {"combine": "unfold"}, id="nna-unfold"),
    pytest.param("nna", {"combine": "unfold", "max_active": 200, "layout": "rows"}, id="nna-unfold-capacity"),
    pytest.param("nna", {"combine": "pairs", "max_active": 200, "layout": "rows"}, id="nna-pairs-capacity"),
    pytest.param("nna", {"combine": "gather", "fuse_taps": True, "max_active": 200}, id="nna-fused-capacity"),
    pytest.param("hybrid", {}, id="hybrid"),
]


def assert_same_as_dense(got, want):
    """NaN at the same places, the same infinities, finite values close — and the case is not vacuous."""
    assert np.isnan(want).any() and np.isinf(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # equal infinities, NaN where NaN


@pytest.mark.parametrize("op_type", NON_FINITE_OPS)
@pytest.mark.parametrize("target, options", COMPUTE_FORMS)
def test_nan_and_inf_features_propagate_like_the_dense_conv(op_type, target, options, rng):
    attrs = NON_FINITE_OPS[op_type]
    model, (W, B) = sparse_node_model(op_type, attrs, 3, 4, 2, True, False, rng)
    features, coords = random_sparse(rng, 2, 3, (6, 6), count=20)
    features[2, 1], features[5, 0], features[7, 2] = np.nan, np.inf, -np.inf
    out_features, out_coords = session(model, target=target, **options).run(None, {"features": features,
                                                                                    "coords": coords})
    np.testing.assert_array_equal(out_coords, oracle_active_coords(op_type, attrs, coords, 2))
    dense = dense_oracle(op_type, attrs, densify(features, coords, 2, attrs["spatial_shape"]), W, B)
    assert_same_as_dense(out_features, gather_sites(dense, out_coords))


@pytest.mark.parametrize("op_type", NON_FINITE_OPS)
def test_the_matmul_combine_spreads_nan_over_the_layer_as_documented(op_type, rng):
    """The documented limit of patent method 1 (lowering/nna/compute.py): its product with the 0/1
    scatter matrices multiplies every partial by zeros too, and 0·NaN = 0·Inf = NaN, so one non-finite
    feature makes the whole layer NaN. No op of the accelerator's table selects without multiplying;
    gather and scatter (above) are exact."""
    model, _ = sparse_node_model(op_type, NON_FINITE_OPS[op_type], 3, 4, 2, True, False, rng)
    features, coords = random_sparse(rng, 2, 3, (6, 6), count=20)
    features[5, 0] = np.inf
    out_features, _ = session(model, target="nna", combine="matmul").run(None, {"features": features, "coords": coords})
    assert out_features.size and np.isnan(out_features).all()


@pytest.mark.parametrize("target", ["gpu", "nna"])
def test_nan_and_inf_in_a_dense_input_propagate_through_to_sparse_and_to_dense(target, rng):
    """The dense-format path: ToSparse counts a NaN site as active (it is non-zero), the conv unfolds
    straight from X on the gpu, and ToDense writes zeros only where no site is active."""
    x = np.where(rng.random((2, 2, 5, 5)) < 0.3, rng.standard_normal((2, 2, 5, 5)), 0).astype(np.float32)
    x[0, 1, 2, 2], x[1, 0, 1, 3], x[1, 1, 4, 0] = np.nan, np.inf, -np.inf
    model, (W, B) = dense_boundary_model(x.shape, rng)
    (y,) = session(model, target=target).run(None, {"X": x})
    active = (x != 0).any(axis=1, keepdims=True)
    attrs = {"kernel_shape": [3, 3], "spatial_shape": [5, 5]}
    assert_same_as_dense(y, np.where(active, dense_oracle("SubmanifoldConv", attrs, x, W, B), 0))
