"""tools/gpu_check.py's phases that a GPU machine runs once in a while, kept working on the CPU: the
onnxruntime phase in the CPU provider (the same code as in the CUDA provider, IO binding included), the
reassembly of onnxruntime-gpu from the parts tools/gpu_stage.py splits it into, the pruning of a CUDA
library's kernels to one GPU, the plan of the calls that carry the parts, and the layer list that
tools/libspconv_anchor.cpp builds NVIDIA's engine from. Their GPU results come from the GPU machine alone."""

from __future__ import annotations

import ctypes
import io
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from helpers import load_tool
from sparse_lower.frames.sample import synthetic_voxels
from sparse_lower.models import NvidiaEmitter, sp_middle_resnet_fhd

@pytest.fixture(scope="module")
def gpu_check():
    return load_tool("gpu_check")


@pytest.fixture(scope="module")
def gpu_stage():
    return load_tool("gpu_stage")


def test_the_onnxruntime_phase_runs_every_model_in_the_cpu_provider(gpu_check, tmp_path, capsys):
    """Every model of the phase (the exptool file as NVIDIA's format writes it) on a small frame, lowered
    for the gpu and the portable target, bound and timed as on the GPU, against the CPU library. The frame's
    voxels lie in a corner of the models' grid, near one another, as a scan's do (isolated voxels would
    grow into many sites at every strided conv)."""
    features, coords, _ = synthetic_voxels(1500, seed=3, grid=(41, 96, 96))
    exptool = tmp_path / "centerpoint.scn.onnx"
    onnx.save(sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0)), exptool)
    cases = gpu_check.ort_cases({"features": features, "coords": coords}, exptool)
    passed, results = gpu_check.ort_phase(cases, "cpu", repeat=1)
    assert passed, capsys.readouterr().out
    assert set(results) == {*cases, "refusal"}
    assert results.pop("refusal")["ok"]
    for name, result in results.items():
        assert result["providers"] == ["CPUExecutionProvider"] and result["custom_ops"] > 0, name
        assert result["custom_ops_elsewhere"] == [] and max(result["error"].values()) == 0, name
        assert list(result["portable_nodes"]) == ["CPUExecutionProvider"], name
    assert "CPUExecutionProvider" in capsys.readouterr().out


def test_onnxruntime_gpu_reassembles_from_its_parts_and_refuses_a_changed_one(gpu_check, gpu_stage, tmp_path):
    library = np.random.default_rng(0).bytes(3000)  # incompressible: several parts
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:xz") as tar:
        for name, content in {"onnxruntime/__init__.py": b"x = 1\n", "onnxruntime/capi/lib.so": library}.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    parts = tmp_path / "parts"
    gpu_stage.split(packed.getvalue(), parts, part_size=500)
    assert len(list(parts.glob("part.*"))) > 1
    site = gpu_check.unpack_ort_gpu(parts, tmp_path / "site")
    assert (site / "onnxruntime" / "capi" / "lib.so").read_bytes() == library
    (parts / "part.01").write_bytes(b"changed")
    with pytest.raises(ValueError, match="part.01 differs"):
        gpu_check.unpack_ort_gpu(parts, tmp_path / "again")
    (parts / "part.01").unlink()
    with pytest.raises(FileNotFoundError):
        gpu_check.unpack_ort_gpu(parts, tmp_path / "again")


def test_keeping_one_gpus_kernels_zeroes_the_others_and_the_library_still_loads(gpu_stage, tmp_path):
    """On the CUDA build of our own library (machine code for several GPUs, PTX for one)."""
    path = sparse_lower.cuda_library_path()
    if path is None:
        pytest.skip("no CUDA build of the library here (no nvcc)")
    library = Path(path).read_bytes()
    kept = gpu_stage.keep_kernels(library, 90)
    before, after = list(gpu_stage.fatbin_entries(library)), list(gpu_stage.fatbin_entries(kept))
    assert before == after and len(kept) == len(library)
    machine_code = {arch for kind, arch, _, _ in before if kind == gpu_stage.FATBIN_ELF}
    assert 90 in machine_code and len(machine_code) > 1
    for kind, arch, start, size in before:
        zeroed = kind == gpu_stage.FATBIN_ELF and arch != 90
        assert kept[start:start + size] == (bytes(size) if zeroed else library[start:start + size]), (kind, arch)
    pruned = tmp_path / "libsparse_lower_cuda.so"
    pruned.write_bytes(kept)
    abi = ctypes.CDLL(str(pruned))
    abi.sl_backend.restype = ctypes.c_char_p
    assert abi.sl_backend() == b"cuda"


def test_the_plan_carries_each_part_but_the_last_alone_then_the_rest(gpu_stage, tmp_path):
    for name in ("ort/onnxruntime_c_api.h", "data/frame.npz", "whl/a.whl", "ort-gpu/part.00", "ort-gpu/part.01",
                 "ort-gpu/SHA256SUMS"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert gpu_stage.calls(tmp_path) == [[tmp_path / "ort-gpu" / "part.00"],
                                         [tmp_path / n for n in ("ort", "data", "whl", "ort-gpu/part.01",
                                                                 "ort-gpu/SHA256SUMS")]]


def test_the_anchors_layer_list_holds_every_layer_and_weight_of_an_exptool_file(gpu_check, tmp_path):
    model = sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0))
    gpu_check.anchor_plan(model, tmp_path)
    lines = (tmp_path / "plan.txt").read_text().splitlines()
    assert lines[0] == "input 0 3 41 1440 1440" and lines[-1] == f"output {model.graph.output[0].name}"
    kinds = [line.split()[0] for line in lines[1:-1]]
    assert {kind: kinds.count(kind) for kind in set(kinds)} == {"conv": 21, "add": 8, "relu": 8, "dense": 1,
                                                                "reshape": 1}
    assert lines[1].split()[:9] == ["conv", "conv0", "0", "1", "ReLU", "1", "0", "200000", "res0"]
    weights = sum(int(np.prod(tensor.dims)) for tensor in model.graph.initializer)
    assert (tmp_path / "weights.bin").stat().st_size == 2 * weights
