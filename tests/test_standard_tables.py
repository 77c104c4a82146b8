"""The nna and hybrid targets with `tables="standard"` (docs/lowered_forms.md#host-segments-without-the-library):
an nna model holds standard ops only and runs in plain onnxruntime, no library registered, with the library
form's outputs (the same tables: to float rounding) on the small networks, 2-D and 3-D, batches, empty frames,
every combine and layout, capacities per level, the dense boundaries, the merges and both real frames; a frame
the library refuses gives NaN; a hybrid model keeps only its gpu path's custom ops; the partition's manifest
says which segments need the library; the option is refused where it does nothing."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import sparse_lower
from conftest import DATA
from helpers import chain_model, voxelnext_like
from oracle import densify, random_sparse
from sparse_lower.capacity import level_rows, pair_rows
from sparse_lower.cli.main import main
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import centerpoint_head_stack, small_networks
from sparse_lower.onnx_conventions import CUSTOM_DOMAIN
from sparse_lower.verify import example_inputs

FRAME_FILES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")
NETWORKS = small_networks()


def plain(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    """onnxruntime as a board has it: no custom-op library registered."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def library(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return sparse_lower.create_session(model, sess_options=options)


def custom_ops(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node if node.domain == CUSTOM_DOMAIN}


def assert_both_forms_agree(model, feeds, target="nna", threads=1, **options):
    """Lower `model` both ways; the standard form must need no library (nna) and give the library form's outputs."""
    with_library = sparse_lower.lower(model, target=target, **options)
    standard = sparse_lower.lower(model, target=target, tables="standard", check_each_pass=True, **options)
    if target == "nna":
        assert not custom_ops(standard) and not sparse_lower.runtime.needs_library(standard)
        got = plain(standard, threads).run(None, feeds)
    else:
        got = library(standard, threads).run(None, feeds)
    expected = library(with_library, threads).run(None, feeds)
    for name, a, b in zip([o.name for o in standard.graph.output], got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            scale = max(float(np.abs(b).max(initial=0)), 1.0)
            np.testing.assert_allclose(a, b, rtol=0, atol=(1e-6 if target == "nna" else 1e-5) * scale, err_msg=name)
    return standard


@pytest.mark.parametrize("capacity", [False, True], ids=["dynamic", "capacity"])
@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: n.name)
def test_small_networks_run_without_the_library(network, capacity):
    feeds = example_inputs(network.model, np.random.default_rng(0), active=network.active, batch=2)
    assert_both_forms_agree(network.model, feeds, max_active=network.capacity if capacity else None)


@pytest.mark.parametrize("layout", ["image", "rows"])
@pytest.mark.parametrize("combine", ["gather", "scatter", "matmul", "pairs", "unfold"])
def test_every_combine_and_layout_under_capacities_per_level(combine, layout):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(np.random.default_rng(1), 3, 5, (10, 40, 40), count=700)
    feeds = {"features": features, "coords": coords}
    extra = {"max_pairs": pair_rows(model, [feeds])} if combine == "pairs" else {}
    assert_both_forms_agree(model, feeds, combine=combine, layout=layout, max_active=level_rows(model, [feeds]),
                            fuse_taps=combine in ("gather", "scatter"), **extra)


@pytest.mark.parametrize("combine", ["gather", "scatter", "pairs", "unfold"])
def test_a_frame_without_capacity_and_an_empty_one(combine):
    network = NETWORKS[3]  # the patent's 2-D stack
    rng = np.random.default_rng(2)
    for active in (network.active, 0):
        feeds = example_inputs(network.model, rng, active=active, batch=2)
        assert_both_forms_agree(network.model, feeds, combine=combine)
    feeds = example_inputs(network.model, rng, active=0, batch=2)
    assert_both_forms_agree(network.model, feeds, combine=combine, max_active=network.capacity)


def test_the_matmul_combine_needs_a_capacity():
    with pytest.raises(sparse_lower.SparseLowerError, match=r"node 'submanifoldconv0'.*which standard ops cannot.*"
                                                            r"give max_active"):
        sparse_lower.lower(centerpoint_head_stack(), target="nna", combine="matmul", tables="standard")


@pytest.mark.parametrize("target", ["nna", "hybrid"])
def test_dense_boundaries(target):
    X = densify(*random_sparse(np.random.default_rng(3), 2, 2, (6, 8), density=0.3), 2, (6, 8))
    for max_active in (None, 64):
        standard = assert_both_forms_agree(chain_model(), {"X": X}, target=target, max_active=max_active)
        assert custom_ops(standard) <= {"IndexedConv"}, "ToSparse and ToDense in standard ops"


@pytest.mark.parametrize("rows", [0, 300])
def test_merges_with_a_fixed_width(rows):
    rng = np.random.default_rng(rows)
    model = voxelnext_like(rng)
    features, coords = random_sparse(rng, 2, 2, (9, 10, 11), count=rows)
    feeds = {"features": features, "coords": coords}
    assert_both_forms_agree(model, feeds)
    capacities = [max(rows, 1), 400, 400, 900, 400]
    assert_both_forms_agree(model, feeds, max_active=capacities, max_members=16, layout="rows")
    assert_both_forms_agree(model, feeds, target="hybrid", max_active=capacities, max_members=16, combine="unfold")


def test_hybrid_keeps_only_its_gpu_paths_custom_ops():
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(np.random.default_rng(4), 2, 5, (10, 40, 40), count=600)
    standard = assert_both_forms_agree(model, {"features": features, "coords": coords}, target="hybrid", max_active=2000)
    assert custom_ops(standard) == {"IndexedConv"} and sparse_lower.runtime.needs_library(standard)


def test_a_frame_the_library_refuses_gives_nan():
    """Standard ops cannot fail: rows over a capacity are cut, a tap over its max_pairs too, and the frame, like a
    broken one, gives NaN features where the library's ops refuse it."""
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    rng = np.random.default_rng(5)
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=800)
    feeds = {"features": features, "coords": coords}
    duplicated = coords.copy()
    duplicated[5] = duplicated[3]
    outside = coords.copy()
    outside[7, 1] = 10
    fewer_pairs = {name: [max(n - 3, 0) for n in counts] for name, counts in pair_rows(model, [feeds]).items()}
    cases = [({"max_active": 500}, feeds), ({"max_active": [900, 300], "combine": "scatter"}, feeds),
             ({"max_active": level_rows(model, [feeds]), "combine": "pairs", "max_pairs": fewer_pairs}, feeds),
             ({"max_active": 2000}, {**feeds, "coords": duplicated}), ({}, {**feeds, "coords": outside}),
             ({"max_active": 2000}, {**feeds, "features": np.concatenate([features, features[:2]])})]
    for options, frame in cases:
        standard = sparse_lower.lower(model, target="nna", tables="standard", **options)
        out_features = plain(standard).run(["sparseconv4.features"], frame)[0]
        assert out_features.size and np.isnan(out_features).all(), options
        with pytest.raises(Exception):
            library(sparse_lower.lower(model, target="nna", **options)).run(None, frame)
    members = voxelnext_like(np.random.default_rng(6))
    features, coords = random_sparse(rng, 2, 2, (9, 10, 11), count=300)
    standard = sparse_lower.lower(members, target="nna", tables="standard", max_active=[300, 400, 400, 900, 400],
                                  max_members=1)
    (out_features,) = plain(standard).run(["out_features"], {"features": features, "coords": coords})
    assert np.isnan(out_features).all(), "a site of more rows than max_members"


def test_the_manifest_says_which_segments_need_the_library(tmp_path):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(np.random.default_rng(7), 2, 5, (10, 40, 40), count=500)
    feeds = {"features": features, "coords": coords}
    expected = library(sparse_lower.lower(model, target="nna", max_active=2000)).run(None, feeds)

    def manifest(lowered, folder, **options):
        parts = sparse_lower.partition(lowered, **options)
        written = json.loads(parts.to_onnx(tmp_path / folder).read_text())
        for got, want in zip(parts.run(feeds).values(), library(lowered).run(None, feeds)):
            np.testing.assert_array_equal(got, want)
        return parts, written["segments"]

    parts, segments = manifest(sparse_lower.lower(model, target="nna", max_active=2000), "library")
    assert {"index", "device", "file", "nodes", "inputs", "outputs"} <= set(segments[0])  # the keys readers know
    assert [(s["device"], s["needs_library"]) for s in segments] == [("gpu", True), ("nna", False), ("gpu", False)]
    assert segments[0]["custom_ops"] == ["CapacityPads", "PairRows", "StridedMap", "SubmanifoldMap"]

    standard = sparse_lower.lower(model, target="nna", max_active=2000, tables="standard")
    parts, segments = manifest(standard, "standard")
    assert [(s["device"], s["needs_library"], s["custom_ops"]) for s in segments] == \
        [("gpu", False, []), ("nna", False, []), ("gpu", False, [])]
    for got, want in zip(parts.run(feeds).values(), expected):
        np.testing.assert_array_equal(got, want)
    for segment in segments:  # each segment alone in plain onnxruntime
        plain(onnx.load(tmp_path / "standard" / segment["file"]))

    hybrid = sparse_lower.lower(model, target="hybrid", max_active=2000, tables="standard")
    _, segments = manifest(hybrid, "hybrid")
    assert [s["custom_ops"] for s in segments] == [["IndexedConv"], [], []]
    # the gpu given the custom ops alone: the host's segments (tables, glue) need no library
    gpu_only = {"gpu": lambda node, types: None if node.domain == CUSTOM_DOMAIN else "the host runs standard ops"}
    _, segments = manifest(hybrid, "split", support=gpu_only)
    assert [(s["device"], s["needs_library"]) for s in segments if s["device"] != "nna"] == \
        [("cpu", False), ("gpu", True), ("cpu", False), ("cpu", False)]


def test_the_option_is_checked():
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    for target, said in (("gpu", "the gpu target computes with the library's custom ops"),
                         ("portable", "the portable target's tables are standard ops already")):
        with pytest.raises(sparse_lower.SparseLowerError, match=said):
            sparse_lower.lower(model, target=target, tables="standard")
    with pytest.raises(sparse_lower.SparseLowerError, match="unknown tables 'custom'"):
        sparse_lower.lower(model, target="nna", tables="custom")
    before = model.SerializeToString()
    sparse_lower.lower(model, target="nna", tables="standard")
    assert model.SerializeToString() == before, "the caller's model is left as it was"


def test_convert_writes_standard_tables_and_refuses_them_where_they_do_nothing(tmp_path, capsys):
    source = tmp_path / "head.onnx"
    onnx.save(centerpoint_head_stack(spatial_shape=(10, 40, 40)), source)
    out = tmp_path / "head.nna.onnx"
    assert main(["convert", str(source), "-o", str(out), "--target", "nna", "--max-active", "300",
                 "--tables", "standard"]) == 0
    printed = capsys.readouterr().out
    assert "standard ONNX ops only: any ONNX runtime runs" in printed and "(plain, no library)" in printed, printed
    assert "verify: the random inputs overflow --max-active 300" in printed, "NaN of an overflow: drawn again"
    assert not custom_ops(onnx.load(out))
    for target in ("gpu", "portable"):
        assert main(["convert", str(source), "-o", str(out), "--target", target, "--tables", "standard"]) == 2
        assert f"--tables does nothing for --target {target}" in capsys.readouterr().err


@pytest.mark.skipif(not all((DATA / name).exists() for name in FRAME_FILES), reason="shared data absent")
def test_the_real_frames_give_the_library_forms_outputs():
    """The CenterPoint head on both nuScenes frames, a capacity per level measured on them, rows layout."""
    frames = []
    for name in FRAME_FILES:
        features, coords, grid = load_voxels(DATA / name)
        frames.append({"features": features, "coords": coords})
    model = centerpoint_head_stack(spatial_shape=grid)
    levels = level_rows(model, frames)
    for feeds in frames:
        assert_both_forms_agree(model, feeds, threads=2, max_active=levels, layout="rows")
