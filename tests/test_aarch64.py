"""The custom-op library built for aarch64 (tools/aarch64.sh: Debian's cross compiler), run under
emulation (trixie's qemu-aarch64, an arm64 Python with onnxruntime's aarch64 wheel) against this
machine's x86 build on the same models and inputs.

What it covers: every small network of sparse_lower.models (one per layer kind, the patent's 2-D stack,
the head stack) on random inputs and the head stack on the real BEVFusion frame, lowered for the gpu
target (fused convs, and the unfold form's IndexedUnfold/IndexedFold) and for the nna target at a
capacity (its index tables, PairRows and CapacityPads); each model's index tables as outputs of their own
(bench.systems.index_only), compared bit for bit; the float outputs within 1e-5 of the largest value; and
the head stack quantized to int8 (IndexedConvInt8), bit for bit; and the head stack lowered for the nna
target with tables="standard", run there in onnxruntime with no library registered, as on a board. Then every kernel path of the row GEMMs
(common/vector_units.h): IndexedConv and IndexedConvInt8 alone on 60 random shapes, on emulated CPUs
that have each set of units (Neoverse N2: I8MM; Cortex-A76: SDOT; Cortex-A53: NEON alone; and the
switches), each the x86 vector paths' bits. Speed is not measured: emulation says nothing of an ARM core
(docs/performance/aarch64.md counts the kernels' instructions instead). CI stages and builds before the
tests (.ci/run)."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from conftest import DATA
from custom_op_runs import conv_cases, op_model
from helpers import load_tool
from sparse_lower.bench.systems import index_only
from sparse_lower.capacity import level_rows
from sparse_lower.cli.main import main
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import centerpoint_head_stack, small_networks
from sparse_lower.onnx_conventions import CUSTOM_DOMAIN
from sparse_lower.runtime import vector_units
from sparse_lower.verify import example_inputs

ROOT = Path(__file__).resolve().parents[1]
STAGED = Path(os.environ.get("AARCH64_DIR", ROOT / "build" / "aarch64"))
LIBRARY = STAGED / "lib" / "libsparse_lower_ops.so"
FRAME = DATA / "nuscenes_bevfusion_voxels.npz"

pytestmark = pytest.mark.skipif(not (LIBRARY.is_file() and (STAGED / "qemu" / "qemu-aarch64").is_file()),
                                reason=f"no aarch64 build in {STAGED}: bash tools/aarch64.sh stage && bash "
                                       "tools/aarch64.sh build (CI runs both)")


def _cases() -> dict[str, tuple[onnx.ModelProto, dict, str]]:
    """name -> (model, feeds, how its outputs compare: "bits" or "float")."""
    cases = {}
    for network in small_networks():
        feeds = example_inputs(network.model, np.random.default_rng(7), active=network.active)
        for form, options in (("fused", {}), ("unfold", {"strategy": "unfold"}),
                              ("nna", {"target": "nna", "max_active": network.capacity})):
            lowered = sparse_lower.lower(network.model, **options)
            key = f"{network.name.replace(' ', '_')}.{form}"
            cases[f"{key}.outputs"] = (lowered, feeds, "float")
            tables = index_only(lowered)
            tables_feeds = {v.name: feeds[v.name] for v in tables.graph.input}
            cases[f"{key}.tables"] = (tables, tables_feeds, "bits")
    head = centerpoint_head_stack()
    if FRAME.is_file():
        features, coords, _ = load_voxels(FRAME)
        real = {"features": features, "coords": coords}
        lowered = sparse_lower.lower(head)
        cases["head_stack.real_frame.outputs"] = (lowered, real, "float")
        cases["head_stack.real_frame.tables"] = (index_only(lowered), {"coords": real["coords"]}, "bits")
        quantized, _ = sparse_lower.quantize(lowered, [real])
        cases["head_stack.real_frame.int8"] = (quantized, real, "bits")
        standard = sparse_lower.lower(head, target="nna", max_active=level_rows(head, [real]), tables="standard")
        cases["head_stack.real_frame.nna_standard_tables"] = (standard, real, "float")
    return cases


# The units each emulated CPU (QEMU_CPU) and switch must give the kernels, and how the float conv compares
# with x86's vector paths there. The portable loops on aarch64 give those bits too: GCC contracts their
# multiply-adds into FMAs on aarch64 (-ffp-contract=fast, its default), as the vector paths form them.
PATHS = {
    "neon-i8mm": ("neoverse-n2", {}),
    "neon-dotprod": ("cortex-a76", {}),
    "neon-dotprod, SPARSE_LOWER_NO_I8MM=1": ("neoverse-n2", {"SPARSE_LOWER_NO_I8MM": "1"}),
    "neon": ("cortex-a53", {}),
    "portable": ("neoverse-n2", {"SPARSE_LOWER_PORTABLE_KERNELS": "1"}),
}


def _run_everywhere(folder: Path, cases: dict, **env: str) -> tuple[dict, dict, str]:
    """Every case (name -> (model, feeds)) run here, with this install's library, and under emulation with
    the aarch64 build and `env`: (outputs here, outputs there, the units the aarch64 kernels used)."""
    here, plain = {}, []
    for number, (name, (model, feeds)) in enumerate(cases.items()):
        path = folder / f"case_{number:03d}.onnx"
        onnx.save(model, path)
        np.savez(path.with_suffix(".in.npz"), **feeds)
        session = sparse_lower.create_session(model)
        here[name] = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        if not any(opset.domain == CUSTOM_DOMAIN for opset in model.opset_import):
            plain.append(path.stem)  # there, in onnxruntime with no library registered
    (folder / "plain.txt").write_text("\n".join(plain) + "\n")
    done = subprocess.run(["bash", str(ROOT / "tools" / "aarch64.sh"), "python", str(ROOT / "tests" / "aarch64_run.py"),
                           str(folder), str(LIBRARY)], capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "AARCH64_DIR": str(STAGED), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    there = {name: dict(np.load(folder / f"case_{number:03d}.out.npz")) for number, name in enumerate(cases)}
    return here, there, done.stdout.split()[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case run here (x86, the library of this install) and under emulation (the aarch64 build)."""
    cases = _cases()
    here, there, _ = _run_everywhere(tmp_path_factory.mktemp("aarch64"),
                                     {name: (model, feeds) for name, (model, feeds, _) in cases.items()})
    return {name: (here[name], there[name], how) for name, (_, _, how) in cases.items()}


def test_every_case_ran_on_aarch64(runs):
    assert len(runs) >= 30 and all(set(x86) == set(arm) for x86, arm, _ in runs.values())


@pytest.mark.parametrize("kind", ["tables", "int8"])
def test_index_tables_and_int8_are_the_same_bits_on_aarch64(runs, kind):
    checked = [name for name in runs if name.endswith(f".{kind}")]
    assert checked or not FRAME.is_file()
    for name in checked:
        x86, arm, _ = runs[name]
        for output, value in x86.items():
            np.testing.assert_array_equal(arm[output], value, err_msg=f"{name}: {output}")


def test_float_outputs_are_within_1e_5_on_aarch64(runs):
    for name, (x86, arm, how) in runs.items():
        if how != "float":
            continue
        for output, value in x86.items():
            assert arm[output].shape == value.shape and arm[output].dtype == value.dtype, (name, output)
            if value.dtype.kind == "f":
                scale = max(float(np.abs(value).max()), 1e-30)
                assert float(np.abs(arm[output] - value).max()) <= 1e-5 * scale, (name, output)
            else:
                np.testing.assert_array_equal(arm[output], value, err_msg=f"{name}: {output}")


@pytest.mark.parametrize("path", list(PATHS))
def test_every_aarch64_kernel_path_gives_the_x86_bits(path, tmp_path):
    """IndexedConvInt8's sums are exact whatever forms them (USMMLA, SDOT on codes offset by 128, the
    portable loop); IndexedConv's every path forms a column's sum by the same fused multiply-adds in
    ascending channel order as x86's AVX2 and AVX-512 tiles."""
    cpu, switches = PATHS[path]
    cases = {f"{op}.{number}": (op_model(op, inputs, 1), inputs)
             for number, (op, inputs) in enumerate(conv_cases(range(30)))}
    here, there, units = _run_everywhere(tmp_path, cases, QEMU_CPU=cpu, **switches)
    assert units == path.split(",")[0]
    for name in cases:
        if name.startswith("IndexedConv.") and vector_units() == "portable":
            continue  # x86's portable float loop has no FMA: not the bits compared here
        np.testing.assert_array_equal(there[name]["output0"], here[name]["output0"], err_msg=f"{path}: {name}")


def test_the_instruction_counts_are_the_built_librarys():
    """docs/performance/aarch64.md's table is what tools/kernel_instructions.py counts in this build (rerun
    it after changing a kernel), and no inner loop stores: nothing spills."""
    recorded = json.loads((ROOT / "docs" / "performance" / "aarch64" / "results.json").read_text())["kernels"]
    counted = load_tool("kernel_instructions").count(LIBRARY)
    assert counted == recorded
    assert all(kernel["stores"] == 0 for kernel in counted.values())


BOARD = STAGED / "board"


@pytest.mark.skipif(not (BOARD / "sparse_lower").is_dir(), reason=f"no aarch64 wheel installed in {BOARD}: bash "
                                                                  "tools/aarch64.sh wheel (CI runs it)")
def test_the_aarch64_wheel_installs_and_runs_a_frame_as_on_a_board(tmp_path):
    """tools/aarch64.sh wheel: one py3-none-linux_aarch64 wheel holding an aarch64 library, installed with
    its dependencies' aarch64 wheels from PyPI as pip on a board installs it. There, `sparse-lower run`
    lowers the head stack and runs the real frame through the wheel's library (the widest units the
    emulated CPU has), within 1e-5 of the same command here."""
    (wheel,) = (STAGED / "dist").glob("*.whl")
    assert wheel.name == f"sparse_lower-{sparse_lower.__version__}-py3-none-linux_aarch64.whl"
    with zipfile.ZipFile(wheel) as archive:
        header = archive.read("sparse_lower/libsparse_lower_ops.so")[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    model = tmp_path / "head_stack.onnx"
    onnx.save(centerpoint_head_stack(), model)
    done = subprocess.run(["bash", str(ROOT / "tools" / "aarch64.sh"), "board",
                           str(ROOT / "tests" / "aarch64_board.py"), str(model), str(FRAME), str(tmp_path / "board")],
                          capture_output=True, text=True,
                          timeout=600, env={**os.environ, "AARCH64_DIR": str(STAGED)})
    assert done.returncode == 0, done.stderr[-3000:]
    library, units = done.stdout.split()[-2:]
    assert library == str(BOARD / "sparse_lower" / "libsparse_lower_ops.so") and units == "neon-i8mm"
    assert main(["run", str(model), str(FRAME), "-o", str(tmp_path / "here"), "-q"]) in (None, 0)
    here, there = (np.load(tmp_path / side / FRAME.name) for side in ("here", "board"))
    assert sorted(here.files) == sorted(there.files)
    for name in here.files:
        scale = max(float(np.abs(here[name]).max()), 1e-30)
        assert float(np.abs(there[name] - here[name]).max()) <= 1e-5 * scale, name
