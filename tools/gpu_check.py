"""Checks and times the gpu target's CUDA kernels on a GPU machine, in one command.

    python tools/gpu_check.py [--ort-include DIR] [--data DIR] [--repeat 20] [--libspconv DIR] [--ort-gpu DIR]

1. Builds the CPU and CUDA libraries with CMake for this machine's GPU (`CMAKE_CUDA_ARCHITECTURES=native`,
   or --arch) into build/gpu_check/. The onnxruntime headers come from --ort-include or $ORT_INCLUDE_DIR (a GPU
   machine may have no network to fetch them).
2. Runs tests/test_cuda_bodies.py with the CUDA library in place of the emulated one: every kernel
   against the CPU library on the random cases and on both real frames (index tables bitwise, float32
   within 1e-5, float16 within 1e-2 relative).
3. Lowers CenterPoint's backbone (SpMiddleResNetFHD, 5 features, deterministic weights) for the gpu
   target and runs it on the real CenterPoint frame: the custom ops through the CUDA library's C ABI
   (sparse_lower.cuda_kernels, CuPy arrays), the one standard op by PyTorch, kernel maps included, in
   float32 and with the convs in float16. Compares each with the CPU library's run in onnxruntime and
   times the whole run and, in further runs, each node with CUDA events (medians of --repeat runs). Every
   op checks its inputs and copies the verdict back, so each node's time includes a synchronisation and
   the host's launch; PyTorch's profiler then gives the GPU's own busy time a run and its largest kernels.
4. With --libspconv DIR (as tools/gpu_stage.py stages it), the anchor: NVIDIA's closed libspconv 1.1.10 on
   the same frame and GPU. tools/libspconv_anchor.cpp (our driver, against its public header) is built with
   nvcc, builds the engine in float16 from NVIDIA's exptool file of the backbone (wild/nvidia_exptool/ of
   --data, read here into a layer list: anchor_plan) and times --repeat runs with CUDA events; its output
   is checked against spconv's (the file's expected outputs, within 1e-2 relative) and its median printed
   beside ours.
5. With --ort-gpu DIR (the parts of onnxruntime-gpu that tools/gpu_stage.py wrote), onnxruntime's CUDA
   execution provider for real: onnxruntime-gpu 1.31.1 reassembled into build/gpu_check/, the CUDA 13
   libraries of PyTorch's nvidia-* packages loaded, then through sparse_lower.create_session (the CUDA
   library) the gpu-target models of CenterPoint's backbone (built, and NVIDIA's exptool file imported),
   the sparse UNet and VoxelNeXt on the real frame, and Autoware's encoder on its own inputs. Every custom
   op must be on the CUDA provider (onnxruntime's record of the placement names those that are not); the
   inputs and outputs stay on the GPU (IO binding); each output within 1e-4 of the CPU library's (relative
   to the largest value); medians of --repeat runs. Each model's portable-target form runs in a plain
   session in the same provider, timed and checked alike. The newest step, in this process: it runs last,
   after the others' results are written.

Prints tables (and writes them with the numbers to $OUT/gpu_check.json after each step, when $OUT is set);
exits 1 when a check fails. libspconv's CenterPoint backbone takes 9.8 ms on an A30 (fp16, NVIDIA's figure).

    python tools/gpu_check.py --ort-cpu [--rows N]

runs step 5 alone in onnxruntime's CPU provider with the installed package's library: no build, no GPU, a
check of this script's code (tests/test_gpu_check.py runs it on a small frame); its times are no GPU's.

A GPU machine lent here has no network and takes at most 64 MiB a call, the working tree (4 MiB)
included. On this side, from the checkout root, with a clone of NVIDIA-AI-IOT/Lidar_AI_Solution:

    python tools/gpu_stage.py --lidar-ai-solution ../Lidar_AI_Solution

writes all it needs into the git-ignored .gpu/ (the onnxruntime headers, the frames and the exptool file,
onnx-graphsurgeon, which the machine's Python lacks, onnxruntime-gpu in parts, libspconv) and prints the
calls, which follow one another at once (the machine stays warm 30 s after a call; the parts wait in its
/tmp). As staged on 2026-11-28:

    call  carry (ignored paths, with the 4 MiB working tree)                     command
    1     .gpu/ort-gpu/part.00                                       (52 MiB)   bash tools/gpu_run.sh --keep
    2     .gpu/ort .gpu/data .gpu/whl .gpu/libspconv                 (29 MiB)   bash tools/gpu_run.sh
          .gpu/ort-gpu/part.01 .gpu/ort-gpu/SHA256SUMS

The second call installs the wheels, then runs `python3 tools/gpu_check.py --ort-include .gpu/ort --data
.gpu/data --ort-gpu /tmp/sparse_lower_ort_gpu --libspconv .gpu/libspconv`, its log and this JSON in $OUT:
about 6 minutes (an estimate; 2 of them the CUDA build), with a timeout_s of 600 to spare.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import io
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import numpy as np

from portable_torch import TorchGraph  # a script beside this one

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "gpu_check"
LIBSPCONV_A30_MS = 9.8
ORT_GPU_VERSION = "1.31.1"  # tools/gpu_stage.py's
# What onnxruntime-gpu's CUDA provider links to (and cuDNN, which it loads when an op needs it), in the order
# they need each other; the GPU machine has them in PyTorch's nvidia-* packages.
CUDA_LIBRARIES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libcurand.so.10", "libcufft.so.12",
                  "libcudnn.so.9")
# float32 as float32 in the CUDA provider (its MatMul would take TF32 otherwise): the comparison is float32's
CUDA_PROVIDERS = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
PROVIDERS = {"cuda": CUDA_PROVIDERS, "cpu": ["CPUExecutionProvider"]}
FLOAT32_TOLERANCE = 1e-4  # relative to the largest value of the CPU library's output
FLOAT16_TOLERANCE = 1e-2
EXPTOOL = Path("wild") / "nvidia_exptool" / "centerpoint.scn.onnx"  # in the data folder
ANCHOR = ROOT / "tools" / "libspconv_anchor.cpp"


def build(ort_include: str | None, architecture: str) -> Path:
    """The build folder holding libsparse_lower_ops.so and libsparse_lower_cuda.so."""
    folder = BUILD
    configure = ["cmake", "-S", str(ROOT), "-B", str(folder), "-G", "Ninja", "-DSPARSE_LOWER_CUDA=ON",
                 f"-DCMAKE_CUDA_ARCHITECTURES={architecture}"]
    if ort_include:
        configure.append(f"-DORT_INCLUDE_DIR={ort_include}")
    started = time.perf_counter()
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(folder), "--target", "sparse_lower_ops", "sparse_lower_cuda"], check=True,
                   stdout=subprocess.DEVNULL)
    print(f"built the CPU and CUDA libraries in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


def kernel_tests(data: Path) -> bool:
    """tests/test_cuda_bodies.py on the CUDA library; whether every test passed."""
    env = {**os.environ, "SPARSE_LOWER_KERNELS": "cuda", "SPARSE_LOWER_DATA": str(data)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_cuda_bodies.py")], env=env, cwd=ROOT, capture_output=True, text=True)
    print("kernels against the CPU library (tests/test_cuda_bodies.py on the GPU): "
          + done.stdout.strip().splitlines()[-1], flush=True)
    if done.returncode != 0:
        print(done.stdout[-6000:], done.stderr[-2000:], sep="\n")
    return done.returncode == 0


class KernelModel:
    """A gpu-target model run node by node: its custom ops through the C ABI of `kernels` (the CUDA
    library on the GPU; the emulated one on the host, as tests/test_cuda_bodies.py runs it), the rest by
    PyTorch (tools/portable_torch.py's TorchGraph) on `device`, its convs' products in `precision` ("float32",
    or "float16" / "bfloat16" on tensor cores). With `deferred`,
    the ops' input checks report once, at the end of each run (the kernels' deferred checks: nothing but
    the sizes of outputs comes back to the host inside a run); else each op reports its own. `splits`: the
    blocks that share each conv tile's taps (0: the library's choice for the GPU, 1: none)."""

    def __init__(self, model, kernels, device: str, precision: str, deferred: bool = True, splits: int = 0):
        import torch

        self.torch, self.kernels, self.device, self.precision = torch, kernels, device, precision
        self.deferred, self.splits = deferred, splits
        ops = {"SubmanifoldMap": self._submanifold_map, "StridedMap": self._reached_map,
               "TransposedMap": self._reached_map, "TargetMap": self._target_map, "SiteIndex": self._site_index,
               "SiteOrder": self._site_order, "IndexedFold": self._fold, "IndexedUnfold": self._unfold,
               "IndexedConv": self._conv,
               "ActiveSites": self._active_sites, "CoalesceMap": self._coalesce_map, "Rulebook": self._on_cpu,
               "IndexedConvInt8": self._conv_int8}
        self.graph = TorchGraph(model, device, custom=ops)
        self.cpu_sessions = {}

    # the custom ops: torch tensors in and out, views of the kernels' array module in between (no copies)
    def _in(self, tensor):
        return None if tensor is None else self.kernels.xp.asarray(tensor)

    def _out(self, *arrays):
        return [self.torch.as_tensor(a, device=self.device) for a in arrays]

    @staticmethod
    def _geometry(attrs: dict) -> dict:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}

    def _submanifold_map(self, node, inputs, attrs):
        return self._out(self.kernels.submanifold_map(self._in(inputs[0]), **self._geometry(attrs)))

    def _reached_map(self, node, inputs, attrs):
        return self._out(*self.kernels.reached_map(node.op_type, self._in(inputs[0]), **self._geometry(attrs)))

    def _target_map(self, node, inputs, attrs):
        return self._out(self.kernels.target_map(self._in(inputs[0]), self._in(inputs[1]), **self._geometry(attrs)))

    def _site_index(self, node, inputs, attrs):
        return self._out(self.kernels.site_index(self._in(inputs[0]), attrs["spatial_shape"], attrs["batch_size"]))

    def _site_order(self, node, inputs, attrs):
        return self._out(*self.kernels.site_order(self._in(inputs[0]), attrs["spatial_shape"]))

    def _active_sites(self, node, inputs, attrs):
        return self._out(*self.kernels.active_sites(self._in(inputs[0])))

    def _coalesce_map(self, node, inputs, attrs):
        return self._out(*self.kernels.coalesce_map(self._in(inputs[0]), attrs["spatial_shape"], attrs.get("members", 0)))

    def _unfold(self, node, inputs, attrs):
        return self._out(self.kernels.unfold(self._in(inputs[0]), self._in(inputs[1])))

    def _fold(self, node, inputs, attrs):
        rows, idx = self._in(inputs[0]), self._in(inputs[1])
        if attrs.get("mode", b"rows") == b"dense":
            return self._out(self.kernels.fold(rows, idx, spatial_shape=attrs["spatial_shape"],
                                               batch_size=attrs["batch_size"]))
        init = inputs[3] if len(inputs) > 3 else None
        return self._out(self.kernels.fold(rows, idx, like_rows=inputs[2].shape[0], init=self._in(init)))

    def _epilogue(self, x, optional: list, attrs) -> tuple:
        """A conv's optional inputs after its required ones (B, coords, R), coords checked to pair with X's
        rows as the op does: (bias, residual, activation) as the kernels take them."""
        bias, coords, residual = (optional + [None] * 3)[:3]
        if coords is not None and coords.shape[0] != x.shape[0]:
            raise ValueError(f"X has {x.shape[0]} rows but coords has {coords.shape[0]}")
        return self._in(bias), self._in(residual), attrs.get("activation", b"none").decode()

    def _conv(self, node, inputs, attrs):
        x, idx, w = inputs[:3]
        bias, residual, activation = self._epilogue(x, inputs[3:], attrs)
        return self._out(self.kernels.indexed_conv(self._in(x), self._in(idx), self._in(w), bias, residual, activation,
                                                   self.precision, self.splits))

    def _conv_int8(self, node, inputs, attrs):
        x, idx, w, x_scale, w_scale = inputs[:5]
        bias, residual, activation = self._epilogue(x, inputs[5:], attrs)
        return self._out(self.kernels.indexed_conv_int8(self._in(x), self._in(idx), self._in(w), self._in(x_scale),
                                                        self._in(w_scale), bias, residual, activation))

    def _on_cpu(self, node, inputs, attrs):
        """An op with no CUDA kernel (the CUDA library leaves it to onnxruntime's CPU provider): the CPU
        library's kernel, its inputs copied to the host and its outputs back, as onnxruntime would."""
        import onnx

        import sparse_lower

        given = {name: tensor.cpu().numpy() for name, tensor in zip(node.input, inputs) if name}
        if node.name not in self.cpu_sessions:
            values = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), None)
                      for name, v in given.items()]
            graph = onnx.helper.make_graph([node], node.name, values,
                                           [onnx.helper.make_empty_tensor_value_info(o) for o in node.output])
            model = onnx.helper.make_model(graph, ir_version=10, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                                                onnx.helper.make_opsetid(node.domain, 1)])
            self.cpu_sessions[node.name] = sparse_lower.create_session(model)
        return [self.torch.as_tensor(v, device=self.device) for v in self.cpu_sessions[node.name].run(None, given)]

    def run(self, feeds: dict, on_node=None) -> np.ndarray:
        self.kernels.defer_checks(self.deferred)
        try:
            (output,) = self.graph.run(feeds, on_node)
        finally:
            self.kernels.defer_checks(False)
        if self.deferred:
            self.kernels.report()
        return output

    def timed(self, feeds: dict, repeat: int) -> tuple[float, dict]:
        """(the median ms of a whole run, {node name: median ms}). The whole runs have CUDA events around
        them alone; each node's time comes from further runs with events around every node."""
        torch = self.torch
        for _ in range(3):  # warm-up: CuPy's and the driver's first allocations, module loads
            self.run(feeds)
        torch.cuda.synchronize()
        whole, per_node = [], {}
        for _ in range(repeat):
            begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            self.run(feeds)
            finish.record()
            torch.cuda.synchronize()
            whole.append(begin.elapsed_time(finish))
        for _ in range(repeat):
            events = []

            def on_node(node, compute, events=events):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                outputs = compute()
                end.record()
                events.append((node.name, start, end))
                return outputs
            self.run(feeds, on_node)
            torch.cuda.synchronize()
            for name, start, end in events:
                per_node.setdefault(name, []).append(start.elapsed_time(end))
        return statistics.median(whole), {name: statistics.median(times) for name, times in per_node.items()}

    def busy(self, feeds: dict, runs: int = 5) -> tuple[float, list]:
        """(the GPU's kernel and copy time in ms per run, [(kernel name, ms per run)] largest first), by
        PyTorch's profiler: what a run costs on the GPU alone, without the host's launches and waits."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as profiled:
            for _ in range(runs):
                self.run(feeds)
            self.torch.cuda.synchronize()
        kernels = [(e.key, e.self_device_time_total / 1e3 / runs) for e in profiled.key_averages()
                   if e.self_device_time_total > 0]
        kernels.sort(key=lambda kernel: -kernel[1])
        return sum(ms for _, ms in kernels), kernels


def backbone(data: Path, repeat: int) -> tuple[bool, dict]:
    import onnxruntime as ort
    import torch

    import sparse_lower
    from sparse_lower.cuda_kernels import Kernels
    from sparse_lower.frames.sample import load_voxels
    from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
    from sparse_lower.report import render
    from sparse_lower.verify import relative_error

    torch.backends.cuda.matmul.allow_tf32 = False
    model = sparse_lower.lower(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0)), target="gpu")
    features, coords, _ = load_voxels(data / "nuscenes_centerpoint_voxels.npz")
    feeds = {"features": features, "coords": coords}
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    cpu = sparse_lower.create_session(model, sess_options=options)
    cpu.run(None, feeds)
    started = time.perf_counter()
    (want,) = cpu.run(None, feeds)
    cpu_ms = 1e3 * (time.perf_counter() - started)
    on_gpu = {name: torch.as_tensor(value, device="cuda") for name, value in feeds.items()}
    results, passed = {"cpu_library_ms": cpu_ms, "voxels": len(coords)}, True
    nodes = {}
    kernels = Kernels.cuda()
    # int8: calibrated on the other real frame, its first conv (raw features) in float32
    calibration = dict(zip(("features", "coords"), load_voxels(data / "nuscenes_bevfusion_voxels.npz")[:2]))
    quantized, _ = sparse_lower.quantize(model, [calibration])
    (want_int8,) = sparse_lower.create_session(quantized, sess_options=options).run(None, feeds)
    # (model, products, deferred checks, tap splits, tolerance, expected): the two float16 rows after the first
    # measure what the deferred checks and the split taps each save
    variants = {"float32": (model, "float32", True, 0, FLOAT32_TOLERANCE, want),
                "float16": (model, "float16", True, 0, FLOAT16_TOLERANCE, want),
                "float16, per-op checks": (model, "float16", False, 0, FLOAT16_TOLERANCE, want),
                "float16, no tap split": (model, "float16", True, 1, FLOAT16_TOLERANCE, want),
                "bfloat16": (model, "bfloat16", True, 0, FLOAT16_TOLERANCE, want),
                "int8": (quantized, "float32", True, 0, FLOAT16_TOLERANCE, want_int8)}
    for variant, (lowered, precision, deferred, splits, tolerance, expected) in variants.items():
        gpu = KernelModel(lowered, kernels, "cuda", precision, deferred, splits)
        got = gpu.run(on_gpu).cpu().numpy()
        error = relative_error(got, expected)
        ms, per_node = gpu.timed(on_gpu, repeat)
        busy_ms, kernel_ms = gpu.busy(on_gpu)
        ok = error <= tolerance
        passed &= ok
        results[variant] = {"median_ms": ms, "relative_error_vs_cpu": error, "tolerance": tolerance, "ok": ok,
                            "gpu_busy_ms": busy_ms, "gpu_ms_by_kernel": kernel_ms}
        for name, value in per_node.items():
            nodes.setdefault(name, {})[variant] = value
    rows = [[name, *(f"{times[v]:.3f}" if v in times else "" for v in variants)] for name, times in nodes.items()]
    rows.append(["whole backbone (median of runs)", *(f"{results[v]['median_ms']:.2f}" for v in variants)])
    print(f"CenterPoint backbone, {len(coords):,} voxels, {torch.cuda.get_device_name()}: ms per node (CUDA events, "
          f"medians of {repeat} runs; int8 calibrated on the BEVFusion frame, against the CPU library's int8)")
    print(render(["node", *(f"{v} ms" for v in variants)], rows))
    for variant in variants:
        r = results[variant]
        print(f"{variant}: {r['median_ms']:.2f} ms a frame ({LIBSPCONV_A30_MS / r['median_ms']:.2f}× libspconv's "
              f"{LIBSPCONV_A30_MS} ms on an A30), {r['relative_error_vs_cpu']:.1e} from the CPU library "
              f"({'ok' if r['ok'] else 'FAILED'}: ≤ {r['tolerance']:.0e})")
    for variant in variants:
        r = results[variant]
        print(f"{variant}: the GPU busy {r['gpu_busy_ms']:.2f} ms a run ({100 * r['gpu_busy_ms'] / r['median_ms']:.0f} % "
              f"of the run; PyTorch's profiler, 5 runs); largest:")
        print(render(["kernel or copy", "ms a run"], [[name[:90], f"{ms:.3f}"] for name, ms in r["gpu_ms_by_kernel"][:8]]))
    print(f"the CPU library on this machine's {options.intra_op_num_threads} cores: {cpu_ms:.0f} ms")
    results["per_node_ms"] = nodes
    return passed, results


# -- onnxruntime's CUDA execution provider -----------------------------------------------------------------

def unpack_ort_gpu(parts: Path, folder: Path) -> Path:
    """onnxruntime-gpu reassembled from the parts tools/gpu_stage.py split it into (each checked against
    their SHA256SUMS, none missing) into `folder`; the folder to put first on sys.path. Raises
    FileNotFoundError or ValueError, with what is wrong, where a part is missing or differs."""
    sums = (parts / "SHA256SUMS").read_text()
    if (folder / "SHA256SUMS").is_file() and (folder / "SHA256SUMS").read_text() == sums:
        return folder  # unpacked by an earlier run on this machine
    archive = bytearray()
    for line in sums.splitlines():
        digest, name = line.split()
        part = (parts / name).read_bytes()
        if hashlib.sha256(part).hexdigest() != digest:
            raise ValueError(f"{parts / name} differs from the one tools/gpu_stage.py wrote")
        archive += part
    shutil.rmtree(folder, ignore_errors=True)
    with lzma.open(io.BytesIO(archive)) as unpacked, tarfile.open(fileobj=unpacked, mode="r|") as tar:
        # extraction filters came with Python 3.11.4; the archive is gpu_stage.py's own where they are absent
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (folder / "SHA256SUMS").write_text(sums)
    return folder


def use_ort_gpu(site: Path) -> bool:
    """Makes `site`'s onnxruntime-gpu the onnxruntime this process imports (before anything imports one), with
    CUDA_LIBRARIES loaded from PyTorch's nvidia-* packages first: the CUDA provider's library then finds
    them by name, where the loader's own search (no LD_LIBRARY_PATH there) would not. Whether it is the
    onnxruntime imported (else says why: the other steps run on whichever it is)."""
    sys.path.insert(0, str(site))
    nvidia = Path(importlib.util.find_spec("torch").origin).parents[1] / "nvidia"
    missing = []
    for name in CUDA_LIBRARIES:
        try:
            ctypes.CDLL(str(next(nvidia.rglob(name))), mode=ctypes.RTLD_GLOBAL)
        except (StopIteration, OSError) as error:
            missing.append(f"{name} ({str(error) or 'not there'})")
    import onnxruntime as ort

    where = Path(ort.__file__).parent
    print(f"onnxruntime {ort.__version__} from {where}, providers {ort.get_available_providers()}; CUDA libraries "
          f"from {nvidia}" + (f", not loaded: {missing}" if missing else ""), flush=True)
    if ort.__version__ == ORT_GPU_VERSION and where.parent == site:
        return True
    print(f"onnxruntime's CUDA provider: not checked: onnxruntime {ort.__version__} from {where} was imported, not "
          f"onnxruntime-gpu {ORT_GPU_VERSION} from {site}")
    return False


def ort_cases(frame: dict, exptool: Path) -> dict:
    """{name: (source model, feeds)} of the models the onnxruntime phase runs: CenterPoint's backbone as
    sparse_lower.models builds it and as NVIDIA's exptool wrote it (`exptool`, imported), the sparse UNet
    and VoxelNeXt, on `frame` ({"features", "coords"}); Autoware's encoder on the inputs its exporter was
    traced with (its grid is 16³: no real frame fits it)."""
    import onnx

    import sparse_lower
    from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd, voxelnext

    autoware = np.load(ROOT / "tests" / "data" / "exports" / "autoware_encoder.expected.npz")
    return {
        "CenterPoint backbone": (sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0)), frame),
        "CenterPoint, NVIDIA's exptool file": (sparse_lower.import_model(exptool),
                                               {"0": frame["features"], "coords": frame["coords"]}),
        "sparse UNet": (onnx.load(ROOT / "models" / "sparse_unet.onnx"), frame),
        "Autoware encoder": (sparse_lower.import_model(ROOT / "models" / "autoware_encoder.onnx"),
                             {"features": autoware["features"], "indices": autoware["indices"]}),
        "VoxelNeXt": (voxelnext(CanonicalEmitter("voxelnext"), np.random.default_rng(0)), frame),
    }


def ort_phase(cases: dict, device: str, repeat: int) -> tuple[bool, dict]:
    """Each case lowered for the gpu target and run by create_session in onnxruntime with PROVIDERS[device]
    (the CUDA library on "cuda"), and lowered for the portable target and run in a plain session with the
    same providers; both against the CPU library's session (float32 within 1e-4 relative). Prints a table;
    (whether every case passed, {case: results})."""
    import onnxruntime as ort

    from sparse_lower.report import render
    from sparse_lower.runtime import provider_name

    provider = provider_name(PROVIDERS[device][0])
    results = {}
    for name, (model, feeds) in cases.items():
        try:
            results[name] = ort_case(model, feeds, device, repeat)
        except Exception as error:  # one model's failure must not cost the others' results: GPU runs are scarce
            traceback.print_exc()
            results[name] = {"ok": False, "raised": f"{type(error).__name__}: {error}"}
    ran = {name: r for name, r in results.items() if "raised" not in r}
    print(f"onnxruntime {ort.__version__} with {provider}: inputs and outputs bound on the device (IO binding), "
          f"medians of {repeat} runs; errors relative to the largest value of the CPU library's output")
    header = ["model", "rows in", "custom ops on it", "gpu target ms", "error", "portable ms", "portable nodes on it",
              "portable error", "CPU library ms"]
    rows = [[name, f"{r['rows']:,}", f"{r['custom_ops'] - len(r['custom_ops_elsewhere'])} of {r['custom_ops']}",
             f"{r['gpu_target_ms']:.2f}", f"{max(r['error'].values()):.1e}", f"{r['portable_ms']:.2f}",
             f"{r['portable_nodes'].get(provider, 0)} of {sum(r['portable_nodes'].values())}",
             f"{max(r['portable_error'].values()):.1e}", f"{r['cpu_library_ms']:.1f}"] for name, r in ran.items()]
    print(render(header, rows))
    for name in results.keys() - ran.keys():
        print(f"{name}: FAILED: {results[name]['raised']}")
    for name, r in ran.items():
        if r["providers"][0] != provider:
            print(f"{name}: FAILED: the session has {r['providers']}, not {provider}")
        for op in r["custom_ops_elsewhere"]:
            print(f"{name}: custom op not on {provider}: {op}")
        for output in (o for o, e in r["error"].items() if e > FLOAT32_TOLERANCE):
            print(f"{name}: FAILED: output {output} is {r['error'][output]:.1e} from the CPU library's")
        for output in (o for o, e in r["portable_error"].items() if e > FLOAT32_TOLERANCE):
            print(f"{name}: FAILED: the portable model's output {output} is {r['portable_error'][output]:.1e} from "
                  f"the CPU library's")
    name, (model, feeds) = next(iter(cases.items()))
    refusal = ort_refusal(model, feeds, device)
    print(f"a refused frame ({name}, a negative batch in row 7): {refusal['message']!r}; then a good frame ran"
          + ("" if refusal["ok"] else ": FAILED, the op's message is not the one expected"))
    return all(r["ok"] for r in results.values()) and refusal["ok"], {**results, "refusal": refusal}


def ort_refusal(model, feeds: dict, device: str) -> dict:
    """A frame with a negative batch in row 7 through create_session's session (on the CUDA provider, its
    checks deferred to the end of the run): the run must fail with the op's message, and the next run of
    a good frame must not (the refusal is reported once)."""
    import sparse_lower

    session = sparse_lower.create_session(sparse_lower.lower(model, target="gpu"), providers=PROVIDERS[device])
    feeds = _typed(sparse_lower.lower(model, target="gpu"), feeds)
    bad = {**feeds, "coords": feeds["coords"].copy()}
    bad["coords"][7, 0] = -1
    try:
        session.run(None, bad)
        message = "(no error)"
    except Exception as error:  # SparseLowerError on the CUDA provider, onnxruntime's own on the CPU
        message = str(error)
    session.run(None, feeds)
    return {"message": message, "ok": "row 7 of coords has a negative batch -1" in message}


def ort_case(model, feeds: dict, device: str, repeat: int) -> dict:
    import sparse_lower
    from sparse_lower.onnx_conventions import CUSTOM_DOMAIN
    from sparse_lower.runtime import custom_ops_off, placement, provider_name, session_for

    providers = PROVIDERS[device]
    provider = provider_name(providers[0])
    gpu_form = sparse_lower.lower(model, target="gpu")
    feeds = _typed(gpu_form, feeds)
    cpu = sparse_lower.create_session(gpu_form, sess_options=_options(record=False))
    names = [o.name for o in cpu.get_outputs()]
    cpu.run(None, feeds)  # the first run allocates
    started = time.perf_counter()
    want = dict(zip(names, cpu.run(None, feeds)))
    cpu_ms = 1e3 * (time.perf_counter() - started)
    session = sparse_lower.create_session(gpu_form, sess_options=_options(record=device == "cpu"), providers=providers)
    gpu_ms, got = _bound_median(session, feeds, device, repeat)
    portable_form = sparse_lower.lower(model, target="portable")
    portable = session_for(portable_form, sess_options=_options(record=True), providers=providers)
    portable_ms, portable_got = _bound_median(portable, _typed(portable_form, feeds), device, repeat)
    result = {"rows": len(next(iter(feeds.values()))), "providers": session.get_providers(),
              "custom_ops": sum(node.domain == CUSTOM_DOMAIN for node in gpu_form.graph.node),
              "custom_ops_elsewhere": [f"{op} {name}" for op, name in custom_ops_off(session, provider)],
              "error": _errors(got, want), "gpu_target_ms": gpu_ms, "cpu_library_ms": cpu_ms,
              "portable_ms": portable_ms, "portable_error": _errors(portable_got, want),
              "portable_nodes": {ep: len(nodes) for ep, nodes in placement(portable).items()}}
    result["ok"] = (result["providers"][0] == provider and not result["custom_ops_elsewhere"]
                    and max(result["error"].values()) <= FLOAT32_TOLERANCE
                    and max(result["portable_error"].values()) <= FLOAT32_TOLERANCE)
    return result


def _options(record: bool):
    """Session options on every core; with `record`, keeping onnxruntime's record of the provider of each node
    (create_session keeps it itself where the CUDA provider is asked for)."""
    import onnxruntime as ort

    from sparse_lower.runtime import ASSIGNMENT_KEY

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    if record:
        options.add_session_config_entry(ASSIGNMENT_KEY, "1")
    return options


def _typed(model, feeds: dict) -> dict:
    """The feeds of the model's inputs, in the element types the model declares."""
    from onnx.helper import tensor_dtype_to_np_dtype

    return {v.name: np.ascontiguousarray(feeds[v.name], tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
            for v in model.graph.input}


def _bound_median(session, feeds: dict, device: str, repeat: int) -> tuple[float, dict]:
    """(the median ms of `repeat` runs after two warm-ups, {output: value}) with the inputs copied to
    `device` once and the outputs left there (IO binding): a run moves nothing between the host and the
    device but what the model itself moves. Each run ends when the outputs are ready."""
    import onnxruntime as ort

    binding = session.io_binding()
    values = [ort.OrtValue.ortvalue_from_numpy(value, device, 0) for value in feeds.values()]
    for name, value in zip(feeds, values):
        binding.bind_ortvalue_input(name, value)
    names = [o.name for o in session.get_outputs()]
    for name in names:
        binding.bind_output(name, device)
    times = []
    for _ in range(2 + repeat):
        started = time.perf_counter()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times[2:]), dict(zip(names, binding.copy_outputs_to_cpu()))


def _errors(got: dict, want: dict) -> dict:
    """{output: error}: a float output's largest difference relative to the largest value of `want`'s; an
    integer one (coordinates) 0 where equal, inf where not."""
    from sparse_lower.verify import relative_error

    return {name: (relative_error(got[name], value) if np.issubdtype(value.dtype, np.floating)
                   else 0.0 if np.array_equal(got[name], value) else float("inf")) for name, value in want.items()}


# -- the anchor: NVIDIA's libspconv on the same GPU ------------------------------------------------------

def libspconv_anchor(libspconv: Path, data: Path, repeat: int) -> tuple[bool, dict]:
    """NVIDIA's closed libspconv (DIR as tools/gpu_stage.py stages it) on CenterPoint's backbone as NVIDIA's
    exptool wrote it, float16, the real CenterPoint frame: tools/libspconv_anchor.cpp built with nvcc and run
    `repeat` times (CUDA events). Its output against spconv's (the file's expected outputs), float16's
    tolerance; (whether it is within, results)."""
    import onnx

    from sparse_lower.verify import relative_error

    folder = BUILD / "libspconv_anchor"
    folder.mkdir(parents=True, exist_ok=True)
    binary = build_anchor(libspconv, folder)
    anchor_plan(onnx.load(data / EXPTOOL), folder)
    frame = np.load(data / "nuscenes_centerpoint_voxels.npz")
    frame["features"].astype(np.float16).tofile(folder / "features.f16")
    frame["coords"].astype(np.int32).tofile(folder / "indices.i32")
    names = ["plan.txt", "weights.bin", "features.f16", "indices.i32", "output.f16"]
    done = subprocess.run([str(binary), *(str(folder / name) for name in names), str(repeat)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        print(f"libspconv: FAILED ({done.returncode}):", done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        return False, {"ok": False, "stderr": done.stderr[-3000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    want = np.load(data / EXPTOOL.with_name("centerpoint.scn.expected.npz"))["centerpoint"]
    got = np.fromfile(folder / "output.f16", np.float16).reshape(result["output_shape"]).astype(np.float32)
    result["relative_error_vs_spconv"] = relative_error(got, want)
    result["ok"] = result["relative_error_vs_spconv"] <= FLOAT16_TOLERANCE
    result["voxels"] = len(frame["coords"])
    return result["ok"], result


def build_anchor(libspconv: Path, folder: Path) -> Path:
    """tools/libspconv_anchor.cpp built against libspconv's header and library and the CUDA 12 runtime beside
    it (libspconv.so links to libcudart.so.12; one runtime in the process), found there at run time."""
    lib = (libspconv / "lib").resolve()
    binary = folder / "libspconv_anchor"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    subprocess.run([nvcc, "-O2", "-std=c++17", "-cudart", "none", "-I", str(libspconv / "include"), str(ANCHOR),
                    "-o", str(binary), "-L", str(lib), "-lspconv", "-l:libcudart.so.12", "-Xlinker", f"-rpath={lib}"],
                   check=True)
    return binary


def anchor_plan(model, folder: Path) -> None:
    """An exptool file as the layer list tools/libspconv_anchor.cpp reads: libspconv 1.1.10 has no ONNX
    reader (NVIDIA's samples parse the file with protobuf), so Python reads it and the driver only calls
    libspconv's engine builder. plan.txt holds a line per layer, its words separated by spaces, a list as
    its length then its values, an absent rulebook as "-":

        input <tensor> <grid (z, y, x)>
        conv <name> <input> <output> <activation> <subm> <inverse> <output_bound> <rulebook> <kernel_size>
             <stride> <padding> <dilation> <weight shape> <bias shape>
        add <name> <a> <b> <output>
        relu <name> <input> <output>
        dense <name> <input> <output> <format> <input_spatial_shape> <output_shape>
        reshape <name> <input> <output> <dims>
        output <tensor>

    weights.bin holds each conv's weight and bias, float16 as the file stores them, in the plan's order."""
    from onnx import numpy_helper

    initializers = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    first = next(node for node in model.graph.node if node.input[0] == model.graph.input[0].name)
    lines = [f"input {model.graph.input[0].name} {_words(_attributes(first)['input_spatial_shape'])}"]
    weights = []
    for node in model.graph.node:
        a, name, x, output = _attributes(node), node.name, node.input[0], node.output[0]
        if node.op_type == "SparseConvolution":
            weight, bias = (initializers[tensor].astype(np.float16) for tensor in node.input[1:3])
            weights += [weight, bias]
            lists = " ".join(_words(a[key]) for key in ("kernel_size", "stride", "padding", "dilation"))
            lines.append(f"conv {name} {x} {output} {a.get('activation', 'None')} {a['subm']} {a.get('inverse', 0)} "
                         f"{a['output_bound']} {a.get('rulebook') or '-'} {lists} {_words(weight.shape)} "
                         f"{_words(bias.shape)}")
        elif node.op_type == "Add":
            lines.append(f"add {name} {x} {node.input[1]} {output}")
        elif node.op_type == "Relu":
            lines.append(f"relu {name} {x} {output}")
        elif node.op_type == "ScatterDense":
            lines.append(f"dense {name} {x} {output} {a['format']} {_words(a['input_spatial_shape'])} "
                         f"{_words(a['output_shape'])}")
        elif node.op_type == "Reshape":
            lines.append(f"reshape {name} {x} {output} {_words(a['dims'])}")
        else:
            raise ValueError(f"{node.op_type} ({name}) is none of the layers libspconv_anchor builds")
    lines += [f"output {value.name}" for value in model.graph.output]
    (folder / "plan.txt").write_text("\n".join(lines) + "\n")
    (folder / "weights.bin").write_bytes(b"".join(w.tobytes() for w in weights))


def _attributes(node) -> dict:
    """A node's attributes, strings decoded."""
    from onnx import helper

    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {name: v.decode() if isinstance(v, bytes) else v for name, v in values.items()}


def _words(values) -> str:
    return " ".join(map(str, [len(values), *values]))


def real_frame(data: Path, rows: int | None = None) -> dict:
    """The real CenterPoint frame as the reference networks' feeds, its first `rows` voxels where given."""
    from sparse_lower.frames.sample import load_voxels

    features, coords, _ = load_voxels(data / "nuscenes_centerpoint_voxels.npz")
    return {"features": features[:rows], "coords": coords[:rows]}


def ort_gpu_site(parts: Path) -> Path | None:
    """onnxruntime-gpu unpacked from `parts` into the build folder, or None, said why, where it cannot be."""
    try:
        return unpack_ort_gpu(parts, BUILD / "onnxruntime-gpu")
    except (FileNotFoundError, ValueError) as error:
        print(f"onnxruntime's CUDA provider: not checked: {error}. The calls of tools/gpu_stage.py's plan must follow "
              f"one another within 30 s, while the machine is warm: the parts wait in its /tmp", flush=True)
        return None


def compare_with_anchor(anchor: dict, ours: dict) -> None:
    """libspconv's time and error, and ours (step 3's medians) as a multiple of its time on this GPU."""
    theirs = anchor["median_ms"]
    print(f"libspconv {anchor['version']} (NVIDIA's closed engine), float16, {anchor['voxels']:,} voxels: "
          f"{theirs:.2f} ms a frame (CUDA events, median of {anchor['runs']} runs); its output "
          f"{anchor['relative_error_vs_spconv']:.1e} from spconv's ({'ok' if anchor['ok'] else 'FAILED'}: "
          f"≤ {FLOAT16_TOLERANCE:.0e})")
    for precision in ("float32", "float16"):
        print(f"ours, {precision}: {ours[precision]['median_ms']:.2f} ms, "
              f"{ours[precision]['median_ms'] / theirs:.2f}× libspconv's on this GPU")


def save(results: dict) -> None:
    """The results in $OUT/gpu_check.json where $OUT is set; after each phase, so that one that brings the
    process down leaves the others' behind."""
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(results, indent=1))


def check_on_cpu(args) -> None:
    """--ort-cpu: the onnxruntime phase alone, in the CPU provider with the installed package's libraries."""
    print("a check of this script in onnxruntime's CPU provider, on no GPU: its times are not a GPU's")
    passed, results = ort_phase(ort_cases(real_frame(args.data, args.rows), args.data / EXPTOOL), "cpu", args.repeat)
    save({"onnxruntime_cpu": results})
    sys.exit(0 if passed else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ort-include", default=os.environ.get("ORT_INCLUDE_DIR"),
                        help="onnxruntime's C/C++ API headers (default: $ORT_INCLUDE_DIR, else the build finds them)")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("SPARSE_LOWER_DATA", ROOT.parent / "shared" / "data")),
                        help="the folder of the real frames (nuscenes_*_voxels.npz) and of wild/nvidia_exptool/")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--arch", default="native", help="CMAKE_CUDA_ARCHITECTURES (default: this machine's GPU)")
    parser.add_argument("--build-only", action="store_true", help="build the libraries and stop (no GPU needed)")
    parser.add_argument("--ort-gpu", type=Path, metavar="DIR",
                        help="the parts of onnxruntime-gpu tools/gpu_stage.py wrote: run the models in its CUDA "
                             "provider")
    parser.add_argument("--libspconv", type=Path, metavar="DIR",
                        help="libspconv as tools/gpu_stage.py stages it: time NVIDIA's engine on the same frame")
    parser.add_argument("--ort-cpu", action="store_true",
                        help="the onnxruntime phase alone, in the CPU provider (no build, no GPU): a check of this "
                             "script")
    parser.add_argument("--rows", type=int, help="with --ort-cpu: the frame's first ROWS voxels (default: all)")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
    if args.ort_cpu:
        check_on_cpu(args)
    site = ort_gpu_site(args.ort_gpu) if args.ort_gpu else None
    folder = build(args.ort_include, args.arch)
    if args.build_only:
        return
    os.environ["SPARSE_LOWER_LIBRARY"] = str(folder / "libsparse_lower_ops.so")
    os.environ["SPARSE_LOWER_CUDA_LIBRARY"] = str(folder / "libsparse_lower_cuda.so")
    if site is not None and not use_ort_gpu(site):  # before anything imports onnxruntime
        site = None
    passed = kernel_tests(args.data)
    backbone_ok, results = backbone(args.data, args.repeat)
    results["kernel_tests_ok"], passed = passed, passed and backbone_ok
    save(results)
    if args.libspconv:
        anchor_ok, results["libspconv"] = libspconv_anchor(args.libspconv, args.data, args.repeat)
        if "median_ms" in results["libspconv"]:  # it ran
            compare_with_anchor(results["libspconv"], results)
        passed &= anchor_ok
        save(results)
    if args.ort_gpu and site is None:
        passed = False
    elif args.ort_gpu:  # last: the newest part of the check, in this process
        ort_ok, results["onnxruntime_cuda"] = ort_phase(ort_cases(real_frame(args.data), args.data / EXPTOOL), "cuda",
                                                        args.repeat)
        passed &= ort_ok
        save(results)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
