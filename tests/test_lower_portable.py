"""The portable target (docs/portable.md): standard ONNX ops only, run in a plain onnxruntime session with
no library registered, against the dense oracle and the NumPy reference: every source op and attribute
form, multi-layer stacks, dense boundaries, batch > 1, empty input; what a frame that breaks the rules
of sparse tensors gives (NaN features); and what the lowering refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx import helper

import sparse_lower
from conftest import DATA
from helpers import STRIDED, SUBM, chain_model, model_with, session, sparse_lower_cli, to_dense_model
from oracle import assert_matches_oracle, densify, random_conv_config, random_sparse, sparse_node_model
from sparse_lower import reference
from sparse_lower.errors import SparseLowerError
from sparse_lower.models import centerpoint_head_stack
from sparse_lower.runtime import drop_padding, pad_rows


def portable(model) -> onnx.ModelProto:
    """The model lowered for the portable target, every pass checked, and checked to be standard ONNX."""
    lowered = sparse_lower.lower(model, target="portable", check_each_pass=True)
    assert {o.domain for o in lowered.opset_import} == {""}, "no custom domain is imported"
    assert {n.domain for n in lowered.graph.node} <= {""}, "every node is a standard op"
    onnx.checker.check_model(lowered, full_check=True)
    return lowered


def plain_run(model, feeds, threads=1) -> dict:
    """The outputs by name of a plain onnxruntime session: no library registered (helpers.session opens
    one for a model without custom ops)."""
    assert not sparse_lower.runtime.needs_library(model)
    run = session(model, threads)
    names = [o.name for o in run.get_outputs()]
    return dict(zip(names, run.run(names, feeds)))


@pytest.mark.parametrize("seed", range(160))
def test_random_config_matches_dense_oracle(seed):
    rng = np.random.default_rng(seed)
    config = random_conv_config(rng)
    model, (W, B) = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, config.target_coords is not None, rng)
    got = plain_run(portable(model), config.feeds, threads=1 + seed % 2)
    assert_matches_oracle(config, W, B, got["out_features"], got["out_coords"])
    expected = reference.run(model, config.feeds)
    np.testing.assert_allclose(got["out_features"], expected["out_features"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("count", [0, 800])
def test_multi_layer_stack_matches_the_reference_and_the_gpu_target(count, rng):
    """SubM → SubM (one table) → SparseConv s2, batch 2 (and an empty frame), float16 features."""
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=count)
    feeds = {"features": features, "coords": coords}
    got = list(plain_run(portable(model), feeds, threads=2).values())
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(got[1], expected["sparseconv4.coords"])
    np.testing.assert_allclose(got[0], expected["sparseconv4.features"], rtol=1e-4, atol=1e-5)
    gpu = sparse_lower.create_session(sparse_lower.lower(model, target="gpu")).run(None, feeds)
    np.testing.assert_array_equal(got[1], gpu[1])


def test_dense_boundaries_match_the_reference(rng):
    """ToSparse → SubM → Relu → SubM → SubM → SparseConv → ToDense, batch 2."""
    model = chain_model()
    X = densify(*random_sparse(rng, 2, 2, (6, 8), density=0.3), 2, (6, 8))
    X[0, 1, 2, 3] = np.nan  # an active site (NaN is non-zero), as in the reference
    expected = reference.run(model, {"X": X})["Y"]
    got = plain_run(portable(model), {"X": X})["Y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def dense_output_model(batch_size: int) -> onnx.ModelProto:
    """helpers.to_dense_model on a [5, 7] grid, with its output's shape declared (the checker wants one)."""
    model = to_dense_model(spatial_shape=[5, 7], batch_size=batch_size)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [batch_size, 2, 5, 7]))
    return model


def test_to_dense_of_the_models_own_inputs(rng):
    features, coords = random_sparse(rng, 2, 2, (5, 7), count=20)
    got = plain_run(portable(dense_output_model(2)), {"features": features, "coords": coords})["Y"]
    np.testing.assert_array_equal(got, densify(features, coords, 2, (5, 7)))


def test_the_wild_nvidia_file_runs_without_the_library():
    """A real export (NVIDIA's exptool): imported, lowered, run by a session that never saw the library;
    its outputs are the gpu target's (test_wild compares both with spconv on the real frames)."""
    path = DATA / "wild" / "nvidia_exptool" / "centerpoint.scn.onnx"
    if not path.is_file():
        pytest.skip(f"no {path}")
    lowered = portable(sparse_lower.import_model(path))
    assert not sparse_lower.runtime.needs_library(lowered)
    rng = np.random.default_rng(4)
    features, coords = random_sparse(rng, 1, 5, (41, 1440, 1440), count=3000)
    feeds = {"0": features, "coords": coords}
    (got,) = plain_run(lowered, feeds, threads=2).values()
    (want,) = session(sparse_lower.lower(sparse_lower.import_model(path), target="gpu")).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# -- frames that break the rules: NaN features, never plausible numbers ---------------------------------

def _subm_then_strided():
    """features [N, 3] / coords [N, 3] on an 8×8 grid → SubM 3×3 → SparseConv 2×2 s2."""
    model = model_with("SubmanifoldConv", SUBM)
    strided = model_with("SparseConv", STRIDED, cin=4, cout=2)
    for init in strided.graph.initializer:
        init.name = f"{init.name}2"
        model.graph.initializer.append(init)
    model.graph.node.append(helper.make_node("SparseConv", ["out_features", "out_coords", "W2", "B2"], ["f2", "c2"],
                                             name="down", domain="sparse", **STRIDED))
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("f2", onnx.TensorProto.FLOAT, ["M", 2]),
                               helper.make_tensor_value_info("c2", onnx.TensorProto.INT64, ["M", 3])])
    return model


def _broken(case: str, features, coords):
    features, coords = features.copy(), coords.copy()
    if case == "outside the grid":
        coords[3, 2] = 8
    elif case == "negative coordinate":
        coords[2, 1] = -1
    elif case == "negative batch":
        coords[4, 0] = -1
    elif case == "duplicate site":
        coords[5] = coords[1]
    elif case == "more feature rows":
        features = np.concatenate([features, features[:1]])
    return features, coords


@pytest.mark.parametrize("case", ["outside the grid", "negative coordinate", "negative batch", "duplicate site",
                                  "more feature rows"])
def test_a_broken_frame_gives_nan_features(case, sparse_input):
    model = _subm_then_strided()
    lowered = portable(model)
    features, coords = _broken(case, *sparse_input)
    got = plain_run(lowered, {"features": features, "coords": coords})
    assert got["f2"].size and np.isnan(got["f2"]).all(), case
    good = plain_run(lowered, {"features": sparse_input[0], "coords": sparse_input[1]})
    assert np.isfinite(good["f2"]).all()
    with pytest.raises(SparseLowerError):  # the reference refuses the same frame
        reference.run(model, {"features": features, "coords": coords})


def test_targets_outside_the_output_grid_give_nan(rng):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "spatial_shape": [5, 5], "output_padding": [0, 0]}
    model, _ = sparse_node_model("SparseDeconv", attrs, 2, 3, 2, True, True, rng)
    features, coords = random_sparse(rng, 1, 2, (5, 5), count=6)
    _, targets = random_sparse(rng, 2, 1, (11, 11), count=8)
    lowered = portable(model)
    feeds = {"features": features, "coords": coords, "target_coords": targets}
    got = plain_run(lowered, feeds)["out_features"]
    np.testing.assert_allclose(got, reference.run(model, feeds)["out_features"], rtol=1e-4, atol=1e-5)
    targets[0, 1] = 11
    assert np.isnan(plain_run(lowered, feeds)["out_features"]).all()


def test_to_dense_batch_beyond_batch_size_gives_nan(rng):
    features, coords = random_sparse(rng, 3, 2, (5, 7), count=20)  # batches 0..2, batch_size 2
    got = plain_run(portable(dense_output_model(2)), {"features": features, "coords": coords})["Y"]
    kept = coords[coords[:, 0] < 2]
    assert len(kept) and np.isnan(np.moveaxis(got, 1, -1)[tuple(kept.T)]).all(), "every row written is NaN"


# -- refusals ---------------------------------------------------------------------------------------------

def test_a_static_grid_over_the_limit_is_refused_naming_the_node():
    """The static form's grids span the op's whole grid, so their memory is known, and refused, when lowering."""
    model = model_with("SubmanifoldConv", {"kernel_shape": [3, 3, 3], "spatial_shape": [4096, 4096, 4096]}, ndim=3)
    with pytest.raises(SparseLowerError, match=r"node 'bad_node'.*site grid of \[4096, 4096, 4096\].*GiB per batch"):
        sparse_lower.lower(model, target="portable", max_active=100)


def _clusters(rng, origins, extent=(6, 12, 12), count=150):
    """A frame of one cluster of `count` sites per batch, batch b's cluster in `extent` from `origins[b]`: close
    enough for every tap to find neighbours, far apart on a large grid."""
    parts = [random_sparse(rng, 1, 5, extent, count=count) for _ in origins]
    features = np.concatenate([f for f, _ in parts])
    coords = np.concatenate([c + np.array([b, *origin]) for b, ((_, c), origin) in enumerate(zip(parts, origins))])
    return features, coords


@pytest.mark.parametrize("origins", [[(65000, 65000, 65000)], [(3, 5, 7), (20, 20000, 30)], []],
                         ids=["far-out", "two-batches-apart", "empty"])
def test_a_grid_of_two_to_the_sixteen_costs_what_the_frame_spans(origins, rng):
    """A grid of 2^16 per axis, as an export bounds one computed from the frame: its grid of the bound would
    take 64 TiB, the dynamic form's grids span the frame's own rows, and the outputs match the reference. (The
    strided conv's output marks span the box of every batch's reached sites: batches 20,000 cells apart.)"""
    model = centerpoint_head_stack(spatial_shape=(65536,) * 3)
    features, coords = _clusters(rng, origins) if origins else (np.zeros((0, 5), np.float32), np.zeros((0, 4), np.int64))
    feeds = {"features": features, "coords": coords}
    got = plain_run(portable(model), feeds, threads=2)
    want = reference.run(model, feeds)
    np.testing.assert_array_equal(got["sparseconv4.coords"], want["sparseconv4.coords"])
    np.testing.assert_allclose(got["sparseconv4.features"], want["sparseconv4.features"], rtol=1e-4, atol=1e-5)


def test_a_frame_whose_grid_passes_the_limit_gets_nan(rng, monkeypatch):
    """The limit holds at run time in the dynamic form: a frame whose grid would take more than MAX_GRID_BYTES
    gets NaN (and its grid is not allocated); a compact frame on the same model does not."""
    from sparse_lower.lowering.portable import grid, sites

    monkeypatch.setattr(grid, "MAX_GRID_BYTES", 2**16)
    monkeypatch.setattr(sites, "MAX_GRID_BYTES", 2**16)
    model = centerpoint_head_stack(spatial_shape=(41, 1440, 1440))
    lowered = portable(model)
    compact = _clusters(rng, [(10, 100, 100)])
    got = plain_run(lowered, dict(zip(["features", "coords"], compact)))["sparseconv4.features"]
    np.testing.assert_allclose(got, reference.run(model, dict(zip(["features", "coords"], compact)))[
        "sparseconv4.features"], rtol=1e-4, atol=1e-5)
    wide = _clusters(rng, [(10, 100, 100), (10, 1300, 1300)])  # 1,200 × 1,200 columns in batch 1
    got = plain_run(lowered, dict(zip(["features", "coords"], wide)))["sparseconv4.features"]
    assert len(got) and np.isnan(got).all(), "the flagged frame keeps rows to show it"
    monkeypatch.setattr(grid, "MAX_GRID_BYTES", 2**31)  # the site grids within it, the strided conv's marks not
    got = plain_run(portable(model), dict(zip(["features", "coords"], wide)))["sparseconv4.features"]
    assert len(got) and np.isnan(got).all(), "the flagged frame keeps rows to show it"


def test_a_static_grid_past_float32_counting_is_refused():
    """The static form numbers marked cells with a float32 CumSum: past 2^24 cells it would miscount."""
    model = model_with("SparseConv", {"kernel_shape": [1, 1], "spatial_shape": [5000, 5000]})  # 25 M output sites
    with pytest.raises(SparseLowerError, match=r"node 'bad_node'.*more than the 2\^24 its float32 count numbers"):
        sparse_lower.lower(model, target="portable", max_active=100)


# -- TensorRT's ONNX parser: every op and type of the portable models is in its published list ------------

TENSORRT = json.loads((Path(__file__).parent / "data" / "tensorrt_onnx_operators.json").read_text())
_TRT_TYPES = {onnx.TensorProto.FLOAT: "FP32", onnx.TensorProto.FLOAT16: "FP16", onnx.TensorProto.INT32: "INT32",
              onnx.TensorProto.INT64: "INT64", onnx.TensorProto.BOOL: "BOOL", onnx.TensorProto.UINT8: "UINT8"}
# The input whose element type the table's "Supported Types" is about, where it is not the first one.
_TYPED_INPUT = {"Where": 1, "ConstantOfShape": None}


def tensorrt_refusals(model: onnx.ModelProto) -> list[str]:
    """What TensorRT's table (tests/data/tensorrt_onnx_operators.md) does not list: an op, an element type,
    a non-constant `axes`, an opset outside its range."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info)}
    types.update({t.name: t.data_type for t in inferred.graph.initializer})
    constants = {t.name for t in inferred.graph.initializer}
    low, high = TENSORRT["opsets"]
    opset = next(o.version for o in model.opset_import if o.domain == "")
    found = [] if low <= opset <= high else [f"opset {opset}"]
    for node in inferred.graph.node:
        entry = TENSORRT["operators"].get(node.op_type)
        if entry is None or not entry["supported"]:
            found.append(f"{node.op_type} is not supported")
            continue
        index = _TYPED_INPUT.get(node.op_type, 0)
        typed = node.output[0] if index is None else node.input[index]
        kind = _TRT_TYPES.get(types.get(typed))
        if kind is None or kind not in entry["types"]:
            found.append(f"{node.op_type} of {kind or types.get(typed)} ('{typed}')")
        if node.op_type == "Cast" and _TRT_TYPES.get(types.get(node.output[0])) not in entry["types"]:
            found.append(f"Cast to {types.get(node.output[0])}")
        if "axes" in entry["restrictions"] and len(node.input) > 1 and node.input[1] not in constants:
            found.append(f"{node.op_type} with computed axes")
    return found


def tensorrt_cases():
    yield "head stack", centerpoint_head_stack(spatial_shape=(10, 40, 40))
    yield "dense boundaries", chain_model()
    for seed in range(40):
        rng = np.random.default_rng(seed)
        config = random_conv_config(rng)
        model, _ = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                     config.with_bias, config.target_coords is not None, rng)
        yield f"random {seed} {config.op_type}", model


@pytest.mark.parametrize("name, model", list(tensorrt_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_op_and_type_is_in_tensorrts_onnx_operator_list(name, model):
    assert not tensorrt_refusals(portable(model)), name


def test_the_tensorrt_check_finds_what_the_table_refuses():
    """The check itself: an int32 MatMul and an int64 NonZero are not in TensorRT's table."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "a"], ["b"]), helper.make_node("NonZero", ["b"], ["c"])], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.INT32, [2, 2])],
        [helper.make_tensor_value_info("c", onnx.TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    assert tensorrt_refusals(model) == ["MatMul of INT32 ('a')", "NonZero of INT32 ('b')"]


# -- every entry point takes the target -------------------------------------------------------------------

def test_partition_keeps_a_portable_model_in_one_segment(rng):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    lowered = portable(model)
    parts = sparse_lower.partition(lowered)
    assert len(parts.segments) == 1, parts.summary()
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=500)
    feeds = {"features": features, "coords": coords}
    for got, want in zip(parts.run(feeds).values(), plain_run(lowered, feeds).values()):
        np.testing.assert_array_equal(got, want)


def test_run_frames_and_the_demo_take_the_target(tmp_path):
    frame = DATA / "nuscenes_bevfusion_voxels.npz"
    if not frame.is_file():
        pytest.skip(f"no {frame}")
    model = centerpoint_head_stack()
    summary = sparse_lower.run_frames(model, [frame], tmp_path / "out", target="portable", progress=False)
    assert not summary.failures
    data = np.load(frame)
    feeds = {"features": data["features"].astype(np.float32), "coords": data["coords"].astype(np.int64)}
    written = np.load(tmp_path / "out" / frame.name)
    expected = reference.run(model, feeds)
    np.testing.assert_array_equal(written["sparseconv4.coords"], expected["sparseconv4.coords"])
    np.testing.assert_allclose(written["sparseconv4.features"], expected["sparseconv4.features"], rtol=1e-4, atol=1e-5)
    demo = sparse_lower_cli("demo", "--target", "portable", "--data", str(frame), "--repeat", "1", cwd=tmp_path)
    assert demo.returncode == 0 and "plain onnxruntime session (no library)" in demo.stdout, demo.stderr


# -- OpenVINO runs the whole model ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["centerpoint head stack", "wild NVIDIA CenterPoint backbone"])
def test_openvino_runs_the_whole_portable_model_on_the_real_frame(name, tmp_path):
    ov = pytest.importorskip("openvino", reason="OpenVINO is not installed: pip install '.[openvino]'")
    frame = DATA / "nuscenes_centerpoint_voxels.npz"
    wild = DATA / "wild" / "nvidia_exptool" / "centerpoint.scn.onnx"
    if not frame.is_file() or not wild.is_file():
        pytest.skip(f"no {frame} or {wild}")
    data = np.load(frame)
    features, coords = data["features"].astype(np.float32), data["coords"].astype(np.int64)
    if name == "centerpoint head stack":
        lowered, feeds = portable(centerpoint_head_stack()), {"features": features, "coords": coords}
    else:
        lowered, feeds = portable(sparse_lower.import_model(wild)), {"0": features, "coords": coords}
    path = tmp_path / "portable.onnx"
    onnx.save(lowered, path)
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled(feeds)
    for index, want in enumerate(plain_run(lowered, feeds, threads=2).values()):
        have = got[compiled.outputs[index]]
        assert have.shape == want.shape
        assert np.abs(have.astype(np.float64) - want).max() <= 1e-5 * max(np.abs(want).max(), 1), (name, index)


@pytest.mark.parametrize("frame", ["nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz"])
def test_the_sparse_unet_on_the_real_frames_matches_the_gpu_target(frame, tmp_path):
    """Strided convs down and inverse convs (TargetMap) back up, skip adds, a head, on the real frames:
    portable in plain onnxruntime and in OpenVINO, against the gpu target."""
    path = DATA / frame
    if not path.is_file():
        pytest.skip(f"no {path}")
    model = onnx.load(Path(__file__).resolve().parents[1] / "models" / "sparse_unet.onnx")
    data = np.load(path)
    feeds = {"features": data["features"].astype(np.float32), "coords": data["coords"].astype(np.int64)}
    lowered = portable(model)
    got = list(plain_run(lowered, feeds, threads=2).values())
    want = session(sparse_lower.lower(model, target="gpu")).run(None, feeds)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(got[0] - want[0]).max() <= 1e-4 * np.abs(want[0]).max()
    try:
        import openvino as ov
    except ImportError:
        return  # the OpenVINO half needs the extra; the onnxruntime half is checked
    onnx.save(lowered, tmp_path / "unet.portable.onnx")
    compiled = ov.Core().compile_model(str(tmp_path / "unet.portable.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(feeds)
    np.testing.assert_array_equal(results[compiled.outputs[1]], want[1])
    assert np.abs(results[compiled.outputs[0]] - want[0]).max() <= 1e-4 * np.abs(want[0]).max()


def test_run_frames_names_a_broken_frame_instead_of_writing_nan(tmp_path, sparse_input):
    """The portable model answers a broken frame with NaN; `run` reports the frame as failed, with the
    rule it broke, and writes nothing for it."""
    features, coords = sparse_input
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    np.savez(good, features=features, coords=coords)
    np.savez(bad, features=features, coords=_broken("duplicate site", features, coords)[1])
    summary = sparse_lower.run_frames(portable(_subm_then_strided()), [good, bad], tmp_path / "out", progress=False)
    (failure,) = summary.failures
    assert failure.frame == str(bad) and "breaks a rule of sparse tensors" in failure.error
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good.npz"]


# -- the static form: max_active ---------------------------------------------------------------------------

def static_shapes(model: onnx.ModelProto) -> list[str]:
    """The tensors whose shape shape inference (with data propagation) cannot give as numbers."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    return [v.name for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
            if not v.type.tensor_type.HasField("shape")
            or any(not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)]


@pytest.mark.parametrize("seed", range(80))
def test_static_form_random_config_matches_dense_oracle(seed):
    """Inputs of exactly max_active rows, padding rows with coords −1; the outputs as many, their padding
    rows −1, and the real rows the oracle's."""
    rng = np.random.default_rng(seed)
    config = random_conv_config(rng)
    model, (W, B) = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                      config.with_bias, config.target_coords is not None, rng)
    expected = reference.run(model, config.feeds)
    rows = max(len(config.coords), len(expected["out_coords"]), 1) + int(rng.integers(0, 5))
    lowered = sparse_lower.lower(model, target="portable", max_active=rows, max_batch=config.batch,
                                 check_each_pass=True)
    assert {n.domain for n in lowered.graph.node} <= {""} and not static_shapes(lowered)
    got = plain_run(lowered, pad_rows(lowered, config.feeds))
    assert got["out_features"].shape[0] == got["out_coords"].shape[0] == rows
    got = drop_padding(got)
    assert_matches_oracle(config, W, B, got["out_features"], got["out_coords"])


def test_static_form_per_level_on_a_stack_and_the_dense_boundaries(rng):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=800)
    feeds = {"features": features, "coords": coords}
    expected = reference.run(model, feeds)
    lowered = sparse_lower.lower(model, target="portable", max_active=[900, 2000], max_batch=2, check_each_pass=True)
    assert not static_shapes(lowered)
    assert [d.dim_value for d in lowered.graph.input[0].type.tensor_type.shape.dim] == [900, 5]
    got = list(drop_padding(plain_run(lowered, pad_rows(lowered, feeds), threads=2)).values())
    np.testing.assert_array_equal(got[1], expected["sparseconv4.coords"])
    np.testing.assert_allclose(got[0], expected["sparseconv4.features"], rtol=1e-4, atol=1e-5)
    chain = chain_model()  # ToSparse → … → ToDense, batch 2 (its ToDense batch_size: the grids' batches)
    X = densify(*random_sparse(rng, 2, 2, (6, 8), density=0.3), 2, (6, 8))
    got = plain_run(sparse_lower.lower(chain, target="portable", max_active=48, check_each_pass=True), {"X": X})["Y"]
    np.testing.assert_allclose(got, reference.run(chain, {"X": X})["Y"], rtol=1e-4, atol=1e-5)


def test_static_form_overflow_gives_nan_and_too_many_rows_are_refused(rng):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    features, coords = random_sparse(rng, 1, 5, (10, 40, 40), count=800)
    lowered = sparse_lower.lower(model, target="portable", max_active=[800, 100])  # the strided conv's 100 overflow
    got = plain_run(lowered, pad_rows(lowered, {"features": features, "coords": coords}))
    assert np.isnan(got["sparseconv4.features"]).all()
    with pytest.raises(SparseLowerError, match="801 rows, more than the 800 the model was lowered for"):
        pad_rows(lowered, {"features": np.zeros((801, 5), np.float32), "coords": np.zeros((801, 4), np.int64)})
    with pytest.raises(SparseLowerError, match="max_batch=2 sizes the portable target's static form"):
        sparse_lower.lower(model, target="portable", max_batch=2)


@pytest.mark.parametrize("runtime", ["tvm", "openvino"])
def test_the_static_form_runs_in_tvm_and_openvino_on_the_real_frame(runtime, tmp_path):
    """The static form of the head stack on the real frame (the dynamic form in TVM and OpenVINO:
    test_portable_runtimes)."""
    pytest.importorskip(runtime, reason=f"{runtime} is not installed: pip install '.[{runtime}]'")
    path = DATA / "nuscenes_centerpoint_voxels.npz"
    if not path.is_file():
        pytest.skip(f"no {path}")
    data = np.load(path)
    model = centerpoint_head_stack()
    lowered = sparse_lower.lower(model, target="portable", max_active=[80000, 70000])
    feeds = pad_rows(lowered, {"features": data["features"].astype(np.float32), "coords": data["coords"].astype(np.int64)})
    want = plain_run(lowered, feeds, threads=2)
    if runtime == "tvm":
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx
        module = relax.transform.LegalizeOps()(relax.transform.DecomposeOpsForInference()(
            from_onnx(lowered, keep_params_in_input=False)))
        machine = relax.VirtualMachine(relax.build(module, target=tvm.target.Target("llvm")), tvm.cpu())
        outputs = machine["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in lowered.graph.input])
        got = dict(zip(want, (o.numpy() for o in outputs)))
    else:
        import openvino as ov
        onnx.save(lowered, tmp_path / "static.onnx")
        compiled = ov.Core().compile_model(str(tmp_path / "static.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        results = compiled(feeds)
        got = {name: results[compiled.outputs[index]] for index, name in enumerate(want)}
    got, want = drop_padding(got), drop_padding(want)
    np.testing.assert_array_equal(got["sparseconv4.coords"], want["sparseconv4.coords"])
    assert len(want["sparseconv4.coords"]) == 69276
    scale = np.abs(want["sparseconv4.features"]).max()
    assert np.abs(got["sparseconv4.features"] - want["sparseconv4.features"]).max() <= 1e-5 * scale


def test_convert_draws_fewer_sites_where_random_inputs_overflow_the_static_form(tmp_path):
    """The static form answers an overflow with NaN, not an error: convert's verification sees it and draws
    half the sites, as it does for the nna target's refusal."""
    model = Path(__file__).resolve().parents[1] / "models" / "centerpoint_head.onnx"
    run = sparse_lower_cli("convert", str(model), "-o", "head.static.onnx", "--target", "portable",
                           "--max-active", "400,100", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the random inputs overflow --max-active 400,100; drawing 200 sites" in run.stdout
    assert "verify: ok (the lowered model in onnxruntime (plain, no library) against" in run.stdout
