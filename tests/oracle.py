"""Test helpers: random sparse inputs, single-node models, and the dense onnxruntime oracle (docs/source_ops.md).

The oracle knows the source ops only by their attributes: it densifies the input, runs onnxruntime's own
dense `Conv` / `ConvTranspose`, and reads the result at the sites where §3 says outputs exist. It shares
nothing with `sparse_lower.reference` or the lowering, which is what makes it an oracle for both.

Typical use::

    config = random_conv_config(rng)
    model, (W, B) = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, config.target_coords is not None, rng)
    outputs = run_somehow(model, config.feeds)
    assert_matches_oracle(config, W, B, outputs["out_features"], outputs["out_coords"])
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from sparse_lower.errors import SparseLowerError
from sparse_lower.onnx_conventions import SOURCE_DOMAIN
from sparse_lower.schemas import CONV_OPS, conv_geometry

IR_VERSION = 10  # onnxruntime 1.31 refuses models with a newer IR version
OPSET_IMPORTS = [helper.make_opsetid("", 17), helper.make_opsetid(SOURCE_DOMAIN, 1)]


def random_sparse(rng, batch, channels, spatial_shape, density=None, count=None):
    """Draw a random sparse tensor: float32 features [N, C] and int64 coords [N, 1+D].

    Give either `density` (fraction of the batch × grid sites that are active) or `count` (N). Rows are
    unique and in random order, as §2 allows, so order-dependent bugs show. Large grids are cheap: no
    dense grid is built.
    """
    if (density is None) == (count is None):
        raise ValueError("give exactly one of density and count")
    total = batch * prod(spatial_shape)
    if count is None:
        count = int(round(density * total))
    sites = rng.choice(total, size=count, replace=False)
    coords = np.stack(np.unravel_index(sites, (batch, *spatial_shape)), axis=1).astype(np.int64)
    features = rng.standard_normal((count, channels)).astype(np.float32)
    return features, coords.reshape(count, 1 + len(spatial_shape))


def densify(features, coords, batch, spatial_shape):
    """The dense [B, C, *S] float32 tensor holding `features` at `coords` and zeros elsewhere.

    Written here rather than taken from the reference's ToDense so that the oracle stays independent.
    """
    dense = np.zeros((batch, *spatial_shape, features.shape[1]), np.float32)
    dense[tuple(coords.T)] = features
    return np.ascontiguousarray(np.moveaxis(dense, -1, 1))


def gather_sites(dense, coords):
    """The rows [N, C] of a dense [B, C, *S] tensor at `coords` (the inverse of `densify`)."""
    return np.moveaxis(dense, 1, -1)[tuple(coords.T)]


def sparse_node_model(op_type, attrs, cin, cout, ndim, with_bias, with_target, rng, *, name="node"):
    """A model holding one source-op conv node, and its weights `(W, B)` (B is None without bias).

    Graph inputs: `features` [N, cin] float32, `coords` [N, 1+ndim] int64 and, with `with_target`,
    `target_coords` [M, 1+ndim] int64; W and B are initializers; outputs `out_features`, `out_coords`.
    `attrs` are the node's attributes as Python values. The node is called `name`, which error messages
    must quote. Weights are scaled by 1/sqrt(fan-in) so outputs stay near unit size.
    """
    kernel = tuple(attrs["kernel_shape"])
    shape = (cin, cout, *kernel) if op_type == "SparseDeconv" else (cout, cin, *kernel)
    W = (rng.standard_normal(shape) / np.sqrt(cin * prod(kernel))).astype(np.float32)
    B = rng.standard_normal(cout).astype(np.float32) if with_bias else None
    initializers = [numpy_helper.from_array(W, "W")]
    if with_bias:
        initializers.append(numpy_helper.from_array(B, "B"))
    inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", cin]),
              helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 1 + ndim])]
    node_inputs = ["features", "coords", "W", "B" if with_bias else ""]
    if with_target:
        inputs.append(helper.make_tensor_value_info("target_coords", TensorProto.INT64, ["M", 1 + ndim]))
        node_inputs.append("target_coords")
    outputs = [helper.make_tensor_value_info("out_features", TensorProto.FLOAT, ["N_out", cout]),
               helper.make_tensor_value_info("out_coords", TensorProto.INT64, ["N_out", 1 + ndim])]
    node = helper.make_node(op_type, node_inputs, ["out_features", "out_coords"], name=name,
                            domain=SOURCE_DOMAIN, **attrs)
    graph = helper.make_graph([node], f"single_{op_type}", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model, (W, B)


def dense_oracle(op_type, attrs, x_dense, W, B):
    """onnxruntime's dense Conv (SubmanifoldConv, SparseConv) or ConvTranspose (SparseDeconv) of `x_dense`.

    SubmanifoldConv becomes a stride-1 Conv with pads (K−1)/2·d on both sides (its own pads are ignored).
    Returns the full dense result [B, Cout, *S_out], bias everywhere.
    """
    n = len(attrs["kernel_shape"])
    dense_attrs = {key: list(attrs[key]) for key in ("kernel_shape", "strides", "pads", "dilations",
                                                      "output_padding") if key in attrs}
    if op_type == "SubmanifoldConv":
        dilations = dense_attrs.get("dilations", [1] * n)
        half = [(k - 1) // 2 * d for k, d in zip(dense_attrs["kernel_shape"], dilations)]
        dense_attrs.update(strides=[1] * n, pads=half + half)
    _floor_pads(attrs, dense_attrs)
    inputs = ["X", "W"] + (["B"] if B is not None else [])
    initializers = [numpy_helper.from_array(W, "W")] + ([numpy_helper.from_array(B, "B")] if B is not None else [])
    node = helper.make_node("ConvTranspose" if op_type == "SparseDeconv" else "Conv", inputs, ["Y"],
                            **dense_attrs)
    graph = helper.make_graph(
        [node], "dense_oracle",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_dense.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=OPSET_IMPORTS[:1], ir_version=IR_VERSION)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x_dense})[0]


def _floor_pads(attrs, dense_attrs):
    """Under output_sites="floor" the dense op's pads: the given begins, the ends d·(K − 1) − pb, so that
    the dense output extent is ceil(S / s) and output o reads `o·s − pb + k·d`."""
    if attrs.get("output_sites") != "floor":
        return
    n = len(attrs["kernel_shape"])
    begins = list(attrs.get("pads", [0] * (2 * n)))[:n]
    dilations = attrs.get("dilations", [1] * n)
    dense_attrs["pads"] = begins + [d * (k - 1) - p for k, d, p in zip(attrs["kernel_shape"], dilations, begins)]


def floor_sites(attrs, coords):
    """The floor rule's output sites: the distinct (batch, floor(c / s)), in lexicographic order."""
    n = len(attrs["spatial_shape"])
    strides = np.asarray(attrs.get("strides", [1] * n))
    floors = np.concatenate([coords[:, :1], coords[:, 1:] // strides], axis=1)
    return np.unique(floors, axis=0).astype(np.int64).reshape(-1, 1 + n)


def oracle_active_coords(op_type, attrs, coords, batch, target_coords=None):
    """The output coords §3 prescribes, in the prescribed order, found with the dense oracle.

    SubmanifoldConv: the input coords. With target_coords: the targets. Under the floor rule: the distinct
    floor(c / s). Otherwise: every site that some input reaches, in lexicographic order — found by
    convolving the 0/1 occupancy grid with an all-ones kernel, so the count of contributions is exact in
    float32.
    """
    if op_type == "SubmanifoldConv":
        return coords
    if target_coords is not None:
        return target_coords
    if attrs.get("output_sites") == "floor":
        return floor_sites(attrs, coords)
    occupancy = densify(np.ones((len(coords), 1), np.float32), coords, batch, attrs["spatial_shape"])
    ones = np.ones((1, 1, *attrs["kernel_shape"]), np.float32)
    reached = dense_oracle(op_type, attrs, occupancy, ones, None)[:, 0] > 0.5
    return np.argwhere(reached).astype(np.int64)


@dataclass
class ConvConfig:
    """One sparse-conv test case: the op, its attributes, channel counts and the input feeds."""

    op_type: str
    attrs: dict
    batch: int
    cin: int
    cout: int
    with_bias: bool
    features: np.ndarray
    coords: np.ndarray
    target_coords: np.ndarray | None = None

    @property
    def ndim(self) -> int:
        return len(self.attrs["kernel_shape"])

    @property
    def output_shape(self) -> tuple:
        """The output grid extent, from the schemas (the oracle's result shape confirms it)."""
        return conv_geometry(_node(self.op_type, self.attrs)).output_shape

    @property
    def feeds(self) -> dict:
        """The graph inputs of `sparse_node_model` for this case."""
        feeds = {"features": self.features, "coords": self.coords}
        if self.target_coords is not None:
            feeds["target_coords"] = self.target_coords
        return feeds


def random_conv_config(rng) -> ConvConfig:
    """Draw a random valid sparse-conv case small enough for the dense oracle to be fast.

    D in {1, 2, 3} (grids up to 24, 14, 10 per dim), kernels 1–5 (odd for SubmanifoldConv, which also
    gets random pads it must ignore), strides 1–3, asymmetric pads below the kernel size, dilations 1–2,
    output_padding below the stride (onnxruntime's ConvTranspose refuses more), batch 1–3, 1–8 channels,
    bias half the time, about one empty input in ten, and target coords for half of the deconvolutions:
    random output sites, so some receive contributions and some only the bias.
    """
    while True:
        op_type = str(rng.choice(CONV_OPS))
        ndim = int(rng.integers(1, 4))
        spatial_shape = rng.integers(1, {1: 24, 2: 14, 3: 10}[ndim] + 1, ndim)
        if op_type == "SubmanifoldConv":
            kernel = rng.choice([1, 3, 5], ndim)
            strides = np.ones(ndim, np.int64)
        else:
            kernel = rng.integers(1, 6, ndim)
            strides = rng.integers(1, 4, ndim)
        attrs = {"kernel_shape": kernel, "strides": strides,
                 "pads": rng.integers(0, np.concatenate([kernel, kernel])),
                 "dilations": rng.integers(1, 3, ndim), "spatial_shape": spatial_shape}
        if op_type == "SparseDeconv":
            attrs["output_padding"] = rng.integers(0, strides)
        attrs = {key: [int(v) for v in value] for key, value in attrs.items()}
        try:
            output_shape = conv_geometry(_node(op_type, attrs)).output_shape
        except SparseLowerError:
            continue
        break
    batch, cin, cout = (int(v) for v in rng.integers(1, [4, 9, 9]))
    count = 0 if rng.random() < 0.1 else max(1, int(rng.uniform(0.02, 0.5) * batch * prod(spatial_shape)))
    features, coords = random_sparse(rng, batch, cin, spatial_shape, count=count)
    target_coords = None
    if op_type == "SparseDeconv" and rng.random() < 0.5:
        sites = batch * prod(output_shape)
        _, target_coords = random_sparse(rng, batch, 1, output_shape, count=int(rng.integers(0, min(sites, 64) + 1)))
    return ConvConfig(op_type, attrs, batch, cin, cout, bool(rng.random() < 0.5), features, coords, target_coords)


def assert_matches_oracle(config: ConvConfig, W, B, out_features, out_coords, rtol=1e-4, atol=1e-5):
    """Assert that a sparse op's outputs are what §3 prescribes for `config`, per the dense oracle.

    Checks the output coords (set and order), the features at those coords, and that densify(output)
    equals the dense result restricted to the output sites with zeros elsewhere.
    """
    y = dense_oracle(config.op_type, config.attrs,
                     densify(config.features, config.coords, config.batch, config.attrs["spatial_shape"]), W, B)
    assert y.shape[2:] == tuple(config.output_shape), "the schemas' output extent differs from onnxruntime's"
    expected_coords = oracle_active_coords(config.op_type, config.attrs, config.coords, config.batch,
                                           config.target_coords)
    assert out_coords.dtype == np.int64 and out_features.dtype == np.float32
    np.testing.assert_array_equal(out_coords, expected_coords)
    assert out_features.shape == (len(expected_coords), y.shape[1])
    np.testing.assert_allclose(out_features, gather_sites(y, expected_coords), rtol=rtol, atol=atol)
    mask = densify(np.ones((len(expected_coords), 1), np.float32), expected_coords, config.batch, y.shape[2:])
    np.testing.assert_allclose(densify(out_features, out_coords, config.batch, y.shape[2:]), y * mask,
                               rtol=rtol, atol=atol)


def _node(op_type, attrs):
    """A bare node with these attributes, for asking the schemas about a config."""
    return helper.make_node(op_type, [], [], name="config", domain=SOURCE_DOMAIN, **attrs)


def _run_dense(node, inputs: dict) -> np.ndarray:
    """One standard node with a float output, run by onnxruntime on one thread (ScatterND's reductions race on more)."""
    graph = helper.make_graph(
        [node], "dense_oracle",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
         for name, value in inputs.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def max_pool_oracle(attrs, features, coords, batch):
    """SparseMaxPool by onnxruntime's dense `MaxPool` of the input densified with −inf at inactive sites:
    the outputs are the sites of the result above the lowest float32 (where onnxruntime's maximum starts:
    a window without an active input), sorted, or with `submanifold` the input sites in their order.
    Returns (out_features, out_coords)."""
    spatial = list(attrs["spatial_shape"])
    n = len(spatial)
    dense = np.full((batch, *spatial, features.shape[1]), -np.inf, np.float32)
    dense[tuple(coords.T)] = features
    dense = np.ascontiguousarray(np.moveaxis(dense, -1, 1))
    pool = {key: list(attrs[key]) for key in ("kernel_shape", "strides", "pads", "dilations") if key in attrs}
    if attrs.get("submanifold"):
        dilations = pool.get("dilations", [1] * n)
        half = [(k - 1) // 2 * d for k, d in zip(pool["kernel_shape"], dilations)]
        pool.update(strides=[1] * n, pads=half + half)
    _floor_pads(attrs, pool)
    out = _run_dense(helper.make_node("MaxPool", ["X"], ["Y"], **pool), {"X": dense})
    channels_last = np.moveaxis(out, 1, -1)
    if attrs.get("submanifold"):
        out_coords = coords
    elif attrs.get("output_sites") == "floor":
        out_coords = floor_sites(attrs, coords)
    else:
        out_coords = np.argwhere(channels_last[..., 0] > np.finfo(np.float32).min).astype(np.int64).reshape(-1, 1 + n)
    return channels_last[tuple(out_coords.T)], out_coords


def coalesce_oracle(attrs, features, coords, batch):
    """Coalesce by onnxruntime's `ScatterND` with reduction add (or max, from −inf) of every row into a dense
    `[B, *S, C]` grid; the outputs are the sites a `ScatterND` of ones counted, in grid order."""
    spatial = list(attrs["spatial_shape"])
    reduction = attrs.get("reduction", "sum")
    shape = (batch, *spatial, features.shape[1])
    start = np.zeros(shape, np.float32) if reduction == "sum" else np.full(shape, -np.inf, np.float32)
    scatter = helper.make_node("ScatterND", ["data", "indices", "updates"], ["Y"],
                               reduction="add" if reduction == "sum" else "max")
    dense = _run_dense(scatter, {"data": start, "indices": coords, "updates": features})
    counts = _run_dense(helper.make_node("ScatterND", ["data", "indices", "updates"], ["Y"], reduction="add"),
                        {"data": np.zeros(shape[:-1], np.float32), "indices": coords,
                         "updates": np.ones(len(coords), np.float32)})
    out_coords = np.argwhere(counts > 0).astype(np.int64).reshape(-1, 1 + len(spatial))
    return dense[tuple(out_coords.T)], out_coords
