"""SortFirstSites: the gpu target's first level in site order computes bitwise what the model without the
pass computes, returns its rows in the frame's order, and leaves alone the models it does not understand."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sparse_lower
from sparse_lower import reference
from sparse_lower.bench.systems import index_only
from helpers import session
from oracle import random_sparse
from sparse_lower.models import CanonicalEmitter, SparseModelBuilder, sparse_unet
from sparse_lower.passes.site_order import SortFirstSites


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def unsorted(model: onnx.ModelProto, monkeypatch, **options) -> onnx.ModelProto:
    """`model` lowered as the gpu target lowers it, without the pass."""
    with monkeypatch.context() as patched:
        patched.setattr(SortFirstSites, "call", lambda self, m: m)
        return sparse_lower.lower(model, **options)


def assert_same_run(model: onnx.ModelProto, feeds: dict, monkeypatch, **options) -> onnx.ModelProto:
    lowered = sparse_lower.lower(model, check_each_pass=True, **options)
    assert ops(lowered).count("SiteOrder") == 1
    plain = session(unsorted(model, monkeypatch, **options)).run(None, feeds)
    for threads in (1, 2):
        for got, want in zip(session(lowered, threads).run(None, feeds), plain):
            np.testing.assert_array_equal(got, want)
    return lowered


def block_then_stride(rng, dims: int) -> tuple[onnx.ModelProto, tuple]:
    """SubM → Relu → SubM + residual → Relu → SparseConv s2 → SubM: the first level, then a strided one."""
    grid = (6, 9, 8)[-dims:]
    builder = SparseModelBuilder(dims, 3, rng)
    builder.conv("SubmanifoldConv", 8, (3,) * dims, grid).relu()
    block_input = builder.features
    builder.conv("SubmanifoldConv", 8, (3,) * dims, grid).add(block_input).relu()
    builder.conv("SparseConv", 6, (3,) * dims, grid, strides=[2] * dims, pads=[1] * 2 * dims)
    builder.conv("SubmanifoldConv", 6, (3,) * dims, tuple((s + 1) // 2 for s in grid))
    return builder.build(), grid


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_first_level_in_site_order_computes_bitwise_the_same(dims, batch, rng, monkeypatch):
    model, grid = block_then_stride(rng, dims)
    features, coords = random_sparse(rng, batch, 3, grid, density=0.4)
    assert_same_run(model, {"features": features, "coords": coords}, monkeypatch)


def test_the_hybrid_targets_gpu_layer_in_site_order_computes_bitwise_the_same(rng, monkeypatch):
    model = SparseModelBuilder(3, 4, rng).conv("SubmanifoldConv", 8, (3, 3, 3), (6, 8, 8)).build()
    features, coords = random_sparse(rng, 2, 4, (6, 8, 8), density=0.3)
    assert_same_run(model, {"features": features, "coords": coords}, monkeypatch, target="hybrid")


def test_rows_the_graph_returns_from_the_first_level_come_back_in_the_frames_order(rng, monkeypatch):
    """The UNet's scores are rows of its input: the rank takes them back, row for row with the coords fed."""
    model = sparse_unet(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=(21, 20, 20), levels=2)
    features, coords = random_sparse(rng, 1, 5, (21, 20, 20), density=0.05)
    names = [i.name for i in model.graph.input]
    lowered = assert_same_run(model, dict(zip(names, (features, coords))), monkeypatch)
    assert [n.name for n in lowered.graph.node if n.op_type == "IndexedUnfold" and "/back_" in n.name]
    tables = ops(index_only(lowered))  # the benchmarks' index tables: SiteOrder among them
    assert "SiteOrder" in tables and tables.count("SubmanifoldMap") == 3


def test_an_empty_frame_runs(rng, monkeypatch):
    model, grid = block_then_stride(rng, 3)
    assert_same_run(model, {"features": np.zeros((0, 3), np.float32), "coords": np.zeros((0, 4), np.int64)},
                    monkeypatch)


def test_models_it_does_not_understand_are_left_as_they_are(rng):
    model, _ = block_then_stride(rng, 3)
    assert "SiteOrder" not in ops(sparse_lower.lower(model, strategy="unfold"))
    assert "SiteOrder" not in ops(sparse_lower.lower(model, target="nna"))
    builder = SparseModelBuilder(2, 3, rng)
    builder.conv("SubmanifoldConv", 4, (3, 3), (8, 8))
    read_elsewhere = builder.build()  # the features fed are returned too: their order is the frame's
    read_elsewhere.graph.output.append(helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, 3]))
    assert "SiteOrder" not in ops(sparse_lower.lower(read_elsewhere))


def test_rows_of_another_input_paired_with_the_level_keep_it_in_the_frames_order(rng):
    """A residual fed beside the features pairs with the frame's rows: sorting the level would misplace it."""
    builder = SparseModelBuilder(2, 3, rng)
    builder.writer.input("extra", TensorProto.FLOAT, ["N", 4])
    model = builder.conv("SubmanifoldConv", 4, (3, 3), (8, 8)).add("extra").relu().build()
    lowered = sparse_lower.lower(model, check_each_pass=True)
    assert "SiteOrder" not in ops(lowered)
    assert [len(n.input) for n in lowered.graph.node if n.op_type == "IndexedConv"] == [6]  # extra: the residual
    features, coords = random_sparse(rng, 2, 3, (8, 8), density=0.5)
    feeds = {"features": features, "coords": coords, "extra": rng.standard_normal((len(coords), 4)).astype(np.float32)}
    expected = reference.run(model, feeds)
    got = session(lowered).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[lowered.graph.output[0].name], rtol=1e-5, atol=1e-5)


def test_features_that_do_not_pair_with_the_coords_are_refused(rng):
    """Their gather into site order pairs them with the coords, as the convs did: more rows or fewer."""
    model, grid = block_then_stride(rng, 2)
    features, coords = random_sparse(rng, 1, 3, grid, count=6)
    for rows in (5, 7):
        feeds = {"features": rng.standard_normal((rows, 3)).astype(np.float32), "coords": coords}
        with pytest.raises(Exception, match=f"IndexedUnfold: X has {rows} rows but coords has 6: features and coords "
                                            "must pair row by row"):
            session(sparse_lower.lower(model)).run(None, feeds)


def test_duplicated_coords_are_refused_by_the_site_order(rng):
    model, grid = block_then_stride(rng, 2)
    features, coords = random_sparse(rng, 1, 3, grid, count=6)
    coords[4] = coords[1]
    with pytest.raises(Exception, match=r"SiteOrder: rows 1 and 4 of coords are the same coordinate"):
        session(sparse_lower.lower(model)).run(None, {"features": features, "coords": coords})
