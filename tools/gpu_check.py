"""Checks and times the gpu target's CUDA kernels on a GPU machine, in one command.

    python tools/gpu_check.py [--ort-include DIR] [--data DIR] [--repeat 20]

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

Prints a table (and writes it with the numbers to $OUT/gpu_check.json when $OUT is set); exits 1 when a
check fails. libspconv's CenterPoint backbone takes 9.8 ms on an A30 (fp16), the figure to beat.

A machine without network (the GPU machines lent to this project) needs the headers, the frames and
onnx-graphsurgeon (which its Python lacks) brought along; from the checkout root, on this side:

    mkdir -p .gpu/data .gpu/whl && cp -r ~/.cache/sparse_lower/onnxruntime-1.21-headers .gpu/ort
    cp ../shared/data/nuscenes_*_voxels.npz .gpu/data/
    pip download --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/whl onnx-graphsurgeon==0.6.1

and there (with .gpu carried):

    pip install -q --no-deps --target /tmp/site .gpu/whl/*.whl && PYTHONPATH=/tmp/site \
        python3 tools/gpu_check.py --ort-include .gpu/ort --data .gpu/data
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from portable_torch import TorchGraph  # a script beside this one

ROOT = Path(__file__).resolve().parents[1]
LIBSPCONV_A30_MS = 9.8


def build(ort_include: str | None, architecture: str) -> Path:
    """The build folder holding libsparse_lower_ops.so and libsparse_lower_cuda.so."""
    folder = ROOT / "build" / "gpu_check"
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
    PyTorch (tools/portable_torch.py's TorchGraph) on `device`, with `half` convs in float16."""

    def __init__(self, model, kernels, device: str, half: bool):
        import torch

        self.torch, self.kernels, self.device, self.half = torch, kernels, device, half
        ops = {"SubmanifoldMap": self._submanifold_map, "StridedMap": self._reached_map,
               "TransposedMap": self._reached_map, "TargetMap": self._target_map, "SiteIndex": self._site_index,
               "IndexedFold": self._fold, "IndexedUnfold": self._unfold, "IndexedConv": self._conv,
               "ActiveSites": self._active_sites, "Rulebook": self._on_cpu, "IndexedConvInt8": self._on_cpu}
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

    def _active_sites(self, node, inputs, attrs):
        return self._out(*self.kernels.active_sites(self._in(inputs[0])))

    def _unfold(self, node, inputs, attrs):
        return self._out(self.kernels.unfold(self._in(inputs[0]), self._in(inputs[1])))

    def _fold(self, node, inputs, attrs):
        rows, idx = self._in(inputs[0]), self._in(inputs[1])
        if attrs.get("mode", b"rows") == b"dense":
            return self._out(self.kernels.fold(rows, idx, spatial_shape=attrs["spatial_shape"],
                                               batch_size=attrs["batch_size"]))
        init = inputs[3] if len(inputs) > 3 else None
        return self._out(self.kernels.fold(rows, idx, like_rows=inputs[2].shape[0], init=self._in(init)))

    def _conv(self, node, inputs, attrs):
        x, idx, w = inputs[:3]
        bias = inputs[3] if len(inputs) > 3 else None
        coords = inputs[4] if len(inputs) > 4 else None
        residual = inputs[5] if len(inputs) > 5 else None
        if coords is not None and coords.shape[0] != x.shape[0]:
            raise ValueError(f"X has {x.shape[0]} rows but coords has {coords.shape[0]}")
        activation = attrs.get("activation", b"none").decode()
        return self._out(self.kernels.indexed_conv(self._in(x), self._in(idx), self._in(w), self._in(bias),
                                                   self._in(residual), activation, self.half))

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
        (output,) = self.graph.run(feeds, on_node)
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
    for precision, half, tolerance in (("float32", False, 1e-4), ("float16", True, 1e-2)):
        gpu = KernelModel(model, kernels, "cuda", half)
        got = gpu.run(on_gpu).cpu().numpy()
        error = relative_error(got, want)
        ms, per_node = gpu.timed(on_gpu, repeat)
        busy_ms, kernel_ms = gpu.busy(on_gpu)
        ok = error <= tolerance
        passed &= ok
        results[precision] = {"median_ms": ms, "relative_error_vs_cpu": error, "tolerance": tolerance, "ok": ok,
                              "gpu_busy_ms": busy_ms, "gpu_ms_by_kernel": kernel_ms}
        for name, value in per_node.items():
            nodes.setdefault(name, {})[precision] = value
    rows = [[name, f"{times['float32']:.3f}", f"{times['float16']:.3f}"] for name, times in nodes.items()]
    rows.append(["whole backbone (median of runs)", f"{results['float32']['median_ms']:.2f}",
                 f"{results['float16']['median_ms']:.2f}"])
    print(f"CenterPoint backbone, {len(coords):,} voxels, {torch.cuda.get_device_name()}: ms per node (CUDA events, "
          f"medians of {repeat} runs)")
    print(render(["node", "float32 ms", "float16 ms"], rows))
    for precision in ("float32", "float16"):
        r = results[precision]
        print(f"{precision}: {r['median_ms']:.2f} ms a frame ({LIBSPCONV_A30_MS / r['median_ms']:.2f}× libspconv's "
              f"{LIBSPCONV_A30_MS} ms on an A30), {r['relative_error_vs_cpu']:.1e} from the CPU library "
              f"({'ok' if r['ok'] else 'FAILED'}: ≤ {r['tolerance']:.0e})")
    for precision in ("float32", "float16"):
        r = results[precision]
        print(f"{precision}: the GPU busy {r['gpu_busy_ms']:.2f} ms a run (PyTorch's profiler, 5 runs); largest:")
        print(render(["kernel or copy", "ms a run"], [[name[:90], f"{ms:.3f}"] for name, ms in r["gpu_ms_by_kernel"][:8]]))
    print(f"the CPU library on this machine's {options.intra_op_num_threads} cores: {cpu_ms:.0f} ms")
    results["per_node_ms"] = nodes
    return passed, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ort-include", default=os.environ.get("ORT_INCLUDE_DIR"),
                        help="onnxruntime's C/C++ API headers (default: $ORT_INCLUDE_DIR, else the build finds them)")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("SPARSE_LOWER_DATA", ROOT.parent / "shared" / "data")),
                        help="the folder of the real frames (nuscenes_*_voxels.npz)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--arch", default="native", help="CMAKE_CUDA_ARCHITECTURES (default: this machine's GPU)")
    parser.add_argument("--build-only", action="store_true", help="build the libraries and stop (no GPU needed)")
    args = parser.parse_args()
    folder = build(args.ort_include, args.arch)
    if args.build_only:
        return
    os.environ["SPARSE_LOWER_LIBRARY"] = str(folder / "libsparse_lower_ops.so")
    os.environ["SPARSE_LOWER_CUDA_LIBRARY"] = str(folder / "libsparse_lower_cuda.so")
    sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
    kernels_ok = kernel_tests(args.data)
    backbone_ok, results = backbone(args.data, args.repeat)
    results["kernel_tests_ok"] = kernels_ok
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(results, indent=1))
    sys.exit(0 if kernels_ok and backbone_ok else 1)


if __name__ == "__main__":
    main()
