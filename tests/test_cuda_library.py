"""The CUDA build of the library (libsparse_lower_cuda.so), where this machine has CUDA's nvcc (every
machine of this project has; the build is SPARSE_LOWER_CUDA=AUTO): it is built and installed with the
package, exports onnxruntime's entry point and the C ABI of custom_ops/cuda/abi.h, and serves the CPU
kernels where no GPU is (the same outputs as the CPU library). Its CUDA kernels run on a GPU only:
their bodies are tested on the host by test_cuda_bodies, the kernels by tools/gpu_check.py."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import sparse_lower
from oracle import random_sparse
from sparse_lower import runtime
from sparse_lower.cuda_kernels import Kernels
from sparse_lower.errors import SparseLowerError
from sparse_lower.models.samples import centerpoint_head_stack

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


@pytest.fixture(scope="module")
def cuda_library() -> str:
    if NVCC is None:
        pytest.skip("no nvcc on this machine: the package was built without its CUDA library")
    path = sparse_lower.cuda_library_path()
    assert path is not None and Path(path).is_file(), "nvcc is here, but the package holds no CUDA library"
    return path


def test_it_exports_the_entry_point_and_the_c_abi(cuda_library):
    library = ctypes.CDLL(cuda_library)
    for name in ("RegisterCustomOps", "sl_submanifold_map", "sl_reached_map", "sl_target_map", "sl_site_index",
                 "sl_site_order", "sl_active_sites", "sl_coalesce_map", "sl_unfold", "sl_fold", "sl_indexed_conv", "sl_indexed_conv_int8"):
        assert hasattr(library, name), name
    library.sl_backend.restype = ctypes.c_char_p
    assert library.sl_backend() == b"cuda"


def test_it_serves_the_cpu_kernels_where_no_gpu_is(cuda_library, rng):
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu")
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=600)
    feeds = {"features": features, "coords": coords}
    want = sparse_lower.create_session(model).run(None, feeds)
    options = runtime.register_library(ort.SessionOptions(), cuda_library)
    got = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_create_session_loads_it_for_the_cuda_provider(cuda_library, monkeypatch):
    """Asked for onnxruntime's CUDA provider, create_session registers the CUDA library (onnxruntime
    without a GPU build warns and runs the CPU kernels); without a CUDA build, it says how to get one."""
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu")
    options = ort.SessionOptions()
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        sparse_lower.create_session(model, sess_options=options,
                                    providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert options.get_session_config_entry(runtime.REGISTERED_KEY) == cuda_library
    monkeypatch.setattr(runtime, "cuda_library_path", lambda: None)
    with pytest.raises(FileNotFoundError, match="holds no libsparse_lower_cuda.so"):
        sparse_lower.create_session(model, providers=[("CUDAExecutionProvider", {}), "CPUExecutionProvider"])


def test_placement_reads_onnxruntimes_record_of_each_node():
    """What create_session reads, for a session on the CUDA provider, to say which custom ops onnxruntime
    left on the CPU: here a CPU session, where every custom op is off any other provider."""
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu")
    options = ort.SessionOptions()
    options.add_session_config_entry(runtime.ASSIGNMENT_KEY, "1")
    session = sparse_lower.create_session(model, sess_options=options)
    placed = runtime.placement(session)
    assert set(placed) == {"CPUExecutionProvider"}
    custom = sorted((n.op_type, n.name) for n in model.graph.node if n.domain == "sparse_lower")
    assert runtime.custom_ops_off(session, "CPUExecutionProvider") == []
    assert runtime.custom_ops_off(session, "CUDAExecutionProvider") == custom
    with pytest.warns(sparse_lower.errors.SparseLowerWarning,
                      match=r"7 custom op\(s\) run on the CPU, not on CUDAExecutionProvider.*IndexedConv x3"):
        runtime._warn_of_custom_ops_off(session, "CUDAExecutionProvider")


@pytest.fixture
def emulated_stream(monkeypatch):
    """The stream machinery of create_session's CUDA sessions over the emulated library (its one stream,
    null), with its checks deferred, set back after the test."""
    monkeypatch.setattr(runtime, "_STREAMS", {})
    library = runtime.emulated_library_path()
    stream = runtime._Stream(library, 0)
    yield library, stream
    stream.abi.sl_defer_checks(ctypes.c_void_p(stream.address), ctypes.c_int32(0))
    stream.report()


def test_a_cuda_session_runs_on_the_librarys_stream(emulated_stream):
    """The CUDA provider's options gain the library's stream for its GPU (one per GPU), unless they name
    one of their own; other providers pass as they are."""
    library, stream = emulated_stream
    runtime._STREAMS[library, 0] = stream
    providers, got = runtime._on_library_stream(["CUDAExecutionProvider", "CPUExecutionProvider"], library)
    assert got is stream
    assert providers == [("CUDAExecutionProvider", {"user_compute_stream": str(stream.address),
                                                    "has_user_compute_stream": "1"}), "CPUExecutionProvider"]
    own = [("CUDAExecutionProvider", {"user_compute_stream": "1234"})]
    assert runtime._on_library_stream(own, library) == (own, None)


def test_a_cuda_session_reports_a_refusal_its_run_left_on_the_stream(emulated_stream, rng):
    """What CudaSession does after each run: the first refusal recorded on its stream (here by a kernel of
    the emulated library, as the CUDA provider's ops record theirs) raises with the op's message; a run
    with nothing recorded returns its outputs."""
    library, stream = emulated_stream
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu")
    options = runtime.register_library(ort.SessionOptions())
    session = runtime.CudaSession(model.SerializeToString(), stream, sess_options=options,
                                  providers=["CPUExecutionProvider"])
    features, coords = random_sparse(rng, 1, 5, (10, 40, 40), count=300)
    feeds = {"features": features, "coords": coords}
    want = sparse_lower.create_session(model).run(None, feeds)
    for a, b in zip(session.run(None, feeds), want):
        np.testing.assert_array_equal(a, b)
    kernels = Kernels.emulated()
    kernels.submanifold_map(np.array([[0, 1, 1], [-1, 2, 2]]), kernel_shape=[3, 3], spatial_shape=[5, 6])
    with pytest.raises(SparseLowerError, match="row 1 of coords has a negative batch -1"):
        session.run(None, feeds)
    session.run(None, feeds)  # reported once
