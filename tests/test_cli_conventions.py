"""The command line's conventions, the same in every subcommand: one frame reader (whatever takes frames
or inputs maps `features`/`coords` onto the model's inputs alike and says the same when it cannot),
-q and -v, a bad flag answered with the subcommand's usage, options refused where they would do
nothing or are out of range, never an input overwritten, and a model that can never run refused before
it is written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from conftest import DATA
from helpers import sparse_lower_cli
from sparse_lower.models import centerpoint_head_stack

ROOT = Path(__file__).resolve().parents[1]
NVIDIA = DATA / "wild" / "nvidia_exptool" / "centerpoint.scn.onnx"
SMALL_FRAME = DATA / "nuscenes_bevfusion_voxels.npz"


def renamed_inputs(model: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    """`model` with its graph inputs renamed (as exporters name them: '0', 'voxels', 'indices')."""
    for value in model.graph.input:
        value.name = names.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [names.get(name, name) for name in node.input]
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The head with its inputs named '0' and 'indices', lowered for nna, and a frame of 300 voxels
    stored as the shared frames are: `features`, int32 `coords`."""
    folder = tmp_path_factory.mktemp("conventions")
    model = renamed_inputs(centerpoint_head_stack(), {"features": "0", "coords": "indices"})
    onnx.save(model, folder / "head.onnx")
    onnx.save(sparse_lower.lower(model, target="nna", max_active=2000), folder / "head.nna.onnx")
    rng = np.random.default_rng(0)
    sites = rng.choice(41 * 1440 * 1440, size=300, replace=False)
    coords = np.column_stack([np.zeros(300, np.int64), *np.unravel_index(sites, (41, 1440, 1440))]).astype(np.int32)
    np.savez(folder / "frame.npz", features=rng.standard_normal((300, 5)).astype(np.float32), coords=coords)
    np.savez(folder / "voxels.npz", voxels=rng.standard_normal((300, 5)).astype(np.float32))
    return folder


def cli(*argv: str, cwd: Path):
    run = sparse_lower_cli(*argv, cwd=cwd)
    assert "Traceback" not in run.stderr, run.stderr
    return run


FRAME_TAKERS = {  # every command that reads frames or inputs
    "convert --inputs": ["convert", "head.onnx", "-o", "out.onnx", "--inputs", "{frame}"],
    "partition --inputs": ["partition", "head.nna.onnx", "--out-dir", "segments", "--inputs", "{frame}"],
    "partition --calibrate": ["partition", "head.nna.onnx", "--out-dir", "segments", "--for", "onnxruntime",
                              "--calibrate", "{frame}"],
    "inspect --frames": ["inspect", "head.onnx", "--frames", "{frame}"],
    "run": ["run", "head.onnx", "{frame}", "-o", "outputs"],
}


@pytest.mark.parametrize("command", FRAME_TAKERS)
def test_every_command_feeds_features_and_coords_to_the_models_inputs(folder, command):
    run = cli(*[arg.format(frame="frame.npz") for arg in FRAME_TAKERS[command]], cwd=folder)
    assert run.returncode == 0, (run.stdout, run.stderr)


@pytest.mark.parametrize("command", FRAME_TAKERS)
def test_every_command_says_the_same_of_a_frame_that_feeds_nothing(folder, command):
    run = cli(*[arg.format(frame="voxels.npz") for arg in FRAME_TAKERS[command]], cwd=folder)
    said = ("voxels.npz: nothing in the frame feeds the model input(s) 0, indices; the frame has voxels (fix: store "
            "'features' and 'coords', or arrays named like the model's inputs)")
    if command == "run":  # a frame that fails is reported and the others go on
        assert run.returncode == 1 and f"failed: {said}" in run.stdout, run.stdout
    else:
        assert run.returncode == 2 and said in run.stderr, run.stderr


def test_convert_verifies_the_nvidia_export_on_a_real_frame(tmp_path):
    """The report that started this: the inputs of NVIDIA's file are '0' and 'coords', the frame holds
    'features' and 'coords'."""
    if not NVIDIA.is_file() or not SMALL_FRAME.is_file():
        pytest.skip("no shared data")
    run = cli("convert", str(NVIDIA), "-o", "cp.onnx", "--inputs", str(SMALL_FRAME), cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.rstrip().splitlines()[-1].startswith("verify: ok ("), (run.stdout, run.stderr)


# -- options ------------------------------------------------------------------------------------------

USELESS = {  # options that do nothing for the rest of the command line
    "--max-active on gpu": (["--max-active", "1000"], "--max-active does nothing for --target gpu"),
    "--combine on gpu": (["--combine", "scatter"], "--combine does nothing for --target gpu"),
    "--layout on portable": (["--target", "portable", "--layout", "rows"], "--layout does nothing for --target "
                                                                          "portable"),
    "--strategy on nna": (["--target", "nna", "--strategy", "unfold"], "--strategy does nothing for --target nna"),
    "--seed with --inputs": (["--inputs", "frame.npz", "--seed", "3"], "--seed does nothing with --inputs"),
    "--tolerance without verifying": (["--no-verify", "--tolerance", "0.1"], "--tolerance does nothing with "
                                                                            "--no-verify"),
    "negative tolerance": (["--tolerance", "-1"], "--tolerance -1.0 is not a number >= 0"),
    "NaN tolerance": (["--tolerance", "nan"], "--tolerance nan is not a number >= 0"),
    "leaky slope on a source model": (["--leaky-relu-alpha", "0.1"], "--leaky-relu-alpha does nothing for a model "
                                                                      "in source ops"),
}


@pytest.mark.parametrize("case", USELESS)
def test_an_option_that_would_do_nothing_is_refused(folder, tmp_path, case):
    extra, said = USELESS[case]
    (tmp_path / "frame.npz").symlink_to(folder / "frame.npz")
    run = cli("convert", str(folder / "head.onnx"), "-o", "out.onnx", *extra, cwd=tmp_path)
    assert run.returncode == 2 and said in run.stderr, run.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_convert_never_writes_over_its_input(folder, tmp_path):
    model = tmp_path / "head.onnx"
    model.write_bytes((folder / "head.onnx").read_bytes())
    before = model.read_bytes()
    run = cli("convert", "head.onnx", "-o", "./head.onnx", cwd=tmp_path)
    assert run.returncode == 2 and "would write over the input model" in run.stderr, run.stderr
    assert model.read_bytes() == before


def test_a_model_whose_tables_could_never_be_built_is_not_written(tmp_path):
    run = cli("convert", str(ROOT / "models" / "centerpoint_head.onnx"), "-o", "x.onnx", "--target", "nna",
              "--combine", "matmul", "--max-active", "100000", cwd=tmp_path)
    assert run.returncode == 2 and "would take 1,005.8 GiB" in run.stderr and "combine='gather'" in run.stderr, \
        run.stderr
    assert not (tmp_path / "x.onnx").exists()


def test_run_says_what_a_model_without_sparse_layers_is(tmp_path, folder):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["features"], ["y"])], "dense",
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), tmp_path / "d.onnx")
    np.savez(tmp_path / "frame.npz", features=np.ones((3, 5), np.float32))
    run = cli("run", "d.onnx", "frame.npz", "-o", "outputs", cwd=tmp_path)
    assert run.returncode == 0 and "model: d.onnx: no sparse layers: run as it is" in run.stdout, run.stdout
    assert "run: 1 frame, none failed in " in run.stdout and "after the first frame" not in run.stdout, run.stdout


# -- -q, -v, usage ----------------------------------------------------------------------------------------

def test_every_subcommand_takes_q_and_v():
    for command in ("convert", "inspect", "partition", "run", "demo", "bench"):
        text = cli(command, "--help", cwd=ROOT).stdout
        assert re.search(r"-q, --quiet", text) and re.search(r"-v, --verbose", text), (command, text)


def test_quiet_convert_prints_only_what_it_wrote_and_the_verdict(folder, tmp_path):
    run = cli("convert", str(folder / "head.onnx"), "-o", "out.onnx", "-q", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("wrote out.onnx") and lines[1].startswith("verify: ok ("), run.stdout


def test_quiet_partition_prints_only_what_it_wrote(folder, tmp_path):
    run = cli("partition", str(folder / "head.nna.onnx"), "--out-dir", "segments", "-q", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.splitlines() == [f"wrote 3 segments and {Path('segments') / 'manifest.json'}"], run.stdout


def test_quiet_and_verbose_do_not_go_together(folder):
    run = cli("inspect", "head.onnx", "-q", "-v", cwd=folder)
    assert run.returncode == 2 and "not allowed with argument" in run.stderr, run.stderr


def test_a_bad_flag_gets_the_subcommands_usage(folder):
    run = cli("convert", "head.onnx", "-o", "x.onnx", "--bogus", cwd=folder)
    assert run.returncode == 2
    assert run.stderr.startswith("usage: sparse-lower convert "), run.stderr
    assert "sparse-lower convert: error: unrecognized arguments: --bogus" in run.stderr


def test_partition_for_a_toolchain_lists_what_it_compiled(folder, tmp_path):
    run = cli("partition", str(folder / "head.nna.onnx"), "--out-dir", "segments", "--for", "onnxruntime",
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert re.search(r"compiled segment 01 \(nna\) with onnxruntime [\d.]+ \(fp32\): segments/01_nna\.onnx",
                     run.stdout), run.stdout


def test_partition_says_the_precision_of_each_layer_as_it_is(folder, tmp_path):
    """The head stack quantized: its first and last layers stay float in onnxruntime's form, its middle
    one takes w8a8; said so rather than "(int8)", and with --activation-bits 16, w8a16."""
    for bits, said in (("8", "float on 2 of 3 layers, w8a8 on 1"), ("16", "float on 2 of 3 layers, w8a16 on 1")):
        run = cli("partition", str(folder / "head.nna.onnx"), "--out-dir", f"segments{bits}", "--for", "onnxruntime",
                  "--calibrate", str(folder / "frame.npz"), "--activation-bits", bits, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert "with onnxruntime" in run.stdout and f"({said}): segments{bits}/01_nna.onnx" in run.stdout, run.stdout
