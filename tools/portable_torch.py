"""The portable target on a GPU without an ONNX runtime for it: the model's standard ops run by PyTorch.

A portable model is plain ONNX, so any runtime with these ops runs it. Where a GPU machine has PyTorch
but no GPU build of an ONNX runtime (onnxruntime-gpu and TensorRT are not installed on the machines we
are lent), this script executes the graph node by node with torch operators, on `--device cuda` or
`cpu`. Why not onnx2torch: its `NonZero` returns torch's `[N, rank]` instead of ONNX's `[rank, N]`, and
it has no `ScatterElements`; the portable target uses both. Each op below follows the ONNX operator
spec (integer `Div` truncates, `Mod` follows `fmod`, negative `Gather`/`Scatter` indices count from
the end, `Reshape`'s 0 copies a dimension), and the run is checked against onnxruntime (CPU) and
spconv's expected outputs, so a wrong op shows as a difference, not as a time.

Two steps, so that the GPU machine needs only torch, onnx, numpy and onnxruntime (not this package):

    python tools/portable_torch.py prepare DIR     # here: lower NVIDIA's exptool backbone (the wild file),
                                                   # dynamic and static, and write the frames' feeds
    python tools/portable_torch.py run DIR [--device cuda] [--repeat 20]   # there: time and check

`run` prints, per model and frame: the median wall time of a whole run on the device (synchronised),
onnxruntime's CPU time for the same file beside it, the peak device memory, the time per op type (one
extra run synchronised after every node), and the largest relative difference from spconv's expected
output and from onnxruntime's. It exits 1 when a difference exceeds --tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

WILD = Path("nvidia_exptool") / "centerpoint.scn.onnx"
EXPECTED = Path("nvidia_exptool") / "centerpoint.scn.expected.npz"
FRAMES = {"centerpoint": "nuscenes_centerpoint_voxels.npz", "bevfusion": "nuscenes_bevfusion_voxels.npz"}
LEVELS = (80_000, 70_000, 30_000, 11_000, 9_000)  # both real frames' sites per level, with a margin


# ---------------------------------------------------------------------------------------------- ops
# Each op takes (torch, inputs, attributes) and returns its outputs as a list. `torch` is passed in so
# that `prepare` (which needs no torch) can import this module.

def _ints(tensor) -> list[int]:
    return [int(v) for v in tensor.reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _wrapped(torch, indices, extent: int):
    indices = indices.long()
    return torch.where(indices < 0, indices + extent, indices)


def _gather(torch, inputs, attrs):
    data, indices = inputs
    axis = _axis(attrs.get("axis", 0), data.dim())
    flat = _wrapped(torch, indices, data.shape[axis]).reshape(-1)
    picked = torch.index_select(data, axis, flat)
    return [picked.reshape(*data.shape[:axis], *indices.shape, *data.shape[axis + 1:])]


def _gather_nd(torch, inputs, attrs):
    data, indices = inputs
    if attrs.get("batch_dims", 0):
        raise NotImplementedError("GatherND with batch_dims")
    return [data[tuple(indices.long().unbind(-1))]]


def _scatter_elements(torch, inputs, attrs):
    data, indices, updates = inputs
    axis = _axis(attrs.get("axis", 0), data.dim())
    indices = _wrapped(torch, indices, data.shape[axis])
    reduction = attrs.get("reduction", b"none").decode()
    if reduction == "none":
        return [torch.scatter(data, axis, indices, updates)]
    if reduction == "add":
        return [torch.scatter_add(data, axis, indices, updates)]
    return [torch.scatter_reduce(data, axis, indices, updates, {"max": "amax", "min": "amin", "mul": "prod"}[reduction])]


def _scatter_nd(torch, inputs, attrs):
    data, indices, updates = inputs
    reduction = attrs.get("reduction", b"none").decode()
    if reduction not in ("none", "add"):
        raise NotImplementedError(f"ScatterND with reduction {reduction}")
    return [data.clone().index_put_(tuple(indices.long().unbind(-1)), updates, accumulate=reduction == "add")]


def _reshape(torch, inputs, attrs):
    data, shape = inputs
    shape = _ints(shape)
    if not attrs.get("allowzero", 0):
        shape = [data.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return [data.reshape(shape)]


def _expand(torch, inputs, attrs):
    data, shape = inputs
    return [data.expand(torch.broadcast_shapes(data.shape, tuple(_ints(shape))))]


def _unsqueeze(torch, inputs, attrs):
    data, axes = inputs
    rank = data.dim() + axes.numel()
    for axis in sorted(_axis(a, rank) for a in _ints(axes)):
        data = data.unsqueeze(axis)
    return [data]


def _squeeze(torch, inputs, attrs):
    data = inputs[0]
    if len(inputs) < 2 or inputs[1] is None:
        return [data.squeeze()]
    return [data.squeeze(tuple(_axis(a, data.dim()) for a in _ints(inputs[1])))]


def _slice(torch, inputs, attrs):
    data, starts, ends = inputs[:3]
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
    steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.dim()
    for start, end, axis, step in zip(_ints(starts), _ints(ends), axes, steps):
        if step < 1:
            raise NotImplementedError("Slice with a step below 1")
        index[_axis(axis, data.dim())] = slice(start, end, step)
    return [data[tuple(index)]]


def _reduce(name):
    def run(torch, inputs, attrs):
        data = inputs[0]
        axes = attrs.get("axes")
        if axes is None and len(inputs) > 1 and inputs[1] is not None:
            axes = _ints(inputs[1])
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [data]
            axes = list(range(data.dim()))
        dims = tuple(_axis(a, data.dim()) for a in axes)
        if name == "sum":
            return [torch.sum(data, dim=dims, keepdim=keep, dtype=data.dtype)]
        return [getattr(torch, name)(data, dim=dims, keepdim=keep)]
    return run


def _cumsum(torch, inputs, attrs):
    data, axis = inputs
    axis = _axis(_ints(axis)[0], data.dim())
    if attrs.get("reverse", 0):
        data = data.flip(axis)
    total = torch.cumsum(data, axis, dtype=data.dtype)
    if attrs.get("exclusive", 0):
        total = total - data
    return [total.flip(axis) if attrs.get("reverse", 0) else total]


def _div(torch, inputs, attrs):
    a, b = inputs
    if a.dtype.is_floating_point:
        return [a / b]
    return [torch.div(a, b, rounding_mode="trunc")]


def _mod(torch, inputs, attrs):
    return [torch.fmod(*inputs) if attrs.get("fmod", 0) else torch.remainder(*inputs)]


def _shape(torch, inputs, attrs):
    sizes = list(inputs[0].shape)[attrs.get("start", 0):attrs.get("end", None)]
    return [torch.tensor(sizes, dtype=torch.int64, device=inputs[0].device)]


def _constant_of_shape(torch, inputs, attrs, device):
    value = attrs.get("value")
    fill = torch.from_numpy(numpy_helper.to_array(value).copy()) if value is not None else torch.zeros(1)
    return [torch.full(_ints(inputs[0]), fill.reshape(()).item(), dtype=fill.dtype, device=device)]


def _range(torch, inputs, attrs):
    start, limit, delta = inputs
    return [torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype, device=start.device)]


def _flatten(torch, inputs, attrs):
    data = inputs[0]
    axis = _axis(attrs.get("axis", 1), data.dim())
    outer = int(np.prod(data.shape[:axis], dtype=np.int64))
    return [data.reshape(outer, -1) if data.numel() else data.reshape(outer, int(np.prod(data.shape[axis:])))]


def _concat(torch, inputs, attrs):
    return [torch.cat(inputs, dim=attrs["axis"])]


def _cast(torch, inputs, attrs):
    return [inputs[0].to(TORCH_TYPES[attrs["to"]])]


def _transpose(torch, inputs, attrs):
    perm = attrs.get("perm") or list(reversed(range(inputs[0].dim())))
    return [inputs[0].permute(*perm)]


def _variadic(fold):
    def run(torch, inputs, attrs):
        out = inputs[0]
        for other in inputs[1:]:
            out = fold(torch, out, other)
        return [out]
    return run


def _unary(name):
    return lambda torch, inputs, attrs: [getattr(torch, name)(inputs[0])]


def _binary(name):
    return lambda torch, inputs, attrs: [getattr(torch, name)(*inputs)]


OPS = {
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"), "Div": _div, "Mod": _mod,
    "MatMul": _binary("matmul"), "Relu": _unary("relu"), "Sigmoid": _unary("sigmoid"), "Neg": _unary("neg"),
    "Abs": _unary("abs"), "Not": _unary("logical_not"), "IsNaN": _unary("isnan"),
    "LeakyRelu": lambda torch, inputs, attrs: [torch.nn.functional.leaky_relu(inputs[0], attrs.get("alpha", 0.01))],
    "And": _binary("logical_and"), "Or": _binary("logical_or"), "Xor": _binary("logical_xor"),
    "Equal": _binary("eq"), "Less": _binary("lt"), "LessOrEqual": _binary("le"), "Greater": _binary("gt"),
    "GreaterOrEqual": _binary("ge"), "Where": lambda torch, inputs, attrs: [torch.where(*inputs)],
    "Max": _variadic(lambda torch, a, b: torch.maximum(a, b)), "Min": _variadic(lambda torch, a, b: torch.minimum(a, b)),
    "Sum": _variadic(lambda torch, a, b: a + b),
    "Gather": _gather, "GatherND": _gather_nd, "ScatterElements": _scatter_elements, "ScatterND": _scatter_nd,
    "Reshape": _reshape, "Expand": _expand, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Slice": _slice,
    "Flatten": _flatten, "Concat": _concat, "Cast": _cast, "Transpose": _transpose, "Shape": _shape,
    "Identity": lambda torch, inputs, attrs: [inputs[0]], "Range": _range, "CumSum": _cumsum,
    "NonZero": lambda torch, inputs, attrs: [torch.nonzero(inputs[0]).T.contiguous()],
    "ReduceSum": _reduce("sum"), "ReduceMax": _reduce("amax"), "ReduceMin": _reduce("amin"),
}
TORCH_TYPES: dict = {}  # onnx.TensorProto element type -> torch dtype, filled by TorchGraph


class TorchGraph:
    """An ONNX graph run node by node by torch on one device.

    Every node's op must be in OPS or in `custom` (op type -> f(node, inputs, attrs) -> outputs, for ops
    of another domain: tools/gpu_check.py runs the gpu target's custom ops through the CUDA library so),
    else the constructor names the node and its op; initializers and `Constant` nodes are moved to the
    device once."""

    def __init__(self, model: onnx.ModelProto, device: str, custom: dict | None = None):
        import torch

        self.custom = custom or {}
        self.torch, self.device = torch, torch.device(device)
        TORCH_TYPES.update({onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.FLOAT16: torch.float16,
                            onnx.TensorProto.DOUBLE: torch.float64, onnx.TensorProto.INT64: torch.int64,
                            onnx.TensorProto.INT32: torch.int32, onnx.TensorProto.INT8: torch.int8,
                            onnx.TensorProto.UINT8: torch.uint8, onnx.TensorProto.BOOL: torch.bool})
        graph = model.graph
        self.constants = {init.name: self._tensor(numpy_helper.to_array(init)) for init in graph.initializer}
        self.nodes = []
        for node in graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "Constant":
                self.constants[node.output[0]] = self._tensor(numpy_helper.to_array(attrs["value"]))
                continue
            standard = node.domain in ("", "ai.onnx") and (node.op_type in OPS or node.op_type == "ConstantOfShape")
            if not standard and node.op_type not in self.custom:
                raise SystemExit(f"node '{node.name}': op {node.domain or 'ai.onnx'}::{node.op_type} is not "
                                 f"in {Path(__file__).name}'s OPS (fix: add it there, following the ONNX spec)")
            self.nodes.append((node, attrs))
        self.inputs = [i.name for i in graph.input if i.name not in self.constants]
        self.outputs = [o.name for o in graph.output]

    def _tensor(self, array: np.ndarray):
        return self.torch.from_numpy(np.array(array, copy=True)).to(self.device)  # copy: keeps 0-d, writable

    def _node(self, node, attrs, values):
        inputs = [values[name] if name else None for name in node.input]
        if node.op_type in self.custom:
            return self.custom[node.op_type](node, inputs, attrs)
        if node.op_type == "ConstantOfShape":
            return _constant_of_shape(self.torch, inputs, attrs, self.device)
        return OPS[node.op_type](self.torch, inputs, attrs)

    def run(self, feeds: dict, on_node=None) -> list:
        """The graph's outputs for `feeds` (device tensors). `on_node(node, compute)`, when given, runs
        each node's `compute()` and returns its outputs: a hook to time the nodes."""
        values = dict(self.constants)
        values.update(feeds)
        for node, attrs in self.nodes:
            def compute(node=node, attrs=attrs):
                return self._node(node, attrs, values)
            try:
                outputs = on_node(node, compute) if on_node else compute()
            except Exception as error:  # name the node: a failure here is an op this script gets wrong
                raise RuntimeError(f"node '{node.name}' ({node.op_type}): {error}") from error
            values.update(zip(node.output, outputs))
        return [values[name] for name in self.outputs]

    def timed_by_op(self, feeds: dict) -> dict:
        """One run synchronised after every node: the wall time per op type, in seconds."""
        per_op = defaultdict(float)

        def on_node(node, compute):
            start = time.perf_counter()
            outputs = compute()
            self.synchronize()
            per_op[node.op_type] += time.perf_counter() - start
            return outputs
        self.run(feeds, on_node)
        return per_op

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------- prepare

def prepare(out: Path, data: Path) -> None:
    """Lower the wild NVIDIA backbone for the portable target (dynamic, and static with per-level
    capacities) and write the models, each frame's feeds (padded for the static form) and spconv's
    expected outputs to `out`."""
    import sparse_lower
    from sparse_lower.frames.sample import load_voxels
    from sparse_lower.runtime import pad_rows

    out.mkdir(parents=True, exist_ok=True)
    imported = sparse_lower.import_model(str(data / "wild" / WILD))
    models = {"dynamic": sparse_lower.lower(imported, target="portable"),
              "static": sparse_lower.lower(imported, target="portable", max_active=list(LEVELS))}
    for form, model in models.items():
        onnx.save(model, str(out / f"portable_{form}.onnx"))
        for frame, file in FRAMES.items():
            features, coords, _ = load_voxels(data / file)
            feeds = {"0": features, "coords": coords}
            np.savez(out / f"feeds_{form}_{frame}.npz", **(pad_rows(model, feeds) if form == "static" else feeds))
    expected = np.load(data / "wild" / EXPECTED)
    np.savez_compressed(out / "expected.npz", **{frame: expected[frame] for frame in FRAMES})
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")


# -------------------------------------------------------------------------------------------- run

def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def run(folder: Path, device: str, repeat: int, tolerance: float, threads: int) -> int:
    import onnxruntime as ort
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as the CPU computes it
    expected = np.load(folder / "expected.npz")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__} on {device} ({name}); onnxruntime {ort.__version__} CPU, {threads} threads")
    worst = 0.0
    rows = []
    for form in ("dynamic", "static"):
        path = folder / f"portable_{form}.onnx"
        model = onnx.load(str(path))
        graph = TorchGraph(model, device)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for frame in FRAMES:
            feeds = dict(np.load(folder / f"feeds_{form}_{frame}.npz"))
            on_device = {k: graph._tensor(v) for k, v in feeds.items()}
            for _ in range(2):  # warm-up: allocator, kernels, cuBLAS handles
                out = graph.run(on_device)[0]
            graph.synchronize()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                out = graph.run(on_device)[0]
                graph.synchronize()
                times.append(time.perf_counter() - start)
            peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
            per_op = graph.timed_by_op(on_device)
            result = out.float().cpu().numpy()
            ort_times = []
            for _ in range(max(1, repeat // 5)):
                start = time.perf_counter()
                reference = session.run(None, feeds)[0]
                ort_times.append(time.perf_counter() - start)
            d_spconv, d_ort = relative(result, expected[frame]), relative(result, reference)
            worst = max(worst, d_spconv, d_ort)
            top = sorted(per_op.items(), key=lambda kv: -kv[1])[:6]
            rows.append({"form": form, "frame": frame, "voxels": int((feeds["coords"][:, 0] >= 0).sum()),
                         "torch_ms": 1e3 * statistics.median(times), "ort_cpu_ms": 1e3 * statistics.median(ort_times),
                         "peak_device_mib": peak, "rel_diff_spconv": d_spconv, "rel_diff_onnxruntime": d_ort,
                         "per_op_ms": {k: round(1e3 * v, 2) for k, v in top}})
            r = rows[-1]
            print(f"{form:8s} {frame:12s} {r['voxels']:6d} voxels  torch {device} {r['torch_ms']:8.2f} ms   "
                  f"onnxruntime CPU {r['ort_cpu_ms']:8.1f} ms   peak {peak:7.0f} MiB   "
                  f"vs spconv {d_spconv:.1e}   vs onnxruntime {d_ort:.1e}", flush=True)
            print("         time per op type (one synchronised run): "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in r["per_op_ms"].items()), flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "portable_torch.json").write_text(json.dumps(rows, indent=1))
    if worst > tolerance:
        print(f"FAILED: a difference of {worst:.1e} exceeds {tolerance:.0e}")
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="lower the wild NVIDIA backbone and write models, feeds, expected outputs")
    p.add_argument("folder", type=Path)
    p.add_argument("--data", type=Path, default=Path("../shared/data"), help="the folder of the real frames")
    r = sub.add_parser("run", help="run the prepared models by torch, check and time them")
    r.add_argument("folder", type=Path)
    r.add_argument("--device", default="cuda")
    r.add_argument("--repeat", type=int, default=20)
    r.add_argument("--tolerance", type=float, default=1e-4)
    r.add_argument("--threads", type=int, default=os.cpu_count(), help="onnxruntime's CPU threads")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.folder, args.data)
    else:
        sys.exit(run(args.folder, args.device, args.repeat, args.tolerance, args.threads))


if __name__ == "__main__":
    main()
