"""`run_frames` / `sparse-lower run`: a model over many frames, locally and on Ray.

The frames are synthetic ones on CenterPoint's grid (empty, batch 2, float16 features and int32 coords
as the shared data stores them) with damaged ones among them, plus the two real nuScenes frames. Every
written output must be what a session run on the same frame gives, bitwise; Ray's must be the local
run's bytes.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest

import sparse_lower
from conftest import DATA
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.frames import files as frame_files
from sparse_lower.frames import find_frames, run_frames
from sparse_lower.frames.files import ModelInput, frame_feeds, write_outputs
from sparse_lower.models import centerpoint_head_stack
from sparse_lower.models.samples import CENTERPOINT_GRID
from sparse_lower.verify import random_coords

REAL = sorted(DATA.glob("nuscenes_*_voxels.npz"))
BAD = {"f007": "not an .npz archive", "f013": "nothing in the frame feeds the model input(s) features",
       "f021": "outside the grid"}


def _synthetic_frames(folder: Path, count: int = 30) -> Path:
    """`count` frames as the shared data stores them; frame 3 is empty, frame 5 has two batches, and the
    frames of BAD are damaged: garbage bytes, a misnamed key, a coordinate outside the grid."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(count):
        coords = random_coords(rng, 0 if i == 3 else int(rng.integers(200, 3000)), 2 if i == 5 else 1,
                               CENTERPOINT_GRID).astype(np.int32)
        features = rng.standard_normal((len(coords), 5)).astype(np.float16)
        name = folder / f"f{i:03d}.npz"
        if name.stem == "f007":
            name.write_bytes(b"not a zip archive")
        elif name.stem == "f013":
            np.savez(name, feats=features, coords=coords)
        else:
            if name.stem == "f021":
                coords[len(coords) // 2, 2] = CENTERPOINT_GRID[1]
            np.savez(name, features=features, coords=coords, spatial_shape=np.array(CENTERPOINT_GRID))
    return folder


@pytest.fixture(scope="module")
def lowered():
    return sparse_lower.lower(centerpoint_head_stack(), target="gpu")


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    return _synthetic_frames(tmp_path_factory.mktemp("run") / "frames")


def _expected(model, frame: Path, threads: int = 1):
    """The outputs of one session run on `frame`, fed by hand."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = sparse_lower.create_session(model, sess_options=options)
    data = np.load(frame)
    outputs = session.run(None, {"features": data["features"].astype(np.float32),
                                 "coords": data["coords"].astype(np.int64)})
    return dict(zip([o.name for o in session.get_outputs()], outputs))


def _assert_written(out_dir: Path, expected: dict[str, dict]):
    """Exactly the frames of `expected` have outputs, equal bitwise; no partial file is left."""
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(f"{name}.npz" for name in expected)
    for name, outputs in expected.items():
        with np.load(out_dir / f"{name}.npz") as written:
            assert sorted(written.files) == sorted(outputs)
            for key, value in outputs.items():
                assert written[key].dtype == value.dtype and np.array_equal(written[key], value), (name, key)


def _failures(summary) -> dict[str, str]:
    return {Path(r.frame).stem: r.error for r in summary.failures}


def test_local_run_writes_every_good_frame_and_names_the_bad_ones(lowered, frames, tmp_path):
    summary = run_frames(lowered, [frames, *REAL], tmp_path / "out", threads=1, progress=False)
    every = find_frames([frames, *REAL])
    assert len(summary.results) == len(every) == 30 + len(REAL)
    failures = _failures(summary)
    assert sorted(failures) == sorted(BAD)
    for name, reason in BAD.items():
        assert reason in failures[name]
    good = [frame for frame in every if frame.stem not in BAD]
    _assert_written(tmp_path / "out", {frame.stem: _expected(lowered, frame) for frame in good})
    assert summary.latency_ms(50) <= summary.latency_ms(95)
    assert f"{len(every)} frames, 3 failed" in str(summary)


def test_skip_existing_resumes_and_retries_only_the_failed(lowered, frames, tmp_path):
    out = tmp_path / "out"
    first = run_frames(lowered, [frames], out, threads=1, progress=False)
    (out / "f011.npz").unlink()  # as if the job had stopped before it
    again = run_frames(lowered, [frames], out, threads=1, skip_existing=True, progress=False)
    assert again.skipped == 30 - len(BAD) - 1
    assert sorted(Path(r.frame).stem for r in again.results) == sorted([*BAD, "f011"])
    assert _failures(again) == _failures(first) and "26 skipped (outputs already written)" in str(again)
    _assert_written(out, {frame.stem: _expected(lowered, frame) for frame in find_frames([frames])
                          if frame.stem not in BAD})
    done = run_frames(lowered, [frames / "f000.npz"], out, skip_existing=True, progress=False)
    assert (done.skipped, done.results, str(done)) == (1, [], "no frames run, 1 skipped (outputs already written)")


def test_a_source_model_is_lowered_and_an_exporters_file_imported_first(frames, tmp_path):
    """Given the source model, run lowers it (gpu); the outputs are those of the lowered model. An NVIDIA
    file (FP16 input "0", no coords input) runs on frames with `features` and `coords`."""
    model = centerpoint_head_stack()
    summary = run_frames(model, [frames / "f000.npz", frames / "f005.npz"], tmp_path / "out", progress=False)
    assert not summary.failures
    lowered = sparse_lower.lower(model)
    _assert_written(tmp_path / "out", {name: _expected(lowered, frames / f"{name}.npz") for name in ("f000", "f005")})

    nvidia = Path(__file__).resolve().parents[1] / "models" / "nvidia_unet.scn.onnx"
    rng = np.random.default_rng(1)
    (tmp_path / "small").mkdir()
    for i in range(3):
        coords = random_coords(rng, 300, 1, (20, 24, 28)).astype(np.int32)
        np.savez(tmp_path / "small" / f"s{i}.npz", features=rng.standard_normal((300, 4)).astype(np.float32),
                 coords=coords)
    with pytest.warns(sparse_lower.errors.SparseLowerWarning):
        summary = run_frames(nvidia, [tmp_path / "small"], tmp_path / "nvidia", progress=False)
    assert not summary.failures and len(list((tmp_path / "nvidia").glob("*.npz"))) == 3


def test_frame_keys_feed_inputs_by_name_or_by_role():
    inputs = [ModelInput("voxels", np.dtype(np.float32)), ModelInput("indices", np.dtype(np.int64))]
    features, coords = np.ones((4, 5), np.float16), np.zeros((4, 4), np.int32)
    feeds = frame_feeds({"features": features, "coords": coords}, inputs)
    assert feeds["voxels"].dtype == np.float32 and feeds["indices"].dtype == np.int64
    by_name = frame_feeds({"voxels": features, "indices": coords, "features": features[:1]}, inputs)
    assert len(by_name["voxels"]) == 4
    with pytest.raises(SparseLowerError, match="nothing in the frame feeds the model input.s. indices; the frame has"):
        frame_feeds({"features": features}, inputs)
    with pytest.raises(SparseLowerError, match="the array for input 'indices' is float32, the input takes int64"):
        frame_feeds({"voxels": features, "indices": coords.astype(np.float32) + 0.5}, inputs)
    whole = frame_feeds({"voxels": features, "indices": coords.astype(np.float32)}, inputs)  # cast: no value changes
    assert whole["indices"].dtype == np.int64 and np.array_equal(whole["indices"], coords)
    narrow = [inputs[0], ModelInput("indices", np.dtype(np.int32))]
    with pytest.raises(SparseLowerError, match="is int64, the input takes int32, and casting would change its values"):
        frame_feeds({"voxels": features, "indices": np.full((4, 4), 2**40, np.int64)}, narrow)


def test_bad_jobs_are_refused_before_any_work(lowered, frames, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SparseLowerError, match="holds no .npz frames"):
        find_frames([tmp_path / "empty"])
    with pytest.raises(SparseLowerError, match="no such file or folder"):
        find_frames([tmp_path / "missing"])
    (tmp_path / "other").mkdir()
    shutil.copy(frames / "f000.npz", tmp_path / "other" / "f000.npz")
    with pytest.raises(SparseLowerError, match="would both write f000.npz"):
        find_frames([frames, tmp_path / "other"])
    with pytest.raises(SparseLowerError, match="would overwrite the frame itself"):
        run_frames(lowered, [tmp_path / "other"], tmp_path / "other", progress=False)
    with pytest.raises(SparseLowerError, match="workers applies to a run on Ray"):
        run_frames(lowered, [frames], tmp_path / "out", workers=2, progress=False)
    with pytest.raises(SparseLowerError, match="threads=-1 is not an int >= 0"):
        run_frames(lowered, [frames], tmp_path / "out", threads=-1, progress=False)


def test_outputs_appear_whole_or_not_at_all(tmp_path, monkeypatch):
    def fails_half_way(stream, **arrays):
        stream.write(b"PK\x03\x04 half an archive")
        raise OSError("No space left on device")

    monkeypatch.setattr(frame_files.np, "savez", fails_half_way)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(tmp_path / "f000.npz", {"y": np.zeros(3)})
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_inside_the_zip_writer_stays_an_interrupt(tmp_path, monkeypatch):
    """An interrupt whose clean-up in zipfile raises another error (seen under SIGINT: ValueError "seek of
    closed file") reaches the caller as the KeyboardInterrupt, not as a failed frame."""
    def interrupted(stream, **arrays):
        try:
            raise KeyboardInterrupt
        finally:
            raise ValueError("seek of closed file")

    monkeypatch.setattr(frame_files.np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_outputs(tmp_path / "f000.npz", {"y": np.zeros(3)})
    assert list(tmp_path.iterdir()) == []


def test_cli_run_reports_the_bad_frames_and_exits_1(frames, tmp_path, capsys):
    code = main(["run", str(Path(__file__).resolve().parents[1] / "models" / "centerpoint_head.onnx"), str(frames),
                 "-o", str(tmp_path / "out"), "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "lowered for the gpu target" in out and "run: 30 frames, 3 failed" in out
    for name, reason in BAD.items():
        assert f"failed: {frames / name}.npz: " in out and reason in out
    assert len(list((tmp_path / "out").iterdir())) == 30 - len(BAD)


def test_cli_run_refusals(frames, tmp_path, capsys):
    model = str(Path(__file__).resolve().parents[1] / "models" / "centerpoint_head.onnx")
    assert main(["run", model, str(frames), "-o", str(tmp_path), "--workers", "2"]) == 2
    assert "--workers applies to a run on Ray" in capsys.readouterr().err
    assert main(["run", "--ray", model, str(frames / "f000.npz"), str(frames / "f001.npz"), "-o", str(tmp_path)]) == 2
    assert "looks like a path" in capsys.readouterr().err


def test_ray_missing_is_said_with_the_extra(lowered, frames, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(SparseLowerError, match=r'Ray is not installed.*pip install "sparse-lower\[ray\]"'):
        run_frames(lowered, [frames / "f000.npz"], tmp_path, ray=True, progress=False)


@pytest.fixture(scope="module")
def local_ray():
    try:
        import ray
    except ImportError as error:
        pytest.skip(f"ray is not installed ({error}); pip install '.[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=300 * 2**20)
    yield ray
    ray.shutdown()


def test_ray_writes_the_bytes_of_the_local_run(local_ray, lowered, frames, tmp_path):
    """Two actors of one thread each; outputs bitwise those of the local run on two threads (the kernels'
    results do not depend on the thread count), the same frames refused."""
    local = run_frames(lowered, [frames, *REAL], tmp_path / "local", threads=2, progress=False)
    on_ray = run_frames(lowered, [frames, *REAL], tmp_path / "ray", ray=True, workers=2, threads=1, progress=False)
    assert _failures(on_ray) == _failures(local) and len(on_ray.results) == len(local.results)
    expected = {}
    for path in (tmp_path / "local").iterdir():
        with np.load(path) as data:
            expected[path.stem] = {key: data[key] for key in data.files}
    _assert_written(tmp_path / "ray", expected)
    assert local_ray.is_initialized()  # a session the caller opened stays open


def test_cli_run_on_ray(local_ray, frames, tmp_path, capsys):
    model = str(Path(__file__).resolve().parents[1] / "models" / "centerpoint_head.onnx")
    assert main(["run", model, str(frames), "-o", str(tmp_path / "out"), "-q", "--ray", "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "run: 30 frames, 3 failed" in out
    assert len(list((tmp_path / "out").iterdir())) == 30 - len(BAD)
