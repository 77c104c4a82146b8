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
from helpers import sparse_lower_cli
from sparse_lower import SparseLowerError, runtime
from sparse_lower.models import CanonicalEmitter, NvidiaEmitter, centerpoint_head_stack, sp_middle_resnet_fhd
from sparse_lower.verify import given_inputs

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


def test_convert_says_a_missing_output_folder_before_lowering(head_model, tmp_path):
    run = sparse_lower_cli("convert", str(head_model), "-o", "missing_dir/x.onnx", cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip() == (f"sparse-lower convert: error: cannot write missing_dir/x.onnx: the folder "
                                  f"{tmp_path / 'missing_dir'} does not exist (fix: create it, or give another "
                                  f"--output)")
    assert run.stdout == ""  # nothing lowered


def test_convert_inputs_under_other_names_are_told_the_models_names(head_model, tmp_path):
    np.savez(tmp_path / "frame.npz", voxels=np.zeros((3, 5), np.float32), coors=np.zeros((3, 4), np.int32))
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--inputs", "frame.npz", cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert ("error: frame frame.npz: nothing in the frame feeds the model input(s) features, coords; the frame has "
            "coors, voxels (fix: store 'features' and 'coords', or arrays named like the model's inputs)") in run.stderr


def test_convert_takes_voxel_files_as_they_are_stored(head_model, tmp_path):
    """The voxel files (int32 coordinates, float16 features) are cast to the model's int64 and float32."""
    rng = np.random.default_rng(0)
    sites = rng.choice(41 * 1440 * 1440, size=300, replace=False)
    coords = np.column_stack([np.zeros(300, np.int64), *np.unravel_index(sites, (41, 1440, 1440))]).astype(np.int32)
    np.savez(tmp_path / "frame.npz", features=rng.standard_normal((300, 5)).astype(np.float16), coords=coords)
    run = sparse_lower_cli("convert", str(head_model), "-o", "out.onnx", "--inputs", "frame.npz", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.rstrip().endswith("verify: ok"), run.stdout + run.stderr


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
            "03_scatter-to-dense.onnx, 04_lower-gpu.onnx, 05_fuse-epilogues.onnx, 06_check.onnx)") in run.stdout


def test_max_active_on_the_gpu_target_is_said_to_do_nothing():
    with pytest.warns(sparse_lower.errors.SparseLowerWarning, match="max_active=1000 has no effect on the gpu "
                                                                    "target"):
        sparse_lower.lower(centerpoint_head_stack(), target="gpu", max_active=1000)


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
    assert run.returncode == 0 and run.stdout.rstrip().endswith("verify: ok"), run.stdout + run.stderr


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
