"""The floor rule (`output_sites="floor"`, docs/source_ops.md): the output sites of a strided SparseConv or
SparseMaxPool are the distinct `floor(i / s)` of its inputs, as in MinkowskiEngine, TorchSparse and
WarpConvNet. The reference against onnxruntime's dense Conv and MaxPool (pads `pb`, `d·(K − 1) − pb`,
read at those sites), and every target's lowering against the same oracle, on random geometries from
1-D to 3-D with batches and empty frames, and by hand on MinkowskiEngine's two usual downsamplings."""

from __future__ import annotations

import numpy as np
import pytest

import sparse_lower
from helpers import session
from oracle import ConvConfig, assert_matches_oracle, random_sparse, sparse_node_model
from test_merge_ops import TARGETS, check_pool
from sparse_lower import reference
from sparse_lower.errors import SparseLowerError
from sparse_lower.runtime import drop_padding, pad_rows


def random_floor_conv(rng) -> ConvConfig:
    """A random floor-rule SparseConv: the engines' own offsets (centred for odd kernels, from 0 for even
    ones) half the time, any begin pad up to d·(K − 1) otherwise; strides 1–3 (1: outputs = inputs, even
    kernels included)."""
    ndim = int(rng.integers(1, 4))
    spatial = rng.integers(1, {1: 24, 2: 14, 3: 9}[ndim] + 1, ndim).tolist()
    kernel = rng.integers(1, 5, ndim).tolist()
    dilations = rng.integers(1, 3, ndim).tolist()
    reach = [d * (k - 1) for k, d in zip(kernel, dilations)]
    if rng.random() < 0.5:
        begins = [r // 2 if k % 2 else 0 for k, r in zip(kernel, reach)]
    else:
        begins = [int(rng.integers(0, r + 1)) for r in reach]
    ends = rng.integers(0, 3, ndim).tolist()  # ignored by the rule
    attrs = {"kernel_shape": kernel, "strides": rng.integers(1, 4, ndim).tolist(), "pads": begins + ends,
             "dilations": dilations, "spatial_shape": spatial, "output_sites": "floor"}
    batch, cin, cout = (int(v) for v in rng.integers(1, [4, 7, 7]))
    count = 0 if rng.random() < 0.1 else max(1, int(rng.uniform(0.05, 0.6) * batch * np.prod(spatial)))
    features, coords = random_sparse(rng, batch, cin, spatial, count=count)
    return ConvConfig("SparseConv", attrs, batch, cin, cout, bool(rng.random() < 0.5), features, coords)


def floor_conv_targets(batch):
    return [*TARGETS, ("nna", {"combine": "gather"}), ("nna", {"max_active": 4096, "layout": "rows"}),
            ("nna", {"max_active": 4096, "combine": "scatter"}), ("portable", {"max_active": 4096, "max_batch": batch})]


@pytest.mark.parametrize("seed", range(40))
def test_floor_conv_matches_the_dense_oracle_on_every_target(seed):
    rng = np.random.default_rng(4000 + seed)
    config = random_floor_conv(rng)
    model, (W, B) = sparse_node_model("SparseConv", config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, False, rng)
    out, out_coords = reference.sparse_conv(config.features, config.coords, W, B, **config.attrs)
    assert_matches_oracle(config, W, B, out, out_coords)
    for target, options in floor_conv_targets(config.batch):
        lowered = sparse_lower.lower(model, target=target, check_each_pass=True, **options)
        run = session(lowered)
        feeds = pad_rows(lowered, config.feeds) if "max_active" in options else config.feeds
        outputs = drop_padding(dict(zip(["out_features", "out_coords"], run.run(["out_features", "out_coords"], feeds))))
        np.testing.assert_array_equal(outputs["out_coords"], out_coords, err_msg=f"{target} {options}")
        np.testing.assert_allclose(outputs["out_features"], out, rtol=1e-4, atol=1e-5, err_msg=f"{target} {options}")


def random_floor_pool(rng):
    """A random floor-rule pooling whose windows hold their own sites: dilation 1, kernel ≥ stride."""
    ndim = int(rng.integers(1, 4))
    spatial = rng.integers(2, 8, ndim).tolist()
    strides = rng.integers(1, 4, ndim).tolist()
    kernel = [int(s + rng.integers(0, 2)) for s in strides]
    begins = [int(rng.integers(0, k - s + 1)) for k, s in zip(kernel, strides)]
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": begins + [0] * ndim, "spatial_shape": spatial,
             "output_sites": "floor"}
    batch = int(rng.integers(1, 4))
    total = batch * int(np.prod(spatial))
    features, coords = random_sparse(rng, batch, int(rng.integers(1, 5)), spatial, count=int(rng.integers(0, total + 1)))
    return attrs, batch, features, coords


@pytest.mark.parametrize("seed", range(20))
def test_floor_pool_matches_the_dense_oracle_on_every_target(seed):
    check_pool(*random_floor_pool(np.random.default_rng(5000 + seed)))


def test_minkowski_downsamplings_worked_by_hand():
    """1-D, one channel, weights 1, 10, 100 by tap: inputs at 0, 1, 4, 7 on a grid of 9."""
    coords = np.array([[0, 0], [0, 1], [0, 4], [0, 7]], np.int64)
    features = np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
    # Kernel 2, stride 2, offsets {0, 1}: outputs floor(i / 2) = 0, 2, 3 on a grid of ceil(9 / 2) = 5.
    out, out_coords = reference.sparse_conv(features, coords, np.array([[[1.0, 10.0]]], np.float32),
                                            kernel_shape=[2], strides=[2], spatial_shape=[9], output_sites="floor")
    np.testing.assert_array_equal(out_coords, [[0, 0], [0, 2], [0, 3]])
    np.testing.assert_array_equal(out[:, 0], [1 + 20, 3, 40])
    # Kernel 3, stride 2, offsets {−1, 0, 1}: output o reads 2o − 1, 2o, 2o + 1. spconv's rule also makes
    # outputs at 1 (reached from 1) and 4 (from 7), which no floor(i / 2) gives.
    out, out_coords = reference.sparse_conv(features, coords, np.array([[[1.0, 10.0, 100.0]]], np.float32),
                                            kernel_shape=[3], strides=[2], pads=[1, 1], spatial_shape=[9],
                                            output_sites="floor")
    np.testing.assert_array_equal(out_coords, [[0, 0], [0, 2], [0, 3]])
    np.testing.assert_array_equal(out[:, 0], [10 * 1 + 100 * 2, 10 * 3, 100 * 4])
    reached, reached_coords = reference.sparse_conv(features, coords, np.array([[[1.0, 10.0, 100.0]]], np.float32),
                                                    kernel_shape=[3], strides=[2], pads=[1, 1], spatial_shape=[9])
    np.testing.assert_array_equal(reached_coords[:, 1], [0, 1, 2, 3, 4])


@pytest.mark.parametrize("op_type, attrs, message", [
    ("SparseConv", {"kernel_shape": [3], "strides": [2], "pads": [3, 0], "output_sites": "floor"},
     r"pads begins \[3\] exceed d·\(K − 1\) = \[2\]"),
    ("SparseConv", {"kernel_shape": [3], "strides": [2], "output_sites": "ceil"}, r"output_sites 'ceil' is not defined"),
    ("SparseMaxPool", {"kernel_shape": [3], "submanifold": 1, "output_sites": "floor"},
     r"output_sites='floor' is a rule of strided outputs"),
    ("SparseMaxPool", {"kernel_shape": [2], "strides": [3], "output_sites": "floor"},
     r"a pooling window must hold the s sites of its own output"),
])
def test_bad_floor_attributes_are_refused_naming_the_node(op_type, attrs, message):
    features, coords = np.zeros((1, 1), np.float32), np.zeros((1, 2), np.int64)
    with pytest.raises(SparseLowerError, match=message) as error:
        if op_type == "SparseConv":
            reference.sparse_conv(features, coords, np.ones((1, 1, attrs["kernel_shape"][0]), np.float32),
                                  spatial_shape=[8], name="down", **attrs)
        else:
            reference.sparse_max_pool(features, coords, spatial_shape=[8], name="down", **attrs)
    assert "down" in str(error.value)
