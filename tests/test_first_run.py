"""What a new user meets in the first hour, as they meet it: each case reproduces a report of the
first-run issue."""

from __future__ import annotations

import re
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from conftest import DATA
from helpers import sparse_lower_cli
from sparse_lower import SparseLowerError, runtime
from sparse_lower.models import CanonicalEmitter, NvidiaEmitter, centerpoint_head_stack, sp_middle_resnet_fhd
from sparse_lower.verify import given_inputs, random_coords

PACKAGE = Path(sparse_lower.__file__).parent


def _source_tree(tmp_path: Path) -> Path:
    """A checkout: the package's sources (no build), pyproject.toml and custom_ops/."""
    checkout = tmp_path / "checkout"
    shutil.copytree(PACKAGE, checkout / "sparse_lower", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (checkout / "pyproject.toml").write_text("[project]\nname = 'sparse-lower'\n")
    (checkout / "custom_ops").mkdir()
    return checkout


def test_the_source_tree_shadowing_the_installed_package_uses_the_installed_library(tmp_path, monkeypatch):
    """Python run from a checkout root after `pip install .` imports the sources (the package's only
    folder is the checkout's), which hold no library: the installed one is used, as the user expects."""
    checkout = _source_tree(tmp_path)
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(sparse_lower, "__path__", [str(checkout / "sparse_lower")])
    installed = Path(metadata.distribution("sparse-lower").locate_file(f"sparse_lower/{runtime.LIBRARY_NAME}"))
    assert Path(runtime.get_library_path()) == installed
    model = sparse_lower.lower(centerpoint_head_stack(), target="gpu")
    assert sparse_lower.create_session(model).get_outputs()


def test_a_source_tree_with_nothing_installed_says_which_package_python_reads(tmp_path, monkeypatch):
    checkout = _source_tree(tmp_path)
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(sparse_lower, "__path__", [str(checkout / "sparse_lower")])
    monkeypatch.setattr(runtime, "_installed", lambda name: None)  # no sparse-lower installed
    with pytest.raises(FileNotFoundError) as raised:
        runtime.get_library_path()
    message = str(raised.value)
    assert f"sparse_lower was imported from its source tree {checkout / 'sparse_lower'}" in message, message
    assert f"install the checkout with `pip install {checkout}`" in message


def test_an_installed_package_without_its_library_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(sparse_lower, "__path__", [str(tmp_path)])
    monkeypatch.setattr(runtime, "_installed", lambda name: None)
    with pytest.raises(FileNotFoundError, match="the sparse_lower custom-op library is not built: no "
                                                "libsparse_lower_ops.so in"):
        runtime.get_library_path()


@pytest.fixture
def head_model(tmp_path) -> Path:
    path = tmp_path / "head.onnx"
    onnx.save(centerpoint_head_stack(), path)
    return path


def test_convert_makes_a_missing_output_folder_and_says_so(head_model, tmp_path):
    run = sparse_lower_cli("convert", str(head_model), "-o", "missing_dir/x.onnx", cwd=tmp_path)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert run.stdout.splitlines()[0] == "created the folder missing_dir" and (tmp_path / "missing_dir/x.onnx").is_file()


def test_convert_inputs_under_other_names_are_told_the_models_names(head_model, tmp_path):
    np.savez(tmp_path / "frame.npz", voxels=np.zeros((3, 5), np.float32), coors=np.zeros((3, 4), np.int32))
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--inputs", "frame.npz", cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert ("error: frame frame.npz: nothing in the frame feeds the model input(s) features, coords; the frame has "
            "coors, voxels (fix: store 'features' and 'coords', or arrays named like the model's inputs)") in run.stderr


def test_convert_takes_voxel_files_as_they_are_stored(head_model, tmp_path):
    """The voxel files (int32 coordinates, float16 features) are cast to the model's int64 and float32."""
    rng = np.random.default_rng(0)
    coords = random_coords(rng, 300, 1, (41, 1440, 1440)).astype(np.int32)  # clustered, as a frame's voxels are
    np.savez(tmp_path / "frame.npz", features=rng.standard_normal((300, 5)).astype(np.float16), coords=coords)
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--inputs", "frame.npz", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.rstrip().splitlines()[-1].startswith("verify: ok ("), run.stdout + run.stderr


def test_given_inputs_refuse_a_cast_that_changes_the_data(head_model):
    arrays = {"features": np.zeros((2, 5), np.float32), "coords": np.full((2, 4), 0.5)}
    with pytest.raises(SparseLowerError, match="frame.npz: 'coords' is float64 but the model takes int64, and "
                                               "casting would change its values"):
        given_inputs(onnx.load(head_model), arrays, "frame.npz")


def test_a_source_model_in_a_session_is_told_to_lower_first():
    with pytest.raises(SparseLowerError, match=r"the model holds sparse_lower's source ops \(sparse::SparseConv, "
                                               r"sparse::SubmanifoldConv\), not their lowered form: onnxruntime "
                                               r"cannot run it .* \(fix: lower it first"):
        sparse_lower.create_session(centerpoint_head_stack())


def test_an_exporters_file_in_a_session_is_told_to_import_and_lower_first(tmp_path):
    path = tmp_path / "scn.onnx"
    onnx.save(sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0)), path)
    with pytest.raises(SparseLowerError, match=r"the model is a sparse-conv exporter's file "
                                               r"\(ai.onnx::SparseConvolution\).* \(fix: import and lower it first"):
        sparse_lower.create_session(path)


def test_version_is_said(tmp_path):
    run = sparse_lower_cli("--version", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == f"sparse-lower {sparse_lower.__version__}"
    assert sparse_lower.__version__ == metadata.version("sparse-lower")


def test_every_convert_option_has_help(tmp_path):
    run = sparse_lower_cli("convert", "--help", cwd=tmp_path)
    entries = re.split(r"\n  (?=-)", run.stdout)  # one per option, from its flags to the next option's
    for option in ("--target", "--seed", "--tolerance"):
        (entry,) = [e for e in entries if e.startswith(option)]
        words = entry.split()[2:]  # past the flag and its metavar or choices
        assert len(words) > 3, (option, entry)


def test_dump_dir_says_where_it_wrote(head_model, tmp_path):
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--dump-dir", "passes", "--no-verify",
                           cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert ("wrote the model after every pass to passes/ (00_input.onnx, 01_validate.onnx, 02_widen-float16.onnx, "
            "03_scatter-to-dense.onnx, 04_lower-gpu.onnx, 05_fuse-epilogues.onnx, 06_sort-first-sites.onnx, "
            "07_check.onnx)") in run.stdout


@pytest.mark.parametrize("options, said", [
    ({"target": "gpu", "max_active": 1000}, "max_active=1000 does nothing for target 'gpu'"),
    ({"target": "gpu", "combine": "scatter"}, "combine='scatter' does nothing for target 'gpu'"),
    ({"target": "nna", "strategy": "unfold"}, "strategy='unfold' does nothing for target 'nna'"),
    ({"target": "portable", "fuse_taps": True}, "fuse_taps=True does nothing for target 'portable'"),
])
def test_an_option_the_target_does_not_read_is_refused_as_the_cli_refuses_it(options, said):
    with pytest.raises(sparse_lower.SparseLowerError, match=said):
        sparse_lower.lower(centerpoint_head_stack(), **options)


def test_partition_reasons_are_grouped(head_model, tmp_path):
    lowered = tmp_path / "nna.onnx"
    onnx.save(sparse_lower.lower(centerpoint_head_stack(), target="nna", max_active=1000), lowered)
    run = sparse_lower_cli("partition", str(lowered), "--out-dir", "segments", "--reasons", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    table = run.stdout.split("\n\n")[0] if "\n\n" in run.stdout else run.stdout
    rows = [line for line in table.splitlines() if line.startswith(tuple("0123456789"))
            and "the nna computes on float tensors; this node outputs int64" in line]
    assert len(rows) == 1 and "more)" in rows[0], rows  # one row for the int64 index nodes, not one per node


def test_convert_says_what_it_is_doing_unless_quiet(head_model, tmp_path):
    """Long steps (a UNet's lowering, a verification on a real frame) are not silent: one status line
    per step on stderr, with its time; -q leaves stderr empty and stdout to what was written and the verdict."""
    loud = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", cwd=tmp_path)
    assert loud.returncode == 0, loud.stderr
    steps = [line.split(":")[0] for line in loud.stderr.splitlines()]
    assert steps == ["lowering for the gpu target", "verifying (NumPy reference against onnxruntime)"], loud.stderr
    assert all(line.endswith(" s") for line in loud.stderr.splitlines())
    quiet = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "-q", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout.splitlines() == [line for line in loud.stdout.splitlines() if line.startswith(("wrote", "verify"))]


def test_gpu_segments_count_the_macs_of_indexed_conv():
    """IndexedConv is the gpu's compute: its segment's MACs are M·K·Cin·Cout per conv, not 0."""
    from oracle import random_sparse

    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))  # SubM 5→16, SubM 16→16, SparseConv 16→32 s2
    parts = sparse_lower.partition(sparse_lower.lower(model, target="gpu"))
    features, coords = random_sparse(np.random.default_rng(0), 1, 5, (10, 40, 40), count=300)
    outputs = parts.run({"features": features, "coords": coords})
    rows = len(outputs["sparseconv4.coords"]) if "sparseconv4.coords" in outputs else None
    (line,) = [line for line in parts.summary().splitlines() if line.startswith("00 ")]
    macs = int(line.split()[-3].replace(",", ""))
    assert rows is not None and macs == 300 * 27 * (5 * 16 + 16 * 16) + rows * 27 * 16 * 32


@pytest.fixture(scope="module")
def centerpoint_path(tmp_path_factory) -> Path:
    """The README's flagship: CenterPoint's backbone in source ops, ending in ToDense with batch_size 1."""
    path = tmp_path_factory.mktemp("centerpoint") / "centerpoint.onnx"
    onnx.save(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0)), path)
    return path


def test_convert_verifies_centerpoint_within_its_batch_of_one(centerpoint_path, tmp_path):
    """The random verification inputs stay within the batches ToDense holds (they used batch 2, and the
    check failed the model it had just written)."""
    run = sparse_lower_cli("convert", str(centerpoint_path), "-o", "cp.onnx", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.rstrip().splitlines()[-1].startswith("verify: ok ("), run.stdout + run.stderr


@pytest.mark.parametrize("options", [["--target", "nna", "--max-active", "100000", "--combine", "scatter",
                                      "--fuse-taps"],
                                     ["--target", "hybrid", "--max-active", "100000"]], ids=["nna", "hybrid"])
def test_the_flagship_lowers_for_nna_with_a_capacity(centerpoint_path, tmp_path, options):
    """onnx-graphsurgeon's recursive toposort used to raise RecursionError on the backbone's deep graph."""
    run = sparse_lower_cli("convert", str(centerpoint_path), "-o", "cp.onnx", *options, "--no-verify", cwd=tmp_path)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert (tmp_path / "cp.onnx").is_file()


def test_the_repository_points_to_its_own_docs():
    """Users of the repository do not have the internal contract: nothing refers them to it."""
    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("*.md"), *root.glob("docs/**/*.md"), *root.glob("sparse_lower/**/*.py"),
             *root.glob("tests/*.py"), *root.glob("custom_ops/**/*.[ch]*")]
    mentions = [str(f.relative_to(root)) for f in files if f.name != "test_first_run.py" and "DESIGN.md" in
                f.read_text(errors="ignore")]
    assert mentions == []


def test_a_lowered_model_says_how_to_run_it(head_model, tmp_path):
    """A plain onnxruntime session only says the custom ops are not registered: convert's output and the
    model's metadata say how to register the library."""
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--no-verify", cwd=tmp_path)
    assert ("wrote out.onnx: needs the sparse_lower custom-op library: sparse_lower.create_session('out.onnx'), or "
            "in any onnxruntime session SessionOptions.register_custom_ops_library(sparse_lower.get_library_path())"
            ) in run.stdout
    metadata_props = {p.key: p.value for p in onnx.load(tmp_path / "out.onnx").metadata_props}
    assert "register_custom_ops_library(sparse_lower.get_library_path())" in metadata_props["sparse_lower.runtime"]


# -- what a new user still tripped on, each reproduced ----------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"
real_frame = pytest.mark.skipif(not (DATA / "nuscenes_bevfusion_voxels.npz").is_file(), reason="shared data absent")


def _setup_section() -> str:
    return README.read_text().split("\n## Set-up\n", 1)[1].split("\n## ", 1)[0]


def test_the_setup_makes_a_venv_before_pip():
    """Debian 12's own Python refuses `pip install` outside a venv (PEP 668): the set-up makes one first
    (test_readme_commands runs it on that Python)."""
    first = re.findall(r"```sh\n(.*?)```", _setup_section(), flags=re.S)[0].splitlines()[0]
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install . "), first


def test_the_setup_says_what_the_build_needs_and_how_long_it_takes():
    text = " ".join(_setup_section().split())
    for said in ("python3-venv", "g++", "2–3 minutes", "onnxruntime's C++ headers", "apt", "ORT_INCLUDE_DIR", "nvcc"):
        assert said in text, said


def _frame(tmp_path, name, **arrays) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    np.savez(folder / f"{name}.npz", **arrays)
    return folder


@pytest.fixture
def lowered_head(head_model, tmp_path) -> Path:
    path = tmp_path / "head.gpu.onnx"
    onnx.save(sparse_lower.lower(str(head_model)), path)
    return path


def _voxels(count=200, grid=(41, 1440, 1440), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, 5)).astype(np.float32), random_coords(rng, count, 1, grid)


def test_a_frame_of_another_feature_width_is_told_in_our_words(lowered_head, tmp_path):
    features, coords = _voxels()
    frames = _frame(tmp_path, "wide", features=features[:, :4], coords=coords)
    run = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "out", cwd=tmp_path)
    assert run.returncode == 1 and "ONNXRuntimeError" not in run.stdout + run.stderr, run.stdout
    assert (f"failed: {frames / 'wide.npz'}: the frame's 'features' has 4 feature values per voxel; the model's "
            "input 'features' takes [N, 5]: 5 feature values per voxel (fix: give frames with 5 feature values, or "
            "use a model built for 4)") in run.stdout, run.stdout


def test_a_coordinate_outside_the_grid_is_told_in_the_ops_words_with_the_fix(lowered_head, tmp_path):
    features, coords = _voxels()
    coords[0, 2] = 2000
    frames = _frame(tmp_path, "outside", features=features, coords=coords)
    run = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "out", cwd=tmp_path)
    assert run.returncode == 1 and "ONNXRuntimeError" not in run.stdout + run.stderr, run.stdout
    line = next(line for line in run.stdout.splitlines() if line.startswith("failed:"))
    assert re.fullmatch(r"failed: \S+outside.npz: node '[^']+SiteOrder': SiteOrder: coordinate \(0, \d+, "
                        r"2000, \d+\) of row 0 of coords is outside the grid \[41, 1440, 1440\] \(fix: voxelize the "
                        r"frame on the grid the model was built for: coords are the batch index, then one index per "
                        r"grid axis; for a model from sparse_lower.export, .* max_spatial_shape\)", line), line


def test_a_frame_voxelized_for_another_grid_is_refused_in_every_command(lowered_head, head_model, tmp_path):
    """`run` ran a [41, 1600, 1408] frame on the 41x1440x1440 model with exit 0."""
    features, coords = _voxels()
    frames = _frame(tmp_path, "other", features=features, coords=coords, spatial_shape=np.array([41, 1600, 1408]))
    said = ("the frame declares spatial_shape [41, 1600, 1408]; the model reads 'coords' on the grid "
            "[41, 1440, 1440] (fix: voxelize the frame on the grid [41, 1440, 1440], or use a model built for "
            "[41, 1600, 1408])")
    run = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "out", cwd=tmp_path)
    assert run.returncode == 1 and said in run.stdout, run.stdout
    for command in (["convert", str(head_model), "-o", "x.onnx", "--inputs"], ["partition", str(lowered_head),
                                                                               "--out-dir", "parts", "--inputs"]):
        refused = sparse_lower_cli(*command, str(frames / "other.npz"), cwd=tmp_path)
        assert refused.returncode == 2 and said in refused.stderr, (command, refused.stderr)
    matching = _frame(tmp_path, "same", features=features, coords=coords, spatial_shape=np.array([41, 1440, 1440]))
    assert sparse_lower_cli("run", str(lowered_head), str(matching), "-o", "out", cwd=tmp_path).returncode == 0


def test_the_portable_form_keeps_the_grid_it_reads(head_model):
    from sparse_lower.input_roles import input_grids

    assert input_grids(sparse_lower.lower(str(head_model), target="portable")) == {"coords": [41, 1440, 1440]}


@real_frame
def test_demo_names_the_input_by_what_it_holds_and_refuses_wrong_keys_before_counting(tmp_path):
    features, coords = _voxels()
    np.savez(tmp_path / "wide.npz", features=features[:, :4], coords=coords)
    run = sparse_lower_cli("demo", "--data", "wide.npz", "--repeat", "1", cwd=tmp_path)
    assert run.returncode == 2 and "ONNXRuntimeError" not in run.stderr, run.stderr
    assert "the frame's 'features' has 4 feature values per voxel; the model's input '0' takes [N, 5]" in run.stderr
    np.savez(tmp_path / "keys.npz", voxels=features, idx=coords)
    run = sparse_lower_cli("demo", "--data", "keys.npz", cwd=tmp_path)
    assert run.returncode == 2 and "voxels on a" not in run.stdout, run.stdout
    assert "error: frame keys.npz: no 'features' and 'coords' array; it has idx, voxels" in run.stderr


def test_every_command_checks_its_outputs_before_any_work(lowered_head, head_model, tmp_path):
    """One rule: a missing folder is made (and said), a path of the wrong kind is refused before any work."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_folder").mkdir()
    features, coords = _voxels()
    frames = _frame(tmp_path, "frames", features=features, coords=coords)
    refusals = [
        (["run", str(lowered_head), str(frames), "-o", "a_file"], "-o a_file: a file, where the folder of outputs goes"),
        (["partition", str(lowered_head), "--out-dir", "a_file"], "--out-dir a_file: a file, where the folder"),
        (["convert", str(head_model), "-o", "a_folder"], "-o a_folder: a folder, where a file goes"),
        (["demo", "--picture", "a_folder"], "--picture a_folder: a folder, where a file goes"),
        (["bench", "--quick", "--out", "a_file"], "--out a_file: a file, where the folder of outputs goes"),
        (["convert", str(head_model), "-o", "a_file/x.onnx"], "-o: a_file is a file, not a folder")]
    for command, said in refusals:
        run = sparse_lower_cli(*command, cwd=tmp_path)
        assert run.returncode == 2 and said in run.stderr and run.stdout == "", (command, run.stdout, run.stderr)
    made = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "new/outputs", cwd=tmp_path)
    assert made.returncode == 0 and "created the folder new/outputs" in made.stdout, made.stdout


def test_partition_for_a_toolchain_without_an_accelerator_segment_says_how_to_get_one(lowered_head, tmp_path):
    run = sparse_lower_cli("partition", str(lowered_head), "--out-dir", "parts", "--for", "onnxruntime", cwd=tmp_path)
    assert run.returncode == 2 and not list((tmp_path / "parts").glob("*.onnx")), run.stdout
    assert ("--for onnxruntime compiles the nna segments, and this model has none: its ops all run on gpu (fix: lower "
            "the model for the accelerator first: sparse-lower convert MODEL -o MODEL.nna.onnx --target nna "
            "--max-active N (or --target hybrid), then partition that file)") in run.stderr, run.stderr


def test_partitions_table_fits_100_columns_and_says_what_its_devices_are(head_model, tmp_path):
    nna = tmp_path / "head.nna.onnx"
    onnx.save(sparse_lower.lower(str(head_model), target="nna", max_active=2000), nna)
    run = sparse_lower_cli("partition", str(nna), "--out-dir", "parts", cwd=tmp_path)
    assert run.returncode == 0 and max(map(len, run.stdout.splitlines())) <= 100, run.stdout
    assert "devices: gpu = onnxruntime with the custom-op library, on the host" in run.stdout
    assert re.search(r"^00 +gpu +\d+ +Gather x\d+, \S+ x\d+, \+\d+ op types", run.stdout, re.M), run.stdout
    every = sparse_lower_cli("partition", str(nna), "--out-dir", "parts", "-v", cwd=tmp_path)
    assert "op types" not in every.stdout and "sparse_lower::SubmanifoldMap x1" in every.stdout


def test_the_run_summary_reads_as_a_sentence():
    from sparse_lower.frames.run import RunSummary
    from sparse_lower.frames.worker import FrameResult

    summary = RunSummary([FrameResult("a", latency_ms=100.0), FrameResult("b", latency_ms=120.0)], wall_s=0.9,
                         first_s=0.6)
    assert str(summary) == ("2 frames, none failed in 0.9 s: 2.2 frames/s; 3.3 frames/s after the first frame, which "
                            "took 0.6 s with the start-up; onnxruntime's run of a frame: median 110.0 ms, 95th "
                            "percentile 119.0 ms")


def test_the_readmes_python_example_compares_the_session_with_the_reference():
    (example,) = re.findall(r"```python\n(.*?)```", README.read_text().split("\n## Python\n")[1], flags=re.S)
    assert "reference.run(model, feeds)" in example and re.search(r"^print\(all\(np.allclose\(got\[n\], expected\[n\]",
                                                                   example, re.M)


def test_inspect_help_says_what_each_method_costs_without_the_patents_numbers(tmp_path):
    run = sparse_lower_cli("inspect", "--help", cwd=tmp_path)
    assert "patent" not in run.stdout and "method 1" not in run.stdout
    for method in ("gpu ", "matmul ", "scatter ", "gather ", "dense "):
        assert re.search(rf"^ +{method} +\S", run.stdout, re.M), method


def test_verify_says_what_it_compared_and_what_the_import_assumed(tmp_path):
    models = Path(__file__).resolve().parents[1] / "models"
    run = sparse_lower_cli("convert", str(models / "nvidia_unet.scn.onnx"), "-o", "unet.onnx", cwd=tmp_path)
    last, before = run.stdout.splitlines()[-1], run.stdout.splitlines()[-2]
    assert run.returncode == 0 and last.startswith("verify: ok (the lowered model in onnxruntime against the NumPy "
                                                   "reference of the imported model, on random inputs: "), last
    assert before.startswith("verify: the import assumed LeakyReLU slope 0.01 (") and "--leaky-relu-alpha" in before


def test_the_demos_pictures_are_in_metres_about_the_sensor_and_say_the_weights_are_random(tmp_path, monkeypatch):
    import matplotlib.figure

    from sparse_lower.cli.demo import save_bev_picture, save_sites_picture

    seen = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda figure, *a, **k: seen.append((figure.axes[0].get_title(), figure.axes[0].get_xlabel(),
                                                             [t.get_text() for t in figure.axes[0].get_legend().texts])))
    save_bev_picture(np.ones((1, 2, 180, 180), np.float32), tmp_path / "a.png", half_m=54.0)
    save_sites_picture(np.zeros((3, 70), np.float32), np.array([[0, 1, 2]] * 3), (180, 180), tmp_path / "b.png", 54.0)
    for title, xlabel, legend in seen:
        assert "deterministic random weights, not a trained network" in title and "heatmap score" not in title
        assert xlabel == "x (m, from the sensor)" and legend == ["the sensor"]


# -- round 4 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["convert", "MODEL", "-o", "out.onnx", "--active", "-3"], ["convert", "MODEL", "-o", "out.onnx", "--active", "0"],
    ["inspect", "MODEL", "--active", "-1"], ["convert", "MODEL", "-o", "out.onnx", "--seed", "-1"],
    ["convert", "MODEL", "-o", "out.onnx", "--max-members", "0", "--target", "nna"],
    ["run", "MODEL", "FRAMES", "-o", "outputs", "--threads", "-2"],
    ["run", "MODEL", "FRAMES", "-o", "outputs", "--ray", "--workers", "0"],
    ["demo", "--repeat", "0"],
])
def test_a_count_out_of_range_is_refused_with_its_range_before_anything_is_written(command, head_model, tmp_path):
    features, coords = _voxels()
    frames = _frame(tmp_path, "frames", features=features, coords=coords)
    argv = [{"MODEL": str(head_model), "FRAMES": str(frames)}.get(part, part) for part in command]
    run = sparse_lower_cli(*argv, cwd=tmp_path)
    option, value = next((argv[i], argv[i + 1]) for i in range(len(argv) - 1, 0, -1) if argv[i].startswith("--")
                         and argv[i + 1].lstrip("-").isdigit())
    assert run.returncode == 2 and f"argument {option}: '{value}' is not an integer >= " in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "outputs").exists() and not (tmp_path / "out.onnx").exists()


def test_verify_on_a_frame_without_voxels_says_it_compared_no_value(head_model, tmp_path):
    frame = _frame(tmp_path, "frames", features=np.zeros((0, 5), np.float32), coords=np.zeros((0, 4), np.int64))
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--inputs", str(next(frame.glob("*.npz"))),
                           cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "has no voxels: on it only the outputs' shapes were compared (they match)" in run.stdout, run.stdout
    assert "verify: ok (" in run.stdout and "on random inputs: largest" in run.stdout, run.stdout


def test_run_refuses_a_target_a_lowered_model_cannot_take_before_writing(lowered_head, tmp_path):
    features, coords = _voxels()
    frames = _frame(tmp_path, "frames", features=features, coords=coords)
    run = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "outputs", "--target", "portable", cwd=tmp_path)
    assert run.returncode == 2 and "is already lowered for the gpu target: --target portable cannot change it" in \
        run.stderr, run.stderr
    assert not (tmp_path / "outputs").exists()
    same = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "outputs", "--target", "gpu", cwd=tmp_path)
    assert same.returncode == 0, same.stderr


def test_run_names_a_frame_with_nan_or_infinite_features(lowered_head, tmp_path):
    features, coords = _voxels()
    features[3, 1], features[7] = np.nan, np.inf
    frames = _frame(tmp_path, "frames", features=features, coords=coords)
    run = sparse_lower_cli("run", str(lowered_head), str(frames), "-o", "outputs", cwd=tmp_path)
    assert run.returncode == 0 and "none failed, 1 with a warning" in run.stdout, run.stdout
    assert re.search(r"warning: .*\.npz: 'features' holds 1 NaN and 5 infinite values in 2 rows: the outputs they "
                     r"reach are not finite either", run.stdout), run.stdout


@pytest.mark.parametrize("options, said", [
    (["--tune", "FRAME"], "--tune: the frame FRAME has no voxels, so there is nothing to time on"),
    (["--int8", "--calibrate", "FRAME"], "--calibrate: the frame FRAME has no voxels, so there is nothing to calibrate"),
    (["--active", "99999999999"], "--active 99,999,999,999: the verification draws that many random sites"),
])
def test_convert_refuses_frames_and_counts_it_cannot_use_before_any_work(options, said, head_model, tmp_path):
    frame = str(next(_frame(tmp_path, "frames", features=np.zeros((0, 5), np.float32),
                            coords=np.zeros((0, 4), np.int64)).glob("*.npz")))
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", *[frame if o == "FRAME" else o for o in options],
                           cwd=tmp_path)
    assert run.returncode == 2 and said.replace("FRAME", frame) in run.stderr and "(fix: " in run.stderr, run.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_bench_refuses_cases_that_match_nothing_before_making_its_folder(tmp_path):
    run = sparse_lower_cli("bench", "--cases", "nosuch", "--out", "results", cwd=tmp_path)
    assert run.returncode == 2 and "--cases 'nosuch' matches none of the cases (fix: give names or globs of: " \
        "subm16-16/centerpoint" in run.stderr, run.stderr
    assert not (tmp_path / "results").exists()
