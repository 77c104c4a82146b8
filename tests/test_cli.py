"""The command line end to end: convert (verifying by default), inspect, demo and the help texts."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest

from conftest import DATA
from sparse_lower.capacity import pair_rows
from sparse_lower.cli.main import main
from sparse_lower.models import SparseModelBuilder


@pytest.fixture
def model_path(tmp_path):
    builder = SparseModelBuilder(3, 4, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), (10, 12, 14)).relu()
    builder.conv("SparseConv", 8, (3, 3, 3), (10, 12, 14), strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    path = tmp_path / "model.onnx"
    onnx.save(builder.build(), path)
    return path


@pytest.mark.parametrize("strategy", ["unfold", "rulebook"])
def test_convert_verify(model_path, tmp_path, capsys, strategy):
    out = tmp_path / "lowered.onnx"
    assert main(["convert", str(model_path), "-o", str(out), "--target", "gpu", "--strategy", strategy,
                 "--verify", "--dump-dir", str(tmp_path / "dump")]) == 0
    text = capsys.readouterr().out
    assert "sparse_lower::IndexedUnfold" in text and "sparse::SubmanifoldConv" in text
    assert "verify: ok" in text
    assert not [n for n in onnx.load(out).graph.node if n.domain == "sparse"]
    assert (tmp_path / "dump" / "04_lower-gpu.onnx").exists()


def test_convert_verifies_by_default_and_no_verify_skips_it(model_path, tmp_path, capsys):
    assert main(["convert", str(model_path), "-o", str(tmp_path / "a.onnx")]) == 0
    assert "verify: ok" in capsys.readouterr().out
    assert main(["convert", str(model_path), "-o", str(tmp_path / "b.onnx"), "--no-verify"]) == 0
    assert "verify" not in capsys.readouterr().out


def test_default_verification_fits_the_capacity(model_path, tmp_path, capsys):
    # 500 random sites would overflow 200 rows: the default verification draws at most --max-active.
    assert main(["convert", str(model_path), "-o", str(tmp_path / "nna.onnx"), "--target", "nna",
                 "--max-active", "200"]) == 0
    assert "verify: ok" in capsys.readouterr().out


def test_a_capacity_per_level_on_the_command_line(model_path, tmp_path, capsys):
    """inspect --frames measures each level on the frames; convert takes the list it prints."""
    rng = np.random.default_rng(1)
    for i, count in enumerate((120, 90)):
        sites = rng.choice(10 * 12 * 14, size=count, replace=False)
        coords = np.column_stack([np.zeros(count, np.int64), *np.unravel_index(sites, (10, 12, 14))]).astype(np.int32)
        np.savez(tmp_path / f"f{i}.npz", features=rng.standard_normal((count, 4)).astype(np.float16), coords=coords)
    assert main(["inspect", str(model_path), "--frames", str(tmp_path / "f0.npz"), str(tmp_path / "f1.npz")]) == 0
    printed = capsys.readouterr().out
    (capacities,) = [line.split("--max-active ")[1].split()[0] for line in printed.splitlines() if "--max-active" in line]
    assert capacities.startswith("120,") and capacities.count(",") == 1
    assert main(["convert", str(model_path), "-o", str(tmp_path / "nna.onnx"), "--target", "nna",
                 "--max-active", capacities, "--inputs", str(tmp_path / "f0.npz")]) == 0
    assert "verify: ok" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["convert", str(model_path), "-o", str(tmp_path / "x.onnx"), "--target", "nna", "--max-active", "100,x"])
    assert "'100,x' is not N or N1,N2,..." in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "nna.onnx"), "--frames", str(tmp_path / "f0.npz")]) == 2
    assert "the levels are those of the model's sparse convs, and it has none" in capsys.readouterr().err
    np.savez(tmp_path / "f2.npz", voxels=np.zeros((3, 4), np.float32))  # no array for the inputs
    assert main(["inspect", str(model_path), "--frames", str(tmp_path / "f0.npz"), str(tmp_path / "f2.npz")]) == 2
    assert f"frame {tmp_path / 'f2.npz'}: nothing in the frame feeds the model input(s)" in capsys.readouterr().err


def test_pair_capacities_on_the_command_line(model_path, tmp_path, capsys):
    """inspect --frames --margin --max-pairs-out writes each conv's pairs per tap; convert --combine pairs
    --max-pairs takes the file; bad files and stray options are refused with the fix."""
    rng = np.random.default_rng(2)
    count = 150
    sites = rng.choice(10 * 12 * 14, size=count, replace=False)
    coords = np.column_stack([np.zeros(count, np.int64), *np.unravel_index(sites, (10, 12, 14))])
    np.savez(tmp_path / "f0.npz", features=rng.standard_normal((count, 4)).astype(np.float32), coords=coords)
    pairs_file = tmp_path / "pairs.json"
    assert main(["inspect", str(model_path), "--frames", str(tmp_path / "f0.npz"), "--margin", "10",
                 "--max-pairs-out", str(pairs_file)]) == 0
    printed = capsys.readouterr().out
    (capacities,) = [line.split("--max-active ")[1].split()[0] for line in printed.splitlines() if "--max-active" in line]
    assert capacities.startswith(f"{math.ceil(count * 1.1)},") and "(10 % margin" in printed
    pairs = json.loads(pairs_file.read_text())
    measured = pair_rows(onnx.load(model_path), [{"features": np.load(tmp_path / "f0.npz")["features"], "coords": coords}])
    assert pairs == {name: [math.ceil(n * 1.1) for n in counts] for name, counts in measured.items()}
    assert all(",".join(map(str, counts)) in printed for counts in pairs.values())
    assert main(["convert", str(model_path), "-o", str(tmp_path / "pairs.onnx"), "--target", "nna", "--combine", "pairs",
                 "--max-active", capacities, "--max-pairs", str(pairs_file), "--inputs", str(tmp_path / "f0.npz")]) == 0
    assert "verify: ok" in capsys.readouterr().out
    assert main(["convert", str(model_path), "-o", str(tmp_path / "x.onnx"), "--target", "nna", "--combine", "pairs",
                 "--max-active", capacities]) == 0, "random verification inputs, every tap holding all rows"
    capsys.readouterr()
    (tmp_path / "bad.json").write_text("[1, 2")
    refusals = [
        (["--target", "nna", "--combine", "pairs", "--max-active", capacities, "--max-pairs", str(tmp_path / "bad.json")],
         "is not JSON"),
        (["--target", "nna", "--combine", "pairs", "--max-active", capacities, "--max-pairs", str(tmp_path / "no.json")],
         "cannot read --max-pairs"),
        (["--target", "gpu", "--max-pairs", str(pairs_file)], "--max-pairs does nothing for --target gpu"),
        (["--target", "nna", "--max-active", capacities, "--max-pairs", str(pairs_file)],
         "max_pairs sizes the pairs combine's per-tap lists"),
        (["--target", "nna", "--combine", "pairs", "--fuse-taps"], "leave fuse_taps (--fuse-taps) off with the pairs"),
        (["--target", "nna", "--combine", "unfold", "--fuse-taps"], "has one product for all taps already"),
    ]
    for options, message in refusals:
        assert main(["convert", str(model_path), "-o", str(tmp_path / "x.onnx"), *options]) == 2, options
        assert message in capsys.readouterr().err
    assert main(["inspect", str(model_path), "--max-pairs-out", str(pairs_file)]) == 2
    assert "--max-pairs-out is about the capacities measured on --frames" in capsys.readouterr().err


def test_convert_refusal_is_an_error_message_not_a_traceback(tmp_path, capsys):
    builder = SparseModelBuilder(2, 4, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 8, (2, 2), (10, 12))
    path = tmp_path / "bad.onnx"
    onnx.save(builder.build(), path)
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    assert "node 'submanifoldconv0': SubmanifoldConv needs odd kernel sizes" in capsys.readouterr().err


def test_inspect_lists_sparse_layers(model_path, capsys):
    assert main(["inspect", str(model_path)]) == 0
    text = capsys.readouterr().out
    assert "submanifoldconv0  SubmanifoldConv  3x3x3" in text
    assert "10x12x14  5x6x7" in text


def test_demo_runs_the_nvidia_export_on_the_real_frame(capsys, tmp_path):
    frame = DATA / "nuscenes_centerpoint_voxels.npz"
    args = ["demo", "--repeat", "1", "--picture", str(tmp_path / "bev.png")]
    assert main(args + (["--data", str(frame)] if frame.exists() else [])) == 0
    text = capsys.readouterr().out
    assert "import (NVIDIA format -> source ops)" in text and "output: [1, 256, 180, 180] float32" in text
    assert (tmp_path / "bev.png").stat().st_size > 10_000


def test_demo_check_on_the_synthetic_fallback_frame(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no shared data from here: the bundled synthetic frame is used
    monkeypatch.delenv("SPARSE_LOWER_DATA", raising=False)
    assert main(["demo", "--repeat", "1", "--check", "--picture", "bev.png"]) == 0
    text = capsys.readouterr().out
    assert "synthetic LiDAR-like frame" in text and "max relative error against the NumPy reference" in text
    assert f"picture: {tmp_path / 'bev.png'} (--picture PATH to put it elsewhere)" in text  # where it went
    looked = f"{tmp_path.parent / 'shared' / 'data' / 'nuscenes_centerpoint_voxels.npz'}"
    assert f"frame: no voxel file in {looked}," in text and "(give one with --data FILE.npz" in text


def test_help_is_the_subcommand_docstring():
    result = subprocess.run([sys.executable, "-m", "sparse_lower.cli.main", "convert", "--help"],
                            capture_output=True, text=True, check=True, cwd="/")
    assert "Then, unless --no-verify, it checks OUT" in result.stdout


@pytest.mark.parametrize("combine", ["gather", "scatter", "matmul", "pairs", "unfold"])
def test_convert_nna_verify(model_path, tmp_path, capsys, combine):
    out = tmp_path / "nna.onnx"
    fused = [] if combine in ("pairs", "unfold") else ["--fuse-taps"]  # they multiply each tap's own rows
    assert main(["convert", str(model_path), "-o", str(out), "--target", "nna", "--combine", combine,
                 "--max-active", "600", *fused, "--verify"]) == 0
    assert "verify: ok" in capsys.readouterr().out
    metadata = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert '"target": "nna"' in metadata["sparse_lower.options"]
    assert f'"combine": "{combine}"' in metadata["sparse_lower.options"] and metadata["sparse_lower.version"]


def test_inspect_reports_costs_per_method(model_path, tmp_path, capsys):
    # SubM 3x3x3 4->8 at N = 1000: gpu 27*1000*4*8 = 0.864 M; matmul adds 27*1000*1000*8 = 216 M;
    # scatter adds 27*1000*8; dense: the 10x12x14 grid, 1680*27*4*8 = 1.45 M.
    assert main(["inspect", str(model_path), "--active", "1000"]) == 0
    text = capsys.readouterr().out
    assert "submanifoldconv0  SubmanifoldConv  0.9  216.9   1.1      1.1     1.5" in text
    lowered = tmp_path / "lowered.onnx"
    main(["convert", str(model_path), "-o", str(lowered)])
    capsys.readouterr()
    assert main(["inspect", str(lowered), "--active", "1000"]) == 0
    assert "submanifoldconv0  SubmanifoldConv  0.9  216.9   1.1      1.1     1.5" in capsys.readouterr().out


def test_a_run_time_refusal_is_an_error_message_not_a_traceback(model_path, tmp_path, capsys):
    # 300 active sites cannot fit a capacity of 100 rows: CapacityPads refuses at run time.
    assert main(["convert", str(model_path), "-o", str(tmp_path / "nna.onnx"), "--target", "nna",
                 "--max-active", "100", "--verify", "--active", "300"]) == 2
    error = capsys.readouterr().err
    assert "sparse-lower convert: error: node 'features/paired/CapacityPads': CapacityPads: x has 300 rows" in error
    assert "raise max_active to at least 300" in error
    assert "ONNXRuntimeError" not in error  # the op's message, without onnxruntime's wrapper
