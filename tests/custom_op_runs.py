"""Running one custom op of the library alone, and the random inputs of its tests: shared by
test_custom_ops (the CPU library against its NumPy reference) and test_cuda_bodies (the CUDA kernels'
bodies, on the host, against the CPU library)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import custom_op_reference as ref
from sparse_lower.runtime import create_session

DOMAIN = "sparse_lower"
ELEMENT_TYPES = {np.dtype(t): helper.np_dtype_to_tensor_dtype(np.dtype(t))
                 for t in (np.float32, np.int64, np.float64, np.int32, np.uint8, np.int8, np.bool_)}


# ----------------------------------------------------------------------------------------------------
# Running one op


def op_model(op_type: str, inputs: dict, n_outputs: int, static: bool = False, **attributes) -> onnx.ModelProto:
    """A model of one node, its inputs in the order of `inputs` (a None value: that optional input
    absent); input shapes are left unknown unless static (which exercises shape inference)."""
    outputs = [f"output{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, [name if value is not None else "" for name, value in inputs.items()], outputs,
                            domain=DOMAIN, **attributes)
    inputs = present(inputs)
    graph = helper.make_graph(
        [node],
        op_type,
        [
            helper.make_tensor_value_info(
                name, ELEMENT_TYPES[value.dtype], value.shape if static else [None] * value.ndim)
            for name, value in inputs.items()
        ],
        [helper.make_empty_tensor_value_info(name) for name in outputs],  # types and shapes as the op infers
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def session(op_type, inputs, n_outputs, threads=1, static=False, **attributes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return create_session(op_model(op_type, inputs, n_outputs, static, **attributes), sess_options=options)


def present(inputs: dict) -> dict:
    return {name: value for name, value in inputs.items() if value is not None}


def run(op_type, inputs: dict, n_outputs: int, threads: int = 1, **attributes) -> list[np.ndarray]:
    return session(op_type, inputs, n_outputs, threads, **attributes).run(None, present(inputs))


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same shape, dtype and bits (floats included: the ops only copy, and fold in a fixed order)."""
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == np.float32:
        actual, expected = actual.view(np.uint32), expected.view(np.uint32)
    np.testing.assert_array_equal(actual, expected)


# ----------------------------------------------------------------------------------------------------
# Random inputs


def random_geometry(rng: np.random.Generator, kind: str) -> dict:
    """Attributes of a map builder: D = 1..3, kernels 1..5, strides 1..3, asymmetric pads, dilations 1..2."""
    while True:
        D = int(rng.integers(1, 4))
        attributes = {
            "spatial_shape": [int(v) for v in rng.integers(1, {1: 40, 2: 12, 3: 7}[D] + 1, D)],
            "kernel_shape": [
                int(v) for v in (rng.choice([1, 3, 5], D) if kind == "submanifold" else rng.integers(1, 6, D))
            ],
            "dilations": [int(v) for v in rng.integers(1, 3, D)],
        }
        if kind != "submanifold":
            attributes["strides"] = [int(v) for v in rng.integers(1, 4, D)]
            attributes["pads"] = [int(v) for v in rng.integers(0, 3, 2 * D)]
        if kind == "transposed":
            attributes["output_padding"] = [
                int(rng.integers(0, max(s, d))) for s, d in zip(attributes["strides"], attributes["dilations"])
            ]
        if all(v >= 1 for v in output_extent(kind, attributes)):
            return attributes


def output_extent(kind: str, a: dict) -> list[int]:
    if kind == "submanifold":
        return a["spatial_shape"]
    if kind == "strided":
        return ref.strided_extent(a["spatial_shape"], a["kernel_shape"], a["strides"], a["pads"], a["dilations"])
    return ref.transposed_extent(a["spatial_shape"], a["kernel_shape"], a["strides"], a["pads"], a["dilations"],
                                 a["output_padding"])


def random_coords(rng: np.random.Generator, spatial_shape, batch: int, count: int | None = None) -> np.ndarray:
    """Distinct coordinates in random row order; about a third of the grid unless count is given."""
    total = batch * ref.volume(spatial_shape)
    if count is None:
        count = int(rng.integers(0, total // 3 + 2))
    sites = rng.choice(total, size=min(count, total), replace=False)
    return ref.decode_sites(sites, spatial_shape)


def coords_for(rng, seed, spatial_shape) -> np.ndarray:
    """Every tenth seed gives an empty input (N = 0)."""
    batch = int(rng.integers(1, 4))
    return random_coords(rng, spatial_shape, batch, 0 if seed % 10 == 0 else None)


# ----------------------------------------------------------------------------------------------------
# Data movement


def random_index(rng, limit: int, shape) -> np.ndarray:
    """Indices in [0, limit) with about a third -1."""
    idx = rng.integers(0, max(limit, 1), shape)
    return np.where((rng.random(shape) < 0.3) | (limit == 0), -1, idx).astype(np.int64)


def random_shape(rng, seed, max_rank: int) -> tuple:
    """A shape of rank 1 to max_rank whose first dimension is 0 for every tenth seed (an empty input)."""
    shape = [int(rng.integers(1, 20)) for _ in range(int(rng.integers(1, max_rank + 1)))]
    if seed % 10 == 0:
        shape[0] = 0
    return tuple(shape)


def index_shape(rng, seed) -> tuple:
    """[..., K] of rank 1 to 3 with K up to 27."""
    return (*random_shape(rng, seed, 3)[:-1], int(rng.integers(1, 28)))


def int8_conv_inputs(rng, n, m, taps, cin, cout, weight_limit=63) -> dict:
    """IndexedConvInt8's inputs: rows ≥ 0 mostly (some negative, some past the range, a NaN: they clamp),
    weights within ±weight_limit (63: 7 bits, 127: 8 bits), positive scales."""
    x = np.abs(rng.standard_normal((n, cin))).astype(np.float32)
    if x.size:
        x.flat[rng.integers(0, x.size, 3)] = [-1.0, 1e6, np.nan]
    return {"X": x, "idx": random_index(rng, n, (m, taps)),
            "W": rng.integers(-weight_limit, weight_limit + 1, (taps, cin, cout)).astype(np.int8),
            "x_scale": rng.uniform(0.005, 0.02, cin).astype(np.float32),
            "w_scale": rng.uniform(1e-3, 1e-2, (taps, cout)).astype(np.float32)}


def conv_cases(seeds) -> list[tuple[str, dict]]:
    """(op, inputs) of IndexedConvInt8 and IndexedConv on random shapes up to 139 channels (whole and
    partial tiles of 4, 8, 16 and 32 columns, and of quads and octets of channels; a third of the 8-bit
    convs with weights past ±63), two per seed: what the vector paths are compared on."""
    cases = []
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        n, m = int(rng.integers(1, 300)), int(rng.integers(1, 700))
        taps, cin, cout = int(rng.integers(1, 28)), int(rng.integers(1, 140)), int(rng.integers(1, 140))
        inputs = int8_conv_inputs(rng, n, m, taps, cin, cout, weight_limit=127 if seed % 3 == 0 else 63)
        cases.append(("IndexedConvInt8", inputs))
        cases.append(("IndexedConv", {"X": rng.standard_normal((n, cin)).astype(np.float32), "idx": inputs["idx"],
                                      "W": rng.standard_normal((taps, cin, cout)).astype(np.float32)}))
    return cases
