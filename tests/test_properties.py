"""Property-based tests (hypothesis) over the op space of docs/source_ops.md, for every target and compute form.

Each example is a random graph of one to four sparse layers (SubmanifoldConv, SparseConv, SparseDeconv,
inverse SparseDeconv onto an earlier layer's coords) in 1, 2 or 3 dimensions, with Relu and residual Add
between them, optionally behind ToSparse and in front of ToDense, on an input that is empty, one site,
every site or a random fraction of them, batch 1–3. It is lowered for one target (gpu unfold / rulebook
/ auto, nna gather / scatter / matmul with and without a capacity or fused taps, hybrid, portable), run in
onnxruntime, and compared with the NumPy reference: coords exactly, features to float32 rounding.

CI runs the "ci" profile: a fixed (derandomized) few hundred examples. `python tools/fuzz.py` runs the
long campaign (profile "campaign", fresh random examples; SPARSE_LOWER_FUZZ_EXAMPLES per test).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from math import prod

import numpy as np
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from helpers import run_lowered
from oracle import densify
from sparse_lower import reference
from sparse_lower.models import SparseModelBuilder
from sparse_lower.schemas import ConvGeometry

settings.register_profile("ci", max_examples=150, derandomize=True, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("campaign", max_examples=int(os.environ.get("SPARSE_LOWER_FUZZ_EXAMPLES", "2500")),
                          deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("SPARSE_LOWER_HYPOTHESIS_PROFILE", "ci"))

MAX_EXTENT = {1: 16, 2: 9, 3: 6}  # per dimension of the input grid: the reference stays fast
MAX_VOLUME = 400  # of any grid in the graph (a deconv grows it)
MATMUL_MAX_ROWS = 300  # the matmul combine's scatter matrices are O(rows²) per tap


# ----------------------------------------------------------------------------------------------------
# Drawing graphs


@dataclass
class Level:
    """A tensor the graph has made: its names, channels and grid, and the strided conv that made it."""

    features: str
    coords: str
    channels: int
    grid: tuple
    forward: ConvGeometry | None = None  # the SparseConv whose output this is (for an inverse conv)
    forward_input: "Level | None" = None


@dataclass
class Graph:
    model: object
    feeds: dict
    max_rows: int  # an upper bound of the active rows of any tensor: batch × the largest grid

    def __repr__(self) -> str:
        """What a falsifying example prints: every node with its attributes, and the input shapes."""
        nodes = [f"{n.op_type}({', '.join(f'{a.name}={list(a.ints)}' for a in n.attribute)})" for n in self.model.graph.node]
        inputs = {name: value.shape for name, value in self.feeds.items()}
        return f"Graph({' -> '.join(nodes)}; inputs {inputs})"


def _geometry(op_type, kernel, strides, pads, dilations, grid, output_padding) -> ConvGeometry:
    return ConvGeometry(op_type, tuple(kernel), tuple(strides), tuple(pads), tuple(dilations), tuple(grid),
                        tuple(output_padding))


@st.composite
def conv_layer(draw, kind: str, grid: tuple):
    """The attributes of one layer on `grid` whose output grid is at least 1 and at most MAX_VOLUME."""
    n = len(grid)
    small = st.integers(1, 3)
    if kind == "subm":
        kernel = draw(st.lists(st.sampled_from([1, 3, 5]), min_size=n, max_size=n))
        strides, pads, output_padding = [1] * n, [0] * (2 * n), [0] * n
    else:
        kernel = draw(st.lists(small, min_size=n, max_size=n))
        strides = draw(st.lists(small, min_size=n, max_size=n))
        pads = [draw(st.integers(0, k)) for k in kernel + kernel]
        output_padding = [draw(st.integers(0, s - 1)) for s in strides] if kind == "deconv" else [0] * n
    dilations = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    op_type = {"subm": "SubmanifoldConv", "conv": "SparseConv", "deconv": "SparseDeconv"}[kind]
    geometry = _geometry(op_type, kernel, strides, pads, dilations, grid, output_padding)
    out = geometry.output_shape
    assume(min(out) >= 1 and prod(out) <= MAX_VOLUME)
    return geometry


def _attrs(geometry: ConvGeometry) -> dict:
    attrs = {"dilations": list(geometry.dilations)}
    if geometry.op_type != "SubmanifoldConv":
        attrs.update(strides=list(geometry.strides), pads=list(geometry.pads))
    if geometry.op_type == "SparseDeconv":
        attrs["output_padding"] = list(geometry.output_padding)
    return attrs


def _inverse(forward: ConvGeometry) -> ConvGeometry:
    """spconv's SparseInverseConv of `forward`: its geometry, back onto the forward input grid (§3)."""
    n = len(forward.kernel_shape)
    S, K, s, p, d = forward.spatial_shape, forward.kernel_shape, forward.strides, forward.pads, forward.dilations
    output_padding = [(S[i] + p[i] + p[n + i] - d[i] * (K[i] - 1) - 1) % s[i] for i in range(n)]
    return _geometry("SparseDeconv", K, s, p, d, forward.output_shape, output_padding)


@st.composite
def sparse_graphs(draw) -> Graph:
    ndim = draw(st.integers(1, 3))
    grid = tuple(draw(st.lists(st.integers(1, MAX_EXTENT[ndim]), min_size=ndim, max_size=ndim)))
    batch = draw(st.integers(1, 3))
    cin = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    builder = SparseModelBuilder(ndim, cin, rng)
    level = Level(builder.features, builder.coords, cin, grid)
    largest = prod(grid)
    for _ in range(draw(st.integers(1, 4))):
        kinds = ["subm", "conv", "deconv"] + (["inverse"] if level.forward is not None else [])
        kind = draw(st.sampled_from(kinds))
        event(f"layer {kind}")
        cout = draw(st.integers(1, 6))
        bias = draw(st.booleans())
        if kind == "inverse":
            geometry, target = _inverse(level.forward), level.forward_input
            builder.conv("SparseDeconv", cout, geometry.kernel_shape, geometry.spatial_shape, bias,
                         target_coords=target.coords, **_attrs(geometry))
            level = Level(builder.features, builder.coords, cout, target.grid, target.forward, target.forward_input)
        else:
            geometry = draw(conv_layer(kind, level.grid))
            previous = level
            builder.conv(geometry.op_type, cout, geometry.kernel_shape, level.grid, bias, **_attrs(geometry))
            level = Level(builder.features, builder.coords, cout, geometry.output_shape)
            if kind == "conv":
                level.forward, level.forward_input = geometry, previous
            elif kind == "subm":
                level.forward, level.forward_input = previous.forward, previous.forward_input
                if cout == previous.channels and draw(st.booleans()):
                    builder.add(previous.features)
        largest = max(largest, prod(level.grid))
        if draw(st.booleans()):
            builder.relu()
    model = builder.build()
    features, coords = _input(draw, rng, batch, cin, grid)
    feeds = {"features": features, "coords": coords}
    event(f"{ndim}-D")
    event(f"batch {batch}")
    if draw(st.booleans()):
        event("dense input and output")
        model, feeds = _dense_boundaries(model, feeds, batch, grid, level.grid, level.channels)
    return Graph(model, feeds, batch * largest)


def _input(draw, rng, batch: int, channels: int, grid: tuple):
    """Features and coords of `count` distinct random sites: none, one, all, or a random fraction."""
    total = batch * prod(grid)
    density = draw(st.sampled_from(["random"] * 4 + ["full", "one", "empty"]))  # shrinks towards random
    event(f"input {density}")
    count = {"empty": 0, "one": 1, "full": total}[density] if density != "random" else draw(st.integers(1, total))
    sites = rng.permutation(total)[:count]
    coords = np.stack(np.unravel_index(sites, (batch, *grid)), axis=1).astype(np.int64).reshape(count, 1 + len(grid))
    return rng.standard_normal((count, channels)).astype(np.float32), coords


def _dense_boundaries(model, feeds, batch, grid, out_grid, out_channels):
    """The same layers behind ToSparse and in front of ToDense: the input is a dense X (zero at the
    inactive sites; the active ones are non-zero almost surely), the output a dense Y."""
    graph = model.graph
    features, coords = (value.name for value in graph.input)
    cin = feeds["features"].shape[1]
    last_features, last_coords = (value.name for value in graph.output)
    graph.node.insert(0, helper.make_node("ToSparse", ["X"], [features, coords], name="to_sparse", domain="sparse"))
    graph.node.append(helper.make_node("ToDense", [last_features, last_coords], ["Y"], name="to_dense", domain="sparse",
                                       spatial_shape=list(out_grid), batch_size=batch))
    del graph.input[:]
    graph.input.append(helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, cin, *grid]))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, out_channels, *out_grid]))
    return model, {"X": densify(feeds["features"], feeds["coords"], batch, grid)}


# ----------------------------------------------------------------------------------------------------
# Checking one graph on one target


def assert_lowered_matches_reference(graph: Graph, target: str, **options) -> None:
    expected = reference.run(graph.model, graph.feeds)
    got = run_lowered(graph.model, graph.feeds, threads=2, target=target, **options)
    assert list(got) == list(expected), "outputs dropped or reordered"
    for name, want in expected.items():
        have = got[name]
        assert have.dtype == want.dtype and have.shape == want.shape, (name, have.shape, want.shape)
        if want.dtype == np.int64:
            np.testing.assert_array_equal(have, want, err_msg=name)
        else:
            scale = max(1.0, float(np.abs(want).max(initial=0.0)))
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5 * scale, err_msg=name)


@given(graph=sparse_graphs(), strategy=st.sampled_from(["auto", "unfold", "rulebook", "fused"]))
def test_gpu_target_matches_the_reference(graph, strategy):
    assert_lowered_matches_reference(graph, "gpu", strategy=strategy)


@given(graph=sparse_graphs(), combine=st.sampled_from(["gather", "scatter", "matmul", "pairs", "unfold"]), fuse_taps=st.booleans(),
       capacity=st.booleans())
def test_nna_target_matches_the_reference(graph, combine, fuse_taps, capacity):
    assume(combine != "matmul" or graph.max_rows <= MATMUL_MAX_ROWS)
    assert_lowered_matches_reference(graph, "nna", combine=combine, fuse_taps=fuse_taps and combine not in ("pairs", "unfold"),
                                     max_active=max(graph.max_rows, 1) if capacity else None)


@given(graph=sparse_graphs(), combine=st.sampled_from(["gather", "scatter", "pairs", "unfold"]))
def test_hybrid_target_matches_the_reference(graph, combine):
    assert_lowered_matches_reference(graph, "hybrid", combine=combine)


@given(graph=sparse_graphs())
def test_portable_target_matches_the_reference(graph):
    """In a plain onnxruntime session: helpers.session opens one for a model without custom ops."""
    assert_lowered_matches_reference(graph, "portable")
