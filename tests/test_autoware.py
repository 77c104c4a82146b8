"""The Autoware / TIER IV importer (`autoware` domain: AWML's and autoware-ml's writers, Autoware's
TensorRT plugins as reader), on graphs of every geometry.

The graphs are written by hand (`AutowareGraph`, autoware_graphs.py) in the forms those writers produce: the kernel
map as its own op (GetIndicePairsImplicitGemm + ImplicitGemm, or the native GetIndicePairs +
IndiceConv), submanifold convs sharing one pair op, the int32 coordinates built from the `coors` input
by standard ops (AWML: a flip and a float zero column; autoware-ml: an int zero column and a Gather),
biases as a separate Add or folded in with `act_type` (a fork's fusion pass), and the result densified
by standard ops (ScatterND). Their meaning is evaluated with the NumPy spconv loops of test_importers,
which share nothing with the importer.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import sparse_lower
from autoware_graphs import AutowareGraph, encoder
from sparse_lower import reference
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.importers import detect_format, import_model


def assert_matches(g: AutowareGraph, results: dict, feeds: dict) -> None:
    for name, want in zip(g.outputs, g.evaluate(feeds)):
        got = results[name]
        if isinstance(want, dict):  # rows: the input's order (submanifold layers keep it)
            want = np.array([want[tuple(site)] for site in g.coordinates_of(feeds["coors"])])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["awml", "aml", "direct"])
@pytest.mark.parametrize("bias", ["add", "fused"])
def test_encoder_matches_spconv(variant, bias, rng):
    g = encoder(variant, rng, bias=bias, act_type=0 if bias == "fused" else None)
    assert detect_format(g.model) == "autoware"
    imported = import_model(g.model)
    onnx.checker.check_model(imported, full_check=True)
    assert not {n.domain for n in imported.graph.node} & {"autoware"}
    for count in (80, 1):
        feeds = g.random_input(count)
        assert_matches(g, reference.run(imported, feeds), feeds)


def test_fused_relu_and_the_forks_attributes(rng):
    """A fork's files: `do_sort` on the pair op (12 attributes), `act_type` 1 after the fusion pass."""
    g = encoder("aml", rng, bias="fused", act_type=1, do_sort=1)
    imported = import_model(g.model)
    feeds = g.random_input(60)
    assert_matches(g, reference.run(imported, feeds), feeds)


def test_native_pair_with_its_casts(rng):
    """GetIndicePairs + IndiceConv, the second conv reading the shared pairs (as autoware-ml writes it:
    its pair count through a Cast, its output count as a Shape/Gather): those ops feed only the engine's
    kernel map and are dropped with it."""
    g = AutowareGraph("aml", (6, 7, 8), 3, rng, native=True)
    p = g.pairs(g.x[3], g.grid, "subm", 3, padding=1, key="s")
    a = g.relu(g.conv(g.x, p, 5))
    (count,) = g.node("Cast", [p["outputs"][2]], to=TensorProto.INT32)
    (shape,) = g.node("Shape", [p["outputs"][0]])
    (rows,) = g.node("Gather", [shape, g.const(0)], axis=0)
    p2 = dict(p, outputs=[p["outputs"][0], p["outputs"][1], count, rows])
    b = g.conv(a, p2, 4)
    g.build(b[0])
    imported = import_model(g.model)
    assert {n.op_type for n in imported.graph.node} >= {"SubmanifoldConv"}
    feeds = g.random_input(50)
    assert_matches(g, reference.run(imported, feeds), feeds)


def test_transposed_conv_and_the_pair_outputs_standard_ops_read(rng):
    """A strided conv then a transposed one; the strided pair op's out_indices densify its rows and its
    num_act_out is read by a standard op: both come from the source-op conv's output coordinates."""
    g = AutowareGraph("awml", (6, 8, 8), 3, rng)
    down = g.pairs(g.x[3], g.grid, "conv", 3, stride=2, padding=1)
    a = g.conv(g.x, down, 4)
    up = g.pairs(a[3], a[1], "deconv", 3, stride=2, padding=1, out_padding=1)
    b = g.conv(a, up, 2)
    (count,) = g.node("Cast", [down["outputs"][4]], to=TensorProto.FLOAT)
    g.program.append(lambda env: env.__setitem__(count, np.float32(len(env[a[0]]))))
    g.build(g.dense(a), g.dense(b), count)
    imported = import_model(g.model)
    feeds = g.random_input(40)
    results = reference.run(imported, feeds)
    assert_matches(g, results, feeds)


@pytest.mark.parametrize("target, options", [("gpu", {}), ("nna", {}), ("nna", {"max_active": 300}),
                                              ("hybrid", {})])
@pytest.mark.parametrize("variant", ["awml", "aml"])
def test_imported_encoder_lowers_and_runs(variant, target, options, rng):
    g = encoder(variant, rng)
    session = sparse_lower.create_session(sparse_lower.lower(import_model(g.model), target=target, **options))
    feeds = g.random_input(120)
    names = [o.name for o in session.get_outputs()]
    assert_matches(g, dict(zip(names, session.run(names, feeds))), feeds)


def test_imported_model_says_how_to_feed_the_coordinates(rng, tmp_path, capsys):
    """The import traces `coors` to the first pair op's indices and records which grid axis each column
    is; `convert` draws its random check inputs from that, so it verifies without --inputs."""
    for variant, columns in (("awml", ["d2", "d1", "d0"]), ("aml", ["d2", "d0", "d1"]),
                             ("direct", ["batch", "d0", "d1", "d2"])):
        g = encoder(variant, np.random.default_rng(3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every form is traced: nothing to note
            imported = import_model(g.model)
        report = json.loads({p.key: p.value for p in imported.metadata_props}["sparse_lower.import"])
        extents = [1 if c == "batch" else (8, 10, 6)[int(c[1])] for c in columns]  # batch_size=1
        assert report["coords"] == {"coors": {"columns": columns, "extents": extents}}
        assert [v.name for v in imported.graph.input] == ["voxel_features", "coors"]
        path = tmp_path / f"{variant}.onnx"
        onnx.save(g.model, path)
        assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "nna", "--max-active",
                     "600"]) == 0
        assert "verify: ok" in capsys.readouterr().out


def _reading_pair_data(rng):
    g = AutowareGraph("awml", (6, 7, 8), 3, rng)
    p = g.pairs(g.x[3], g.grid, "subm", 3)
    a = g.conv(g.x, p, 4)
    (odd,) = g.node("Cast", [p["outputs"][1]], to=TensorProto.FLOAT)
    return g.build(a[0], odd), g.nodes[-1].name


def _mixed_pairs(rng):
    g = AutowareGraph("awml", (6, 7, 8), 3, rng)
    p = g.pairs(g.x[3], g.grid, "subm", 3)
    q = g.pairs(g.x[3], g.grid, "subm", 3)
    a = g.conv(g.x, dict(p, outputs=[*p["outputs"][:2], *q["outputs"][2:]]), 4)
    return g.build(a[0]), g.nodes[-1].name


def _one_conv(rng, pair_extra=None, **conv):
    g = AutowareGraph("awml", (6, 7, 8), 3, rng)
    p = g.pairs(g.x[3], g.grid, "subm", 3, **(pair_extra or {}))
    a = g.conv(g.x, p, 4, **conv)
    return g.build(a[0]), g.nodes[-1].name


def _wrong_filters(rng):
    model, name = _one_conv(rng)
    weight = next(t for t in model.graph.initializer if t.dims[1:] == [3, 3, 3, 3])
    weight.CopyFrom(numpy_helper.from_array(np.zeros((4, 3, 3, 1, 3), np.float32), weight.name))
    return model, name


REFUSALS = {
    "pair data read by a standard op": (_reading_pair_data, "the kernel-map data of"),
    "pair outputs of two ops": (_mixed_pairs, "reads pair_mask/mask_argsort of another node"),
    "filters against ksize": (_wrong_filters, "filters of shape [4, 3, 3, 1, 3] contradict ksize=[3, 3, 3]"),
    "unknown activation": (lambda rng: _one_conv(rng, act_type=7), "act_type=7 is not understood"),
    "is_subm against subm": (lambda rng: _one_conv(rng, is_subm=0), "is_subm=0 contradicts subm"),
    "unknown conv attribute": (lambda rng: _one_conv(rng, groups=2), "ImplicitGemm has no attribute groups"),
    "no grid": (lambda rng: _one_conv(rng, pair_extra=dict(spatial_shape=[0, 7, 8])), "'spatial_shape'=[0, 7, 8]"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusal_names_the_node_and_the_fix(case, rng):
    build, fragment = REFUSALS[case]
    model, node = build(rng)
    with pytest.raises(SparseLowerError) as raised:
        import_model(model)
    assert fragment in raised.value.reason
    assert raised.value.fix
    assert raised.value.node in {n.name for n in model.graph.node}
