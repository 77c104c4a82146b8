"""IndexedConv at precision "bfloat16" (lower(precision="bf16"), convert --precision bf16): its rows and
weights rounded to bfloat16, the products summed in float32, on AMX tiles where the CPU has AMX-BF16
and by the float32 kernel on the rounded values elsewhere; within 1e-2 of float32 either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import custom_op_reference as ref
import sparse_lower
from conftest import DATA
from custom_op_runs import conv_cases, run
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.models import CanonicalEmitter, centerpoint_head_stack, sp_middle_resnet_fhd
from sparse_lower.verify import relative_error

REAL = sorted(DATA.glob("nuscenes_*_voxels.npz"))
CASES = range(20)


def _bf16_outputs() -> list[np.ndarray]:
    return [run("IndexedConv", inputs, 1, precision="bfloat16")[0] for op, inputs in conv_cases(CASES)
            if op == "IndexedConv"]


def _has_amx_bf16() -> bool:
    info = Path("/proc/cpuinfo")
    flags = set(info.read_text().split()) if info.is_file() else set()
    return {"amx_tile", "amx_bf16", "avx512f", "avx512bw", "avx512_vnni"} <= flags


def test_bf16_convs_are_within_1e_2_of_the_float32_reference():
    cases = [inputs for op, inputs in conv_cases(CASES) if op == "IndexedConv"]
    for i, (inputs, got) in enumerate(zip(cases, _bf16_outputs())):
        want = ref.indexed_conv(inputs["X"], inputs["idx"], inputs["W"])
        assert got.shape == want.shape
        if want.size:
            assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max(), f"case {i}"


def test_the_tiles_and_the_rounded_float32_kernel_agree_within_1e_2(tmp_path):
    """This process takes the tiles for 16 input channels or more where the CPU has AMX-BF16; a fresh one
    with SPARSE_LOWER_NO_AMX the float32 kernel on the rounded values. Both sum the same exact products,
    in another order: close, and not the same bits where the tiles ran."""
    if not _has_amx_bf16():
        pytest.skip("the tiles' path needs AMX-TILE and AMX-BF16 (with AVX-512 VNNI), which this CPU does not have")
    script = ("import numpy as np, test_bf16 as t\n"
              f"np.savez({str(tmp_path / 'y.npz')!r}, *t._bf16_outputs())\n")
    subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent,
                   env={**os.environ, "SPARSE_LOWER_NO_AMX": "1"}, check=True)
    rounded = np.load(tmp_path / "y.npz")
    tiled = _bf16_outputs()
    cases = [inputs for op, inputs in conv_cases(CASES) if op == "IndexedConv"]
    differ = 0
    for i, (inputs, got) in enumerate(zip(cases, tiled)):
        other = rounded[f"arr_{i}"]
        if got.size:
            assert np.abs(got - other).max() <= 1e-2 * np.abs(other).max(), f"case {i}"
        differ += inputs["X"].shape[1] >= 16 and not np.array_equal(got, other)
    assert differ > 0, "the tiles did not run"


def _rounded_rows() -> tuple[np.ndarray, np.ndarray]:
    """(X, Y): one-channel rows through a one-tap conv of weight 1 at precision "bfloat16" on the rounded
    float32 path (fewer channels than the tiles take), so Y = 0 + bf16(X) exactly: ties either way,
    NaN, ±inf, a value that rounds up to inf, denormals, and a count that is not a multiple of 16."""
    rng = np.random.default_rng(16)
    special = np.array([np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-40, -1e-40, 0.0, -0.0], np.float32)
    ties = (rng.integers(0, 2**15, 40, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    x = np.concatenate([special, ties, rng.standard_normal(300).astype(np.float32)])[:, None]
    idx = np.arange(len(x), dtype=np.int64)[:, None]
    (y,) = run("IndexedConv", {"X": x, "idx": idx, "W": np.ones((1, 1, 1), np.float32)}, 1, precision="bfloat16")
    return x, y


def test_rows_are_rounded_to_bfloat16_to_nearest_even_on_every_path(tmp_path):
    """The rounding of this process (sixteen at a time where the CPU has AVX-512) and of a fresh one
    without AVX-512 (one at a time) against NumPy's, bit for bit."""
    x, y = _rounded_rows()
    bits = x.view(np.uint32).astype(np.uint64)
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    want = np.float32(0) + nearest
    nan = np.isnan(x)
    np.testing.assert_array_equal(y[~nan], want[~nan])
    assert np.isnan(y[nan]).all()
    script = ("import numpy as np, test_bf16 as t\n"
              f"np.save({str(tmp_path / 'y.npy')!r}, t._rounded_rows()[1])\n")
    subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent,
                   env={**os.environ, "SPARSE_LOWER_NO_AVX512": "1"}, check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), y)


@pytest.mark.skipif(len(REAL) < 2, reason="the nuScenes frames of ../shared/data are not here")
def test_the_backbone_in_bf16_is_within_1e_2_of_float32_on_the_real_frames():
    source = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    lowered, bf16 = sparse_lower.lower(source), sparse_lower.lower(source, precision="bf16")
    assert {onnx.helper.get_node_attr_value(n, "precision") for n in bf16.graph.node
            if n.op_type == "IndexedConv"} == {b"bfloat16"}
    want, got = sparse_lower.create_session(lowered), sparse_lower.create_session(bf16)
    for path in REAL:
        with np.load(path) as data:
            feeds = {"features": data["features"].astype(np.float32), "coords": data["coords"].astype(np.int64)}
        error = relative_error(got.run(None, feeds)[0], want.run(None, feeds)[0])
        assert 1e-5 < error <= 1e-2, path.name  # measured 0.57 % and 0.60 %


def test_bf16_is_refused_where_there_is_no_fused_conv_and_said_by_the_command_line(tmp_path, capsys):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    for options in ({"target": "nna", "max_active": 900}, {"strategy": "rulebook"}):
        with pytest.raises(SparseLowerError, match="precision='bf16' is the gpu target's fused convs'"):
            sparse_lower.lower(model, precision="bf16", **options)
    with pytest.raises(SparseLowerError, match="precision"):
        sparse_lower.lower(model, precision="float16")
    onnx.save(model, tmp_path / "heads.onnx")
    assert main(["convert", str(tmp_path / "heads.onnx"), "-o", str(tmp_path / "heads.bf16.onnx"), "--precision",
                 "bf16"]) == 0
    assert "tolerance 0.01" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "heads.onnx"), "-o", str(tmp_path / "x.onnx"), "--precision", "bf16",
                 "--target", "nna", "--max-active", "900"]) == 2
    assert "--precision does nothing for --target nna" in capsys.readouterr().err
