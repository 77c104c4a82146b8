"""The NumPy reference (docs/source_ops.md) against onnxruntime's dense Conv / ConvTranspose, hand-worked cases,
the boundary ops, whole graphs with standard ops, and the refusals (SparseLowerError naming the node)."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import DATA
from oracle import (IR_VERSION, OPSET_IMPORTS, ConvConfig, assert_matches_oracle, dense_oracle, densify,
                    gather_sites, random_conv_config, random_sparse, sparse_node_model)
from sparse_lower import reference
from sparse_lower.errors import SparseLowerError


def run_node(config: ConvConfig, rng, name="node"):
    """Build the single-node model of `config`, run it in the reference; return (W, B, outputs)."""
    model, (W, B) = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, config.target_coords is not None, rng, name=name)
    outputs = reference.run(model, config.feeds)
    return W, B, outputs


@pytest.mark.parametrize("seed", range(1000))
def test_random_config_matches_dense_oracle(seed):
    rng = np.random.default_rng(seed)
    config = random_conv_config(rng)
    W, B, outputs = run_node(config, rng)
    assert_matches_oracle(config, W, B, outputs["out_features"], outputs["out_coords"])


def test_submanifold_3x3_worked_by_hand():
    # Sites (1,1), (1,2), (2,1) of a 4x4 grid, given out of order; W[k] = 1..9 in row-major tap order.
    coords = np.array([[0, 2, 1], [0, 1, 1], [0, 1, 2]], np.int64)
    features = np.array([[3.0], [1.0], [2.0]], np.float32)
    W = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    out, out_coords = reference.submanifold_conv(features, coords, W, np.array([0.5], np.float32),
                                                 kernel_shape=[3, 3], spatial_shape=[4, 4])
    # (2,1): centre 5·3, (1,1) is tap (0,1) → 2·1, (1,2) is tap (0,2) → 3·2.
    # (1,1): centre 5·1, (1,2) is tap (1,2) → 6·2, (2,1) is tap (2,1) → 8·3.
    # (1,2): centre 5·2, (1,1) is tap (1,0) → 4·1, (2,1) is tap (2,0) → 7·3.
    np.testing.assert_array_equal(out_coords, coords)
    np.testing.assert_allclose(out[:, 0], [0.5 + 15 + 2 + 6, 0.5 + 5 + 12 + 24, 0.5 + 10 + 4 + 21])


def test_stride_2_conv_worked_by_hand():
    # 1D, S=6, K=3, s=2, pads 1 → S_out=3; o = (i + 1 − k) / 2. Batch 1 holds one site, listed first.
    coords = np.array([[1, 3], [0, 5], [0, 1], [0, 2]], np.int64)
    features = np.array([[1000.0], [100.0], [1.0], [10.0]], np.float32)
    W = np.array([[[1.0, 2.0, 3.0]]], np.float32)
    attrs = {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "spatial_shape": [6]}
    out, out_coords = reference.sparse_conv(features, coords, W, **attrs)
    # i=1 → o=1 (k=0), o=0 (k=2); i=2 → o=1 (k=1); i=5 → o=2 (k=2), o=3 is outside; batch 1: i=3 → o=2 (k=0),
    # o=1 (k=2). Sorted by (batch, o).
    np.testing.assert_array_equal(out_coords, [[0, 0], [0, 1], [0, 2], [1, 1], [1, 2]])
    np.testing.assert_allclose(out[:, 0], [3.0, 1.0 + 20.0, 300.0, 3000.0, 1000.0])
    assert_matches_oracle(ConvConfig("SparseConv", attrs, 2, 1, 1, False, features, coords), W, None, out,
                          out_coords)


def test_inverse_deconv_restores_the_forward_input_grid(rng):
    # SparseConv then SparseDeconv with target = the forward input coords and
    # output_padding = (S_in + pb + pe − d(K−1) − 1) mod s: spconv's SparseInverseConv.
    S_in, kernel, strides, pads = [7, 6, 5], [3, 3, 3], [2, 2, 2], [1, 1, 1, 1, 1, 1]
    features, coords = random_sparse(rng, 2, 3, S_in, density=0.2)
    forward_attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "spatial_shape": S_in}
    forward = ConvConfig("SparseConv", forward_attrs, 2, 3, 4, True, features, coords)
    _, _, down = run_node(forward, rng)
    output_padding = [(S + pads[i] + pads[3 + i] - (k - 1) - 1) % s
                      for i, (S, k, s) in enumerate(zip(S_in, kernel, strides))]
    assert output_padding == [0, 1, 0]
    inverse_attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "output_padding": output_padding,
                     "spatial_shape": list(forward.output_shape)}
    inverse = ConvConfig("SparseDeconv", inverse_attrs, 2, 4, 3, True, down["out_features"], down["out_coords"],
                         target_coords=coords)
    assert inverse.output_shape == tuple(S_in)
    W, B, up = run_node(inverse, rng)
    np.testing.assert_array_equal(up["out_coords"], coords)
    assert_matches_oracle(inverse, W, B, up["out_features"], up["out_coords"])


def test_deconv_output_padding_beyond_the_stride(rng):
    # ONNX allows output_padding < dilation even when ≥ stride (onnxruntime does not, so no dense oracle):
    # output_padding only extends the grid at the end, like a smaller end pad.
    features, coords = random_sparse(rng, 1, 2, [5], count=3)
    W = rng.standard_normal((2, 3, 3)).astype(np.float32)
    B = rng.standard_normal(3).astype(np.float32)
    common = {"kernel_shape": [3], "strides": [1], "dilations": [2], "spatial_shape": [5]}
    padded = reference.sparse_deconv(features, coords, W, B, output_padding=[1], pads=[0, 1], **common)
    plain = reference.sparse_deconv(features, coords, W, B, output_padding=[0], pads=[0, 0], **common)
    for a, b in zip(padded, plain):
        np.testing.assert_array_equal(a, b)
    # With no end pad to absorb it, the extra last site (9) exists but nothing reaches it: bias alone.
    out, _ = reference.sparse_deconv(features, coords, W, B, np.array([[0, 9]]), output_padding=[1], **common)
    np.testing.assert_array_equal(out, B[None])


def test_float16_features_are_computed_in_float32(rng):
    features, coords = random_sparse(rng, 2, 4, [6, 6, 6], density=0.1)
    W = rng.standard_normal((5, 4, 3, 3, 3)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3, 3], "spatial_shape": [6, 6, 6]}
    half = features.astype(np.float16)
    out16, _ = reference.submanifold_conv(half, coords, W, **attrs)
    out32, _ = reference.submanifold_conv(half.astype(np.float32), coords, W, **attrs)
    assert out16.dtype == np.float32
    np.testing.assert_array_equal(out16, out32)


@pytest.mark.parametrize("op_type", ["SubmanifoldConv", "SparseConv", "SparseDeconv"])
def test_empty_input_gives_empty_output(op_type, rng):
    attrs = {"kernel_shape": [3, 3], "spatial_shape": [5, 5]}
    config = ConvConfig(op_type, attrs, 1, 3, 4, True, np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64))
    _, _, outputs = run_node(config, rng)
    assert outputs["out_features"].shape == (0, 4) and outputs["out_coords"].shape == (0, 3)


def test_empty_input_with_targets_gives_bias_at_targets(rng):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "spatial_shape": [5, 5]}
    targets = np.array([[0, 4, 1], [0, 0, 0]], np.int64)
    config = ConvConfig("SparseDeconv", attrs, 1, 3, 4, True, np.zeros((0, 3), np.float32),
                        np.zeros((0, 3), np.int64), target_coords=targets)
    _, B, outputs = run_node(config, rng)
    np.testing.assert_array_equal(outputs["out_features"], np.stack([B, B]))
    np.testing.assert_array_equal(outputs["out_coords"], targets)


def boundary_model(spatial_shape, batch_size):
    """X → ToSparse → (features, coords) → ToDense → Y, all three exposed as outputs."""
    ndim = len(spatial_shape)
    nodes = [helper.make_node("ToSparse", ["X"], ["features", "coords"], name="to_sparse", domain="sparse"),
             helper.make_node("ToDense", ["features", "coords"], ["Y"], name="to_dense", domain="sparse",
                              spatial_shape=spatial_shape, batch_size=batch_size)]
    dense_shape = [batch_size, "C", *spatial_shape]
    graph = helper.make_graph(
        nodes, "boundary", [helper.make_tensor_value_info("X", TensorProto.FLOAT, dense_shape)],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", "C"]),
         helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 1 + ndim]),
         helper.make_tensor_value_info("Y", TensorProto.FLOAT, dense_shape)])
    return helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)


def test_to_sparse_to_dense_round_trip(rng):
    # Batch 1 is empty, channel 2 is zero everywhere, and active sites have only some channels set.
    features, coords = random_sparse(rng, 3, 4, [5, 6, 7], density=0.2)
    coords = coords[coords[:, 0] != 1]
    features = features[: len(coords)] * (rng.random((len(coords), 4)) < 0.5)
    features[:, 2] = 0
    features[np.all(features == 0, axis=1), 0] = 1.0  # every listed site stays active
    X = densify(features, coords, 3, [5, 6, 7])
    outputs = reference.run(boundary_model([5, 6, 7], 3), {"X": X})
    order = np.lexsort(coords.T[::-1])
    np.testing.assert_array_equal(outputs["coords"], coords[order])
    np.testing.assert_array_equal(outputs["features"], features[order])
    np.testing.assert_array_equal(outputs["Y"], X)
    again_features, again_coords = reference.to_sparse(reference.to_dense(features, coords, spatial_shape=[5, 6, 7],
                                                                          batch_size=3))
    np.testing.assert_array_equal(again_coords, coords[order])
    np.testing.assert_array_equal(again_features, features[order])


def test_graph_with_standard_ops(rng, tmp_path):
    # X → ToSparse → SubmanifoldConv → Relu → SparseConv (stride 2) → ToDense, run from a file.
    S, S_down = [6, 8], [3, 4]
    W1 = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    B1 = rng.standard_normal(4).astype(np.float32)
    W2 = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)
    conv = {"kernel_shape": [2, 2], "strides": [2, 2], "spatial_shape": S}
    nodes = [
        helper.make_node("ToSparse", ["X"], ["f0", "c0"], name="in", domain="sparse"),
        helper.make_node("SubmanifoldConv", ["f0", "c0", "W1", "B1"], ["f1", "c1"], name="subm", domain="sparse",
                         kernel_shape=[3, 3], spatial_shape=S),
        helper.make_node("Relu", ["f1"], ["f2"]),
        helper.make_node("SparseConv", ["f2", "c1", "W2"], ["f3", "c3"], name="down", domain="sparse", **conv),
        helper.make_node("ToDense", ["f3", "c3"], ["Y"], name="out", domain="sparse", spatial_shape=S_down,
                         batch_size=2)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 2, *S])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, *S_down])],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "B1"), numpy_helper.from_array(W2, "W2")])
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    onnx.save(model, tmp_path / "chain.onnx")
    X = densify(*random_sparse(rng, 2, 2, S, density=0.3), 2, S)

    f0, c0 = reference.to_sparse(X)
    f1, c1 = reference.submanifold_conv(f0, c0, W1, B1, kernel_shape=[3, 3], spatial_shape=S)
    f3, c3 = reference.sparse_conv(np.maximum(f1, 0), c1, W2, **conv)
    expected = reference.to_dense(f3, c3, spatial_shape=S_down, batch_size=2)
    outputs = reference.run(str(tmp_path / "chain.onnx"), {"X": X})
    assert list(outputs) == ["Y"]
    np.testing.assert_array_equal(outputs["Y"], expected)


@pytest.mark.skipif(not (DATA / "nuscenes_centerpoint_voxels.npz").exists(), reason="no nuScenes voxels")
def test_lidar_scale_submanifold_conv(rng):
    # 79,745 voxels on 41×1440×1440 with a 27-tap kernel: must run in seconds (no dense grid), and agree
    # with the dense oracle on a window, at the sites whose whole neighbourhood lies inside that window.
    data = np.load(DATA / "nuscenes_centerpoint_voxels.npz")
    features, coords = data["features"], data["coords"].astype(np.int64)
    S = [int(v) for v in data["spatial_shape"]]
    W = rng.standard_normal((16, features.shape[1], 3, 3, 3)).astype(np.float32)
    B = rng.standard_normal(16).astype(np.float32)
    start = time.perf_counter()
    out, out_coords = reference.submanifold_conv(features, coords, W, B, kernel_shape=[3, 3, 3], spatial_shape=S)
    assert time.perf_counter() - start < 20
    np.testing.assert_array_equal(out_coords, coords)

    window = np.array([12, 48, 48])
    low = np.clip(coords[len(coords) // 2, 1:] - window // 2, 0, np.array(S) - window)
    inside = np.all((coords[:, 1:] >= low) & (coords[:, 1:] < low + window), axis=1) & (coords[:, 0] == 0)
    local = coords[inside] - np.concatenate([[0], low])
    y = dense_oracle("SubmanifoldConv", {"kernel_shape": [3, 3, 3]},
                     densify(features[inside].astype(np.float32), local, 1, window), W, B)
    interior = np.all((local[:, 1:] >= 1) & (local[:, 1:] < window - 1), axis=1)
    assert interior.sum() > 50
    np.testing.assert_allclose(out[inside][interior], gather_sites(y, local[interior]), rtol=1e-4, atol=1e-4)


# --- refusals --------------------------------------------------------------------------------------------

def _conv(op_type, **changes):
    """A small valid 2D case of `op_type` (targets for SparseDeconv), with some attributes changed."""
    attrs = {"kernel_shape": [3, 3], "spatial_shape": [5, 5]}
    attrs.update(changes)
    coords = np.array([[0, 1, 1], [0, 2, 3], [1, 4, 4]], np.int64)
    targets = np.array([[0, 0, 0], [1, 6, 6]], np.int64) if op_type == "SparseDeconv" else None
    return ConvConfig(op_type, attrs, 2, 2, 3, True, np.ones((3, 2), np.float32), coords, targets)


def _with(config, **feeds):
    """The same case with some graph inputs replaced."""
    for key, value in feeds.items():
        setattr(config, key, value)
    return config


REFUSALS = {
    "group": (_conv("SparseConv", group=2), "group=2"),
    "even_submanifold_kernel": (_conv("SubmanifoldConv", kernel_shape=[3, 2]), "odd kernel"),
    "submanifold_stride": (_conv("SubmanifoldConv", strides=[1, 2]), "strides of 1"),
    "output_extent_below_1": (_conv("SparseConv", kernel_shape=[3, 7]), "below 1"),
    "deconv_output_extent_below_1": (_conv("SparseDeconv", pads=[0, 4, 0, 4]), "below 1"),
    "unknown_attribute": (_conv("SparseConv", padding=[1, 1]), "no attribute 'padding'"),
    "duplicated_coords": (_with(_conv("SparseConv"), coords=np.array([[0, 1, 1], [0, 2, 3], [0, 1, 1]])),
                          "row 2 .* duplicated"),
    "coords_beyond_grid": (_with(_conv("SubmanifoldConv"), coords=np.array([[0, 1, 1], [0, 5, 3], [1, 4, 4]])),
                           r"row 1 \[0, 5, 3\] lies outside"),
    "negative_coords": (_with(_conv("SparseDeconv"), coords=np.array([[0, 1, 1], [0, 2, -1], [1, 4, 4]])),
                        "lies outside"),
    "negative_batch": (_with(_conv("SparseConv"), coords=np.array([[0, 1, 1], [-1, 2, 3], [1, 4, 4]])),
                       "negative batch"),
    "int32_coords": (_with(_conv("SparseConv"), coords=np.array([[0, 1, 1], [0, 2, 3], [1, 4, 4]], np.int32)),
                     "int64"),
    "coords_width": (_with(_conv("SparseConv"), coords=np.array([[1, 1], [2, 3], [4, 4]])), r"int64 \[N, 3\]"),
    "feature_rows": (_with(_conv("SubmanifoldConv"), features=np.ones((2, 2), np.float32)), "2 rows"),
    "feature_channels": (_with(_conv("SubmanifoldConv"), features=np.ones((3, 5), np.float32)),
                         "5 input channels"),
    "target_beyond_output_grid": (_with(_conv("SparseDeconv"), target_coords=np.array([[0, 7, 0]])),
                                  r"target_coords row 0 \[0, 7, 0\] lies outside the grid \[7, 7\]"),
    "negative_target": (_with(_conv("SparseDeconv"), target_coords=np.array([[0, -1, 0]])), "target_coords"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusal_names_the_node(case, rng):
    config, reason = REFUSALS[case]
    with pytest.raises(SparseLowerError, match=f"node 'bad_node': .*{reason}"):
        run_node(config, rng, name="bad_node")


def test_to_dense_refuses_a_batch_beyond_batch_size():
    with pytest.raises(SparseLowerError, match="node 'scatter': .*batch index 2"):
        reference.to_dense(np.ones((1, 1), np.float32), np.array([[2, 0, 0]]), spatial_shape=[3, 3], batch_size=2,
                           name="scatter")
