"""SparseMaxPool and Coalesce (docs/source_ops.md): the reference against onnxruntime's dense oracle (MaxPool,
ScatterND), and every target's lowering against the reference, on random single ops (1-D to 3-D, batches,
empty frames, sites repeated many times) and on small networks that merge rows the way VoxelNeXt does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sparse_lower
from helpers import run_lowered, runner, voxelnext_like
from oracle import IR_VERSION, OPSET_IMPORTS, coalesce_oracle, max_pool_oracle, random_sparse
from sparse_lower import reference
from sparse_lower.errors import SparseLowerError

TARGETS = [("gpu", {}), ("nna", {}), ("nna", {"combine": "unfold", "layout": "rows"}), ("hybrid", {}),
           ("portable", {})]


def single_op_model(op_type, attrs, channels, ndim):
    node = helper.make_node(op_type, ["features", "coords"], ["out_features", "out_coords"], domain="sparse",
                            name="node", **attrs)
    graph = helper.make_graph([node], "single", [
        helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", channels]),
        helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 1 + ndim])], [
        helper.make_tensor_value_info("out_features", TensorProto.FLOAT, ["M", channels]),
        helper.make_tensor_value_info("out_coords", TensorProto.INT64, ["M", 1 + ndim])])
    return helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)


def random_pool(rng, submanifold=False):
    """A random pooling geometry whose output grid is not empty, with its frame."""
    while True:
        ndim = int(rng.integers(1, 4))
        spatial = rng.integers(2, 7, ndim).tolist()
        if submanifold:
            kernel = (2 * rng.integers(0, 2, ndim) + 1).tolist()
            strides, pads = [1] * ndim, [0] * (2 * ndim)
        else:
            kernel = rng.integers(1, 4, ndim).tolist()
            strides = rng.integers(1, 4, ndim).tolist()
            pads = [int(rng.integers(0, k)) for k in kernel + kernel]
        dilations = rng.integers(1, 3, ndim).tolist()
        extent = [(s + pads[i] + pads[ndim + i] - d * (k - 1) - 1) // st + 1
                  for i, (s, k, st, d) in enumerate(zip(spatial, kernel, strides, dilations))]
        if min(extent) >= 1:
            break
    attrs = {"kernel_shape": kernel, "spatial_shape": spatial, "strides": strides, "pads": pads, "dilations": dilations}
    if submanifold:
        attrs["submanifold"] = 1
    batch = int(rng.integers(1, 4))
    total = batch * int(np.prod(spatial))
    features, coords = random_sparse(rng, batch, int(rng.integers(1, 5)), spatial, count=int(rng.integers(0, total + 1)))
    return attrs, batch, features, coords


def random_merge(rng, reduction):
    """A random Coalesce with many rows per site: rows drawn with replacement from a few sites."""
    ndim = int(rng.integers(1, 4))
    spatial = rng.integers(1, 6, ndim).tolist()
    batch = int(rng.integers(1, 4))
    sites = batch * int(np.prod(spatial))
    chosen = rng.choice(sites, size=min(sites, int(rng.integers(1, 6))), replace=False)
    rows = int(rng.integers(0, 30))
    picked = rng.choice(chosen, size=rows, replace=True)
    coords = np.stack(np.unravel_index(picked, (batch, *spatial)), axis=1).astype(np.int64).reshape(rows, 1 + ndim)
    features = rng.standard_normal((rows, int(rng.integers(1, 5)))).astype(np.float32)
    attrs = {"spatial_shape": spatial} if reduction == "sum" and rng.random() < 0.5 else \
        {"spatial_shape": spatial, "reduction": reduction}
    return attrs, batch, features, coords


def most_rows_at_one_site(coords):
    return int(np.unique(coords, axis=0, return_counts=True)[1].max()) if len(coords) else 1


def check_every_target(model, features, coords, expected, expected_coords, members):
    feeds = {"features": features, "coords": coords}
    static = ("nna", {"max_active": max(len(coords), len(expected_coords), 1), "max_members": members, "layout": "rows"})
    for target, options in [*TARGETS, static]:
        outputs = run_lowered(model, feeds, target=target, **options)
        np.testing.assert_array_equal(outputs["out_coords"], expected_coords, err_msg=f"{target} {options}")
        np.testing.assert_allclose(outputs["out_features"], expected, rtol=1e-5, atol=1e-5, err_msg=f"{target} {options}")


def check_pool(attrs, batch, features, coords):
    """A SparseMaxPool's reference against the dense oracle, and every target's lowering against both."""
    expected, expected_coords = max_pool_oracle(attrs, features, coords, batch)
    out, out_coords = reference.sparse_max_pool(features, coords, **attrs)
    np.testing.assert_array_equal(out_coords, expected_coords)
    np.testing.assert_array_equal(out, expected)
    model = single_op_model("SparseMaxPool", attrs, features.shape[1], len(attrs["spatial_shape"]))
    check_every_target(model, features, coords, expected, expected_coords, 1)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("submanifold", [False, True])
def test_max_pool_matches_the_dense_oracle_on_every_target(seed, submanifold):
    check_pool(*random_pool(np.random.default_rng(seed), submanifold))


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_coalesce_matches_the_dense_oracle_on_every_target(seed, reduction):
    rng = np.random.default_rng(100 + seed)
    attrs, batch, features, coords = random_merge(rng, reduction)
    expected, expected_coords = coalesce_oracle(attrs, features, coords, batch)
    out, out_coords = reference.coalesce(features, coords, **attrs)
    np.testing.assert_array_equal(out_coords, expected_coords)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    model = single_op_model("Coalesce", attrs, features.shape[1], len(attrs["spatial_shape"]))
    check_every_target(model, features, coords, expected, expected_coords, most_rows_at_one_site(coords))


def test_max_pool_takes_the_maximum_of_negative_rows_not_zero():
    """Only active inputs count: a window of negative rows keeps its negative maximum (spconv's kernels
    start from 0 and return max(0, ·): sparse_lower.export writes a Relu after the pooling for that)."""
    features = np.array([[-3.0], [-1.0]], np.float32)
    coords = np.array([[0, 0], [0, 1]], np.int64)
    model = single_op_model("SparseMaxPool", {"kernel_shape": [2], "strides": [2], "spatial_shape": [2]}, 1, 1)
    for target, options in TARGETS:
        outputs = run_lowered(model, {"features": features, "coords": coords}, target=target, **options)
        np.testing.assert_array_equal(outputs["out_features"], [[-1.0]])


@pytest.mark.parametrize("rows", [0, 1, 40, 300])
def test_a_network_that_merges_rows_runs_on_every_target(rows):
    rng = np.random.default_rng(rows)
    model = voxelnext_like(rng)
    onnx.checker.check_model(model)
    features, coords = random_sparse(rng, 2, 2, (9, 10, 11), count=rows)
    expected = reference.run(model, {"features": features, "coords": coords})
    capacities = [max(rows, 1), 400, 400, 900, 400]  # input, a, b, the concatenated rows, and deeper
    for target, options in [*TARGETS, ("nna", {"max_active": capacities, "max_members": 16}),
                            ("hybrid", {"max_active": capacities, "max_members": 16, "combine": "unfold"})]:
        outputs = run_lowered(model, {"features": features, "coords": coords}, target=target, **options)
        np.testing.assert_array_equal(outputs["out_coords"], expected["out_coords"], err_msg=f"{target} {options}")
        np.testing.assert_allclose(outputs["out_features"], expected["out_features"], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{target} {options}")


def test_more_rows_at_a_site_than_max_members_is_a_clear_run_time_error():
    coords = np.array([[0, 1]] * 3, np.int64)
    features = np.ones((3, 2), np.float32)
    model = single_op_model("Coalesce", {"spatial_shape": [4]}, 2, 1)
    lowered = sparse_lower.lower(model, target="nna", max_active=8, max_members=2)
    with pytest.raises(Exception, match=r"3 rows at the site of row 0.*raise max_members to at least 3"):
        sparse_lower.create_session(lowered).run(None, {"features": features, "coords": coords})


def test_the_static_form_asks_for_max_members_where_a_coalesce_needs_it():
    model = single_op_model("Coalesce", {"spatial_shape": [4]}, 2, 1)
    with pytest.raises(SparseLowerError, match=r"node.*give max_members"):
        sparse_lower.lower(model, target="nna", max_active=8)
    pool = single_op_model("SparseMaxPool", {"kernel_shape": [2], "strides": [2], "spatial_shape": [4]}, 2, 1)
    feeds = {"features": np.array([[1.0, -1.0], [2.0, -2.0]], np.float32), "coords": np.array([[0, 0], [0, 1]])}
    outputs = run_lowered(pool, feeds, target="nna", max_active=8)  # its table is the kernel's width
    np.testing.assert_array_equal(outputs["out_features"], [[2.0, -1.0]])


def test_coords_outside_the_grid_are_an_error_or_nan():
    coords = np.array([[0, 1], [0, 4]], np.int64)
    features = np.ones((2, 2), np.float32)
    feeds = {"features": features, "coords": coords}
    model = single_op_model("Coalesce", {"spatial_shape": [4]}, 2, 1)
    with pytest.raises(Exception, match="outside"):
        run_lowered(model, feeds, target="gpu")
    assert np.isnan(run_lowered(model, feeds, target="portable")["out_features"]).all()
    with pytest.raises(SparseLowerError, match="outside the grid"):
        reference.run(model, feeds)


@pytest.mark.parametrize("attrs, message", [
    ({"spatial_shape": [4], "reduction": "mean"}, "reduction 'mean' is not defined"),
    ({"spatial_shape": [4], "reduction": 1}, "expected STRING"),
    ({"reduction": "sum"}, "'spatial_shape' is required"),
])
def test_bad_coalesce_attributes_are_refused_naming_the_node(attrs, message):
    with pytest.raises(SparseLowerError, match=message) as error:
        sparse_lower.lower(single_op_model("Coalesce", attrs, 2, 1), target="gpu")
    assert error.value.node == "node"


@pytest.mark.parametrize("attrs, message", [
    ({"kernel_shape": [2], "spatial_shape": [4], "submanifold": 1}, "submanifold SparseMaxPool needs odd kernel"),
    ({"kernel_shape": [3], "strides": [2], "spatial_shape": [4], "submanifold": 1}, "needs strides of 1"),
    ({"kernel_shape": [3], "spatial_shape": [4], "submanifold": 2}, "submanifold=2 is not 0 or 1"),
    ({"kernel_shape": [3], "spatial_shape": [4], "group": 1}, "has no attribute 'group'"),
    ({"kernel_shape": [5], "spatial_shape": [4]}, "output extent"),
])
def test_bad_pooling_attributes_are_refused_naming_the_node(attrs, message):
    with pytest.raises(SparseLowerError, match=message) as error:
        sparse_lower.lower(single_op_model("SparseMaxPool", attrs, 2, 1), target="gpu")
    assert error.value.node == "node"


def test_float16_rows_are_merged_in_float32():
    coords = np.array([[0, 1], [0, 1], [0, 0]], np.int64)
    features = np.array([[1.0], [2.0], [3.0]], np.float16)
    model = single_op_model("Coalesce", {"spatial_shape": [4]}, 1, 1)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    for target, options in TARGETS:
        outputs = run_lowered(model, {"features": features, "coords": coords}, target=target, **options)
        np.testing.assert_array_equal(outputs["out_features"], [[3.0], [3.0]])


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino", "tvm"])
def test_the_portable_form_of_a_merging_network_runs_in_every_runtime(runtime, tmp_path):
    """Coalesce's portable tables use only ops OpenVINO and TVM import (two Unique, no TopK, no scatter into
    a run-time shape), SparseMaxPool the strided conv's."""
    rng = np.random.default_rng(7)
    model = voxelnext_like(rng)
    features, coords = random_sparse(rng, 2, 2, (9, 10, 11), count=150)
    feeds = {"features": features, "coords": coords}
    expected = reference.run(model, feeds)
    outputs = runner(runtime, sparse_lower.lower(model, target="portable"), tmp_path)(feeds)
    np.testing.assert_array_equal(outputs["out_coords"], expected["out_coords"])
    np.testing.assert_allclose(outputs["out_features"], expected["out_features"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op_type, attrs", [("Coalesce", {"spatial_shape": [4]}),
                                            ("SparseMaxPool", {"kernel_shape": [2], "strides": [2], "spatial_shape": [4]})])
def test_feature_rows_that_do_not_pair_with_the_coords_are_an_error_or_nan(op_type, attrs):
    feeds = {"features": np.ones((3, 2), np.float32), "coords": np.array([[0, 1], [0, 2]], np.int64)}
    model = single_op_model(op_type, attrs, 2, 1)
    for target in ("gpu", "nna"):
        with pytest.raises(Exception, match="rows"):
            run_lowered(model, feeds, target=target)
    assert np.isnan(run_lowered(model, feeds, target="portable")["out_features"]).all()


def test_the_portable_static_form_refuses_the_merge_ops_with_the_fix():
    model = single_op_model("Coalesce", {"spatial_shape": [4]}, 2, 1)
    with pytest.raises(SparseLowerError, match=r"does not take Coalesce yet.*without max_active"):
        sparse_lower.lower(model, target="portable", max_active=8)
