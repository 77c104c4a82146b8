"""Every subcommand driven through the failures a user meets, each in its own process as a user runs it:
a bad path, an empty, text, truncated or .npz file given as a model, a damaged frame, Ctrl-C. Each ends
in one message with the fix and the documented exit status (docs/cli.md: 0 ok, 1 a check or frame
failed, 2 a usage, model or file error, 130 interrupted), never a traceback; the log lines of
onnxruntime, its quantizer and the toolchains stay out of the way unless -v asks for them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from conftest import DATA
from helpers import sparse_lower_cli
from sparse_lower.models import centerpoint_head_stack

FRAME = DATA / "nuscenes_bevfusion_voxels.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A folder with a model, a frame and the broken files: empty, text, truncated, an .npz as a model,
    a damaged .npz, a frame without spatial_shape."""
    folder = tmp_path_factory.mktemp("files")
    onnx.save(centerpoint_head_stack(), folder / "head.onnx")
    (folder / "empty.onnx").write_bytes(b"")
    (folder / "text.onnx").write_text("this is not a model\n")
    (folder / "truncated.onnx").write_bytes((folder / "head.onnx").read_bytes()[:3000])
    rng = np.random.default_rng(0)
    sites = rng.choice(41 * 1440 * 1440, size=300, replace=False)
    coords = np.column_stack([np.zeros(300, np.int64), *np.unravel_index(sites, (41, 1440, 1440))])
    np.savez(folder / "frame.npz", features=rng.standard_normal((300, 5)).astype(np.float32), coords=coords)
    (folder / "damaged.npz").write_bytes((folder / "frame.npz").read_bytes()[:200])
    (folder / "notnpz.npz").write_text("features,coords\n")
    return folder


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    run = sparse_lower_cli(*argv, cwd=cwd)
    assert "Traceback" not in run.stderr + run.stdout, run.stderr
    return run


def one_error(run: subprocess.CompletedProcess, command: str) -> str:
    """The one error line of a failed command (status lines before it are fine), with its fix."""
    errors = [line for line in run.stderr.splitlines() if line.startswith(f"sparse-lower {command}: error: ")]
    assert len(errors) == 1 and "(fix: " in errors[0], run.stderr
    return errors[0]


NOT_MODELS = {  # file: what the message says it is
    "nope.onnx": "no such file",
    "empty.onnx": "the file is empty",
    "text.onnx": "a text file, not an ONNX model",
    "truncated.onnx": "not an ONNX model, or a truncated one",
    "frame.npz": "an .npz archive, not an ONNX model",
    ".": "a folder, not an ONNX model",
}
COMMANDS = {  # subcommand: its arguments around the model
    "convert": lambda model: ["convert", model, "-o", "out.onnx"],
    "inspect": lambda model: ["inspect", model],
    "partition": lambda model: ["partition", model, "--out-dir", "segments"],
    "run": lambda model: ["run", model, "frame.npz", "-o", "outputs"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("model", NOT_MODELS)
def test_what_is_not_a_model_is_named_as_what_it_is(files, command, model):
    run = cli(*COMMANDS[command](model), cwd=files)
    assert run.returncode == 2
    error = one_error(run, command)
    assert f"'{model}'" in error and NOT_MODELS[model] in error, error
    assert "IR version 0" not in error and "Wire format" not in error


@pytest.mark.parametrize("frame, said", [("nope.npz", "no such file"), ("damaged.npz", "damaged or truncated"),
                                         ("notnpz.npz", "not an .npz archive")])
@pytest.mark.parametrize("where", ["convert --inputs", "partition --inputs", "partition --calibrate", "demo --data",
                                   "inspect --frames", "run"])
def test_a_bad_frame_is_refused_before_any_work(files, tmp_path, where, frame, said):
    """The frame is read first: nothing is lowered or written for a frame that cannot be read (`run`
    reports a frame it cannot read among its failures, status 1, as it does any frame that fails)."""
    (tmp_path / "frame.npz").symlink_to(files / "frame.npz")
    if (files / frame).exists():
        (tmp_path / frame).symlink_to(files / frame)
    lowered = tmp_path / "head.nna.onnx"
    onnx.save(sparse_lower.lower(centerpoint_head_stack(), target="nna", max_active=2000), lowered)
    argv = {"convert --inputs": ["convert", str(files / "head.onnx"), "-o", "out.onnx", "--inputs", frame],
            "partition --inputs": ["partition", str(lowered), "--out-dir", "segments", "--inputs", frame],
            "partition --calibrate": ["partition", str(lowered), "--out-dir", "segments", "--for", "onnxruntime",
                                      "--calibrate", frame],
            "demo --data": ["demo", "--data", frame, "--repeat", "1"],
            "inspect --frames": ["inspect", str(files / "head.onnx"), "--frames", frame],
            "run": ["run", str(files / "head.onnx"), frame, "-o", "outputs"]}[where]
    run = cli(*argv, cwd=tmp_path)
    if where == "run" and frame != "nope.npz":  # a frame of a job that fails is reported, and the others go on
        assert run.returncode == 1 and f"failed: {frame}: " in run.stdout and said in run.stdout, run.stdout
        return
    assert run.returncode == 2, (run.stdout, run.stderr)
    error = one_error(run, argv[0])
    assert frame in error and said in error, error
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "segments").exists()
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())


def test_ctrl_c_during_run_ends_cleanly(files, tmp_path):
    """SIGINT half-way through a run: one line saying so, how many frames are written and how to resume;
    status 130, no partial output file."""
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(400):
        (frames / f"f{i:03d}.npz").symlink_to(files / "frame.npz")
    process = subprocess.Popen([sys.executable, "-m", "sparse_lower.cli.main", "run", str(files / "head.onnx"),
                                str(frames), "-o", "outputs", "-q"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "outputs").glob("f*.npz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, (stdout, stderr)
    last = stderr.strip().splitlines()[-1]
    said = re.fullmatch(r"sparse-lower run: interrupted: (\d+) of 400 frames' outputs are in outputs, each whole; "
                        r"the same command with --skip-existing does the rest", last)
    assert "Traceback" not in stderr and said, stderr
    assert not list((tmp_path / "outputs").glob(".*.part"))
    assert int(said[1]) == len(list((tmp_path / "outputs").glob("f*.npz"))) > 0


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(files, tmp_path):
    """`sparse-lower inspect … | head -1`: the reader has closed the pipe before inspect prints; the
    command stops there with status 0 and nothing on stderr."""
    process = subprocess.Popen([sys.executable, "-m", "sparse_lower.cli.main", "inspect", str(files / "head.onnx")],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and stderr == "", stderr


def test_onnxruntime_error_lines_stay_out_of_a_verification_that_retries(tmp_path):
    """The default verification of a tight capacity draws smaller inputs after onnxruntime refuses an
    overflow: the refusal is expected, and onnxruntime's own log line of it is not shown (with -v it is)."""
    model = Path(__file__).parents[1] / "models" / "sparse_unet.onnx"
    run = cli("convert", str(model), "-o", "u.onnx", "--target", "nna", "--max-active", "200", cwd=tmp_path)
    assert run.returncode == 0 and "verify: ok" in run.stdout, run.stderr
    assert "[E:onnxruntime" not in run.stderr and "drawing 100 sites" in run.stdout, run.stderr
    loud = cli("convert", str(model), "-o", "u.onnx", "--target", "nna", "--max-active", "200", "-v", cwd=tmp_path)
    assert loud.returncode == 0 and "[E:onnxruntime" in loud.stderr, loud.stderr


def test_the_quantizers_and_toolchains_log_lines_are_shown_only_with_v(files, tmp_path):
    lowered = tmp_path / "head.nna.onnx"
    onnx.save(sparse_lower.lower(centerpoint_head_stack(), target="nna", max_active=2000), lowered)
    argv = ["partition", str(lowered), "--out-dir", "segments", "--for", "onnxruntime", "--calibrate",
            str(files / "frame.npz")]
    quiet = cli(*argv, cwd=tmp_path)
    assert quiet.returncode == 0 and "WARNING:root" not in quiet.stderr, quiet.stderr
    loud = cli(*argv, "-v", cwd=tmp_path)
    assert loud.returncode == 0 and "WARNING:root" in loud.stderr, loud.stderr


def test_tvms_warnings_are_shown_only_with_v(tmp_path):
    pytest.importorskip("tvm", reason="TVM is not installed: pip install '.[tvm]'")
    lowered = tmp_path / "head.nna.onnx"
    onnx.save(sparse_lower.lower(centerpoint_head_stack(), target="nna", max_active=2000), lowered)
    quiet = cli("partition", str(lowered), "--out-dir", "segments", "--for", "tvm", cwd=tmp_path)
    assert quiet.returncode == 0 and "Warning" not in quiet.stderr, quiet.stderr
    loud = cli("partition", str(lowered), "--out-dir", "segments", "--for", "tvm", "-v", cwd=tmp_path)
    assert loud.returncode == 0 and "Warning" in loud.stderr, loud.stderr


def test_an_unexpected_error_is_one_line_and_v_shows_where(tmp_path, monkeypatch, capsys):
    """A bug of ours (here: inspect made to raise a KeyError) is one line saying it is one, status 3; -v
    adds the traceback for the report."""
    from sparse_lower.cli.main import main

    monkeypatch.setattr("sparse_lower.cli.inspect.InspectCommand.run", lambda self, args, out: {}["missing"])
    onnx.save(centerpoint_head_stack(), tmp_path / "head.onnx")
    assert main(["inspect", str(tmp_path / "head.onnx")]) == 3
    error = capsys.readouterr().err
    assert error == ("sparse-lower inspect: internal error: KeyError: 'missing' (fix: a bug in sparse_lower: rerun "
                     "with -v for the traceback and report it)\n"), error
    assert main(["inspect", str(tmp_path / "head.onnx"), "-v"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_the_demo_takes_a_frame_without_its_grid(tmp_path):
    """A frame of features and coords only, as `run` takes it: the demo uses CenterPoint's grid."""
    if not FRAME.is_file():
        pytest.skip(f"no {FRAME}")
    with np.load(FRAME) as data:
        np.savez(tmp_path / "frame.npz", features=data["features"], coords=data["coords"])
    run = cli("demo", "--data", "frame.npz", "--repeat", "1", "--picture", "bev.png", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "frame: frame.npz: 17,748 voxels on a 41x1440x1440 grid" in run.stdout, run.stdout
