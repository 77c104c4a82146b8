"""ScatterToDense: spconv's `.dense()` spelled in standard ops (a ScatterND of a sparse tensor's rows at
its coords into zeros) becomes ToDense, so that every target lowers it as its own dense boundary, and
the portable static form (whose sparse tensors carry padding rows) takes such models. Near misses stay
ScatterNDs and still compute what they say. The real AWML export (torch.onnx's spelling, Autoware's
int32 casts) is in test_wild and test_portable_runtimes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sparse_lower
from helpers import session
from sparse_lower import reference
from sparse_lower.models.builder import SparseModelBuilder
from sparse_lower.onnx_conventions import OPSET, SOURCE_DOMAIN
from sparse_lower.passes.scatter_to_dense import densifying_scatters
from sparse_lower.runtime import drop_padding, pad_rows

GRID, BATCH, COUT = (6, 6, 7), 2, 3  # z and y of one extent: the rows with them swapped still fit


def densified(spelling: str, rng) -> onnx.ModelProto:
    """SubM → Relu on (batch, z, y, x) rows, then a ScatterND into [B, *S, C] written as `spelling`."""
    b = SparseModelBuilder(3, 4, rng).conv("SubmanifoldConv", COUT, (3, 3, 3), GRID).relu()
    w = b.writer
    shape = [BATCH, *GRID, COUT]
    zeros_value = {"ones": np.ones(1, np.float32)}.get(spelling, np.zeros(1, np.float32))
    if spelling == "rows_sized":  # zeros as many as the rows: their shape follows the frame, no grid
        (rows_shape,) = w.node("Shape", [b.features], ["rows_shape"], "rows_shape")
        (count,) = w.node("Slice", [rows_shape, w.constant("zero", np.array([0])), w.constant("one", np.array([1]))],
                          ["count"], "count")
        (size,) = w.node("Concat", [count, w.constant("rest", np.array(shape[1:]))], ["size"], "size", axis=0)
    else:
        size = w.constant("size", np.array(shape))
    (zeros,) = w.node("ConstantOfShape", [size], ["zeros"], "zeros",
                      value=onnx.numpy_helper.from_array(zeros_value))
    indices = b.coords
    if spelling == "columns":  # (batch, y, z, x): another site than the row's
        (indices,) = w.node("Gather", [b.coords, w.constant("order", np.array([0, 2, 1, 3]))], ["swapped"], "swap",
                            axis=1)
    elif spelling != "direct":  # int32 and back, as Autoware's out_indices
        (narrow,) = w.node("Cast", [b.coords], ["narrow"], "narrow", to=TensorProto.INT32)
        (indices,) = w.node("Cast", [narrow], ["wide"], "wide", to=TensorProto.INT64)
    attrs = {"reduction": "add"} if spelling == "add" else {}
    (scattered,) = w.node("ScatterND", [zeros, indices, b.features], ["scattered"], "scatter", **attrs)
    out = scattered
    if spelling != "channels_last":
        (out,) = w.node("Transpose", [scattered], ["dense"], "channels_first", perm=[0, 4, 1, 2, 3])
        shape = [BATCH, COUT, *GRID]
    output = helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)
    return w.model("densified", [output], {"": OPSET, SOURCE_DOMAIN: 1})


def frame(rng, count=40):
    sites = rng.choice(BATCH * int(np.prod(GRID)), size=count, replace=False)
    coords = np.column_stack(np.unravel_index(sites, (BATCH, *GRID))).astype(np.int64)
    return {"features": rng.standard_normal((count, 4)).astype(np.float32), "coords": coords}


def run(model, target, feeds, **options):
    lowered = sparse_lower.lower(model, target=target, check_each_pass=True, **options)
    return lowered, drop_padding(dict(zip([o.name for o in lowered.graph.output],
                                          session(lowered).run(None, pad_rows(lowered, feeds)))))


CASES = [("gpu", {}), ("nna", {}), ("portable", {}), ("portable", {"max_active": 64, "max_batch": BATCH})]


@pytest.mark.parametrize("spelling", ["direct", "casts", "channels_last"])
@pytest.mark.parametrize("target, options", CASES)
def test_a_dense_of_the_rows_becomes_to_dense(spelling, target, options, rng):
    model = densified(spelling, rng)
    (found,) = densifying_scatters(model)
    assert found.shape == (BATCH, *GRID, COUT)
    feeds = frame(rng)
    want = reference.run(model, feeds)
    lowered, got = run(model, target, feeds, **options)
    assert "ScatterND" not in {n.op_type for n in lowered.graph.node}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spelling", ["ones", "columns", "add", "rows_sized"])
def test_a_near_miss_stays_a_scatter_and_computes_what_it_says(spelling, rng):
    model = densified(spelling, rng)
    assert densifying_scatters(model) == []
    feeds = frame(rng)
    want = reference.run(model, feeds)
    lowered, got = run(model, "gpu", feeds)
    assert "ScatterND" in {n.op_type for n in lowered.graph.node}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
    with pytest.raises(sparse_lower.SparseLowerError, match="node reads the rows of"):
        sparse_lower.lower(model, target="portable", max_active=64)
