"""The Python API takes what a user gives it or refuses it in its own words (issue 71): frames as a list of
feeds, one feeds dict, or `.npz` paths and folders, never a path read character by character; options a
target does not read, or bounds it cannot honour, refused as the CLI refuses them; and errors of the
public functions are SparseLowerErrors that name the fix, not TypeErrors or onnxruntime's exceptions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import sparse_lower
from helpers import sparse_lower_cli
from sparse_lower.capacity import level_rows
from sparse_lower.errors import SparseLowerError
from sparse_lower.models import centerpoint_head_stack
from sparse_lower.verify import example_inputs


@pytest.fixture(scope="module")
def head():
    return centerpoint_head_stack()


@pytest.fixture
def frames_dir(head, tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for seed in range(2):
        feeds = example_inputs(head, np.random.default_rng(seed), active=200)
        np.savez(folder / f"frame{seed}.npz", features=feeds["features"], coords=feeds["coords"])
    return folder


def test_frames_given_as_a_folder_a_path_or_a_list_of_paths_are_read_as_frames(head, frames_dir, tmp_path):
    feeds = [dict(np.load(path)) for path in sorted(frames_dir.glob("*.npz"))]
    want = level_rows(head, feeds)
    assert level_rows(head, str(frames_dir)) == want
    assert level_rows(head, frames_dir) == want
    assert level_rows(head, sorted(frames_dir.glob("*.npz"))) == want
    assert level_rows(head, feeds[0]) == level_rows(head, feeds[:1])
    lowered = sparse_lower.lower(head)
    summary = sparse_lower.run_frames(lowered, str(frames_dir), tmp_path / "out", progress=False)
    assert len(summary.results) == 2 and not summary.failures
    summary = sparse_lower.run_frames(lowered, frames_dir / "frame0.npz", tmp_path / "one", progress=False)
    assert len(summary.results) == 1 and not summary.failures
    quantized, _ = sparse_lower.quantize(head, str(frames_dir))
    assert any(n.op_type == "IndexedConvInt8" for n in quantized.graph.node)


@pytest.mark.parametrize("call, said", [
    (lambda h, t: level_rows(h, 12), "frames is of type int"),
    (lambda h, t: level_rows(h, [{"coords": np.zeros((1, 4), np.int64)}, "x.npz"]), r"frames\[1\] is of type str"),
    (lambda h, t: sparse_lower.quantize(h, [np.zeros(3)]), r"calibration_frames\[0\] is of type ndarray"),
    (lambda h, t: sparse_lower.quantize(h, []), "no calibration frames"),
    (lambda h, t: sparse_lower.run_frames(sparse_lower.lower(h), [{"features": np.zeros((1, 5))}], t / "out"),
     "frame 0 is of type dict, where a path to an .npz file"),
    (lambda h, t: level_rows(h, str(t / "missing")), "no such file or folder"),
])
def test_frames_of_the_wrong_kind_are_refused_naming_what_they_are(call, said, head, tmp_path):
    with pytest.raises(SparseLowerError, match=said):
        call(head, tmp_path)


def nan_frame(head, folder, name="nan.npz"):
    feeds = example_inputs(head, np.random.default_rng(0), active=200)
    feeds["features"][[3, 7], 1] = np.nan
    np.savez(folder / name, features=feeds["features"], coords=feeds["coords"])
    return folder / name


@pytest.mark.parametrize("command", [["convert", "{model}", "-o", "out.onnx", "--inputs", "{frame}"],
                                     ["demo", "--data", "{frame}", "--picture", "bev.png"]])
def test_a_frame_with_nan_features_is_refused_naming_them(command, head, tmp_path):
    onnx.save(head, tmp_path / "head.onnx")
    frame = nan_frame(head, tmp_path)
    if command[0] == "demo":  # the demo's frame: CenterPoint's five features on its grid
        data = dict(np.load(frame))
        data["features"] = np.concatenate([data["features"]] * 5, axis=1)[:, :5]
        np.savez(frame, **data)
    result = sparse_lower_cli(*[a.format(model=tmp_path / "head.onnx", frame=frame) for a in command], cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "'features' holds 2 NaN values in 2 rows" in result.stderr
    assert "Traceback" not in result.stderr and "gave different outputs" not in result.stderr


def test_an_export_example_with_nan_features_is_refused_naming_them():
    spconv = pytest.importorskip("spconv.pytorch", reason='needs spconv: pip install ".[spconv]"')
    import torch

    net = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"))
    features = torch.randn(20, 3)
    features[4, 0] = float("nan")
    coords = torch.stack([torch.zeros(20, dtype=torch.int32), *(torch.randperm(20, dtype=torch.int32) % 6
                                                                  for _ in range(3))], 1)
    coords = torch.unique(coords, dim=0)
    example = spconv.SparseConvTensor(features[: len(coords)], coords, [6, 6, 6], 1)
    with pytest.raises(SparseLowerError, match="the example's 'features' holds 1 NaN value in 1 row"):
        sparse_lower.export(net, example)


@pytest.mark.parametrize("bound, said", [
    ([-1, 5, 5], "is not a list of extents >= 1"), ("big", "is not a list of extents >= 1"),
    ([6, 6.5, 6], "is not a list of extents >= 1"),
    ([8, 8, 8], r"max_spatial_shape \[8, 8, 8\] does nothing: every grid of the module is fixed"),
])
def test_a_max_spatial_shape_that_is_no_bound_or_bounds_nothing_is_refused(bound, said):
    spconv = pytest.importorskip("spconv.pytorch", reason='needs spconv: pip install ".[spconv]"')
    import torch

    net = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"))
    coords = torch.from_numpy(np.unique(np.random.default_rng(0).integers(0, 6, (30, 4)), axis=0)).int()
    coords[:, 0] = 0
    coords = torch.unique(coords, dim=0)
    example = spconv.SparseConvTensor(torch.randn(len(coords), 3), coords, [6, 6, 6], 1)
    with pytest.raises(SparseLowerError, match=said):
        sparse_lower.export(net, example, max_spatial_shape=bound)


@pytest.mark.parametrize("make, said", [
    (lambda t: 12345, "the model is of type int"),
    (lambda t: t / "missing.onnx", "no such file"),
    (lambda t: (t / "cut.onnx").write_bytes(centerpoint_head_stack().SerializeToString()[:100]) and t / "cut.onnx",
     "not an ONNX model, or a truncated one"),
])
@pytest.mark.parametrize("function", ["create_session", "lower"])
def test_models_that_are_no_models_are_refused_in_our_words(function, make, said, tmp_path):
    with pytest.raises(SparseLowerError, match=said):
        getattr(sparse_lower, function)(make(tmp_path))


def test_the_reference_names_the_inputs_it_was_not_fed(head):
    with pytest.raises(SparseLowerError, match="no feed for the model inputs 'features', 'coords'"):
        sparse_lower.reference.run(head, {})


def test_a_file_where_an_output_folder_goes_is_refused(head, frames_dir, tmp_path):
    (tmp_path / "taken").write_text("")
    lowered = sparse_lower.lower(head)
    with pytest.raises(SparseLowerError, match="taken is a file, where a folder goes"):
        sparse_lower.run_frames(lowered, frames_dir, tmp_path / "taken", progress=False)
    with pytest.raises(SparseLowerError, match="taken is a file, where a folder goes"):
        sparse_lower.partition(sparse_lower.lower(head, target="nna", max_active=300)).to_onnx(tmp_path / "taken")


def test_a_partition_runs_on_float16_features_and_int32_or_whole_float_coords(head):
    parts = sparse_lower.partition(sparse_lower.lower(head, target="nna", max_active=1000))
    feeds = example_inputs(head, np.random.default_rng(0), active=200)
    want = parts.run(feeds)
    for coords in (feeds["coords"].astype(np.int32), feeds["coords"].astype(np.float64)):
        got = parts.run({"features": feeds["features"].astype(np.float16).astype(np.float32), "coords": coords})
        assert all(np.allclose(got[name], value, atol=1e-2) for name, value in want.items())
    with pytest.raises(SparseLowerError, match=r"more than the capacity 50 \(max_active\); raise max_active"):
        sparse_lower.partition(sparse_lower.lower(head, target="nna", max_active=50)).run(feeds)


def test_compile_partition_refuses_an_empty_calibration(head, tmp_path):
    from sparse_lower.toolchains import compile_partition

    parts = sparse_lower.partition(sparse_lower.lower(head, target="nna", max_active=300))
    with pytest.raises(SparseLowerError, match="calibration holds no frames"):
        compile_partition(parts, "onnxruntime", tmp_path / "out", calibration=[])


def test_an_export_example_off_its_grid_or_repeating_a_site_is_refused_in_our_words():
    spconv = pytest.importorskip("spconv.pytorch", reason='needs spconv: pip install ".[spconv]"')
    import torch

    net = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"))
    for coords, said in (([[0, 1, 1, 1], [0, 2, 2, 2], [0, 7, 1, 1]], r"coordinate \(0, 7, 1, 1\) .* outside the grid"),
                         ([[0, 1, 1, 1], [0, 1, 1, 1], [0, 2, 2, 2]], "rows 0 and 1 of coords are the same")):
        example = spconv.SparseConvTensor(torch.randn(3, 3), torch.tensor(coords, dtype=torch.int32), [6, 6, 6], 1)
        with pytest.raises(SparseLowerError, match="the exported model refuses the example: .*" + said):
            sparse_lower.export(net, example)
