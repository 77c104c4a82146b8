"""`sparse-lower bench --suite portable`: the portable target against the gpu target on CenterPoint's
backbone.

SpMiddleResNetFHD (5 voxel features, deterministic weights) lowered for the gpu target and for the
portable one, dynamic and static (max_active per level), runs each real frame in one process: the
portable models in plain onnxruntime sessions (no library registered; the static one fed the frame
padded to its rows) and the dynamic one in OpenVINO's CPU plugin too (where `openvino` imports), the gpu
model in a session with the library. The sessions take turns, and each
system's median is given with its ratio to the gpu target's and the largest difference between the
outputs. Each system's peak memory is measured in a process of its own, which lowers the model,
creates the session and runs the frame twice (the high-water mark of a process cannot tell two
systems sharing it apart).

Where the dynamic portable model's time goes is measured beside it (`time_split`): onnxruntime's
profile of it on each frame, split into the products (its MatMuls), the unfolds (the Gathers of
feature rows by a neighbour table), the index tables and the rest; with the products' work counted
two ways, every tap (what the unfold multiplies) and the taps that have a neighbour (what the gpu
target multiplies), and the two-thread GEMM peak, the best of its measures before the first frame and
after each. The products alone at that peak bound what the portable form can reach against the gpu
target.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ..api import lower
from ..frames.sample import real_feeds
from ..models import CanonicalEmitter, sp_middle_resnet_fhd
from ..runtime import create_session, pad_rows
from ..toolchains.prepare import fed
from .cases import BEVFUSION_FILE, CENTERPOINT_FILE
from .memory import process_peak_mb
from ..measuring.profile import profile
from .systems import gemm_peak_gflops, index_only, session_options
from ..measuring.timing import alternating_medians

FRAMES = {"centerpoint": CENTERPOINT_FILE, "bevfusion": BEVFUSION_FILE}
SYSTEMS = ("gpu target, library", "portable, plain onnxruntime", "portable static (max_active per level)")
OPENVINO = "portable, OpenVINO (f32)"
LEVELS = (80_000, 70_000, 30_000, 11_000, 9_000)  # both real frames' sites per level, with a margin
THREADS = 2
PRODUCTS = ("MatMul", "Gemm", "FusedGemm", "FusedMatMul")  # onnxruntime fuses a MatMul and its bias into a Gemm


class Padded:
    """A session of the static form that takes a frame as it is: padded to the model's rows first."""

    def __init__(self, model, session: ort.InferenceSession):
        self.model, self.session = model, session

    def run(self, names, feeds):
        return self.session.run(names, pad_rows(self.model, feeds))


class OpenVinoRun:
    """The portable model compiled by OpenVINO's CPU plugin on `threads` threads, in f32 (on a CPU with
    bf16 units it would otherwise compute in bf16), run as a session is."""

    def __init__(self, model: onnx.ModelProto, threads: int):
        import openvino as ov

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "portable.onnx"
            onnx.save(model, path)
            self.compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                      "INFERENCE_NUM_THREADS": threads})
        self.model = model

    def run(self, names, feeds):
        results = self.compiled(fed(self.model, feeds))
        return [results[name] for name in names or [o.name for o in self.model.graph.output]]


def systems() -> tuple[str, ...]:
    """SYSTEMS, and OpenVINO's where it imports (else said why not, and left out)."""
    if importlib.util.find_spec("openvino") is None:
        print("portable suite: no OpenVINO row (pip install openvino, or the openvino extra)", file=sys.stderr)
        return SYSTEMS
    return (*SYSTEMS, OPENVINO)


def backbone(system: str) -> onnx.ModelProto:
    """The backbone lowered for `system`."""
    model = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    if system == SYSTEMS[0]:
        return lower(model, target="gpu")
    return lower(model, target="portable", max_active=LEVELS if system == SYSTEMS[2] else None)


def session(system: str, threads: int = THREADS):
    """The backbone lowered for `system`, in its session."""
    lowered = backbone(system)
    if system == SYSTEMS[0]:
        return create_session(lowered, sess_options=session_options(threads))
    if system == OPENVINO:
        return OpenVinoRun(lowered, threads)
    plain = ort.InferenceSession(lowered.SerializeToString(), session_options(threads),
                                 providers=["CPUExecutionProvider"])
    return Padded(lowered, plain) if system == SYSTEMS[2] else plain


def peak_mb(system: str, frame: str, threads: int = THREADS) -> float:
    """Peak resident MiB of a process that lowers the backbone for `system` and runs `frame` twice."""
    child = subprocess.run([sys.executable, "-m", __name__, system, frame, str(threads)],
                           capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])["peak_mb"]


def unfolds(lowered: onnx.ModelProto, tables: set[str]) -> list[tuple[onnx.NodeProto, int, int]]:
    """(Gather, K·Cin, Cout) of every unfold of a portable model: a Gather of feature rows by an index table
    (one of `tables`, the outputs of bench.systems.index_only's nodes), whose Flatten feeds a MatMul by
    constant `[K·Cin, Cout]` weights."""
    weights = {t.name: tuple(t.dims) for t in lowered.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in lowered.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for node in lowered.graph.node:
        if node.op_type != "Gather" or node.input[0] in tables or node.input[1] not in tables:
            continue
        matmuls = [m for flat in readers.get(node.output[0], []) if flat.op_type == "Flatten"
                   for m in readers.get(flat.output[0], []) if m.op_type == "MatMul" and m.input[1] in weights]
        if matmuls:
            rows, cout = weights[matmuls[0].input[1]]
            found.append((node, rows, cout))
    return found


def time_split(lowered: onnx.ModelProto, feeds: dict, threads: int = THREADS, runs: int = 3) -> dict:
    """Where a portable model's kernel time goes on `feeds` (onnxruntime's profile, the mean of `runs`):
    {"total_ms", "products_ms", "unfold_ms", "tables_ms", "rest_ms", "dense_gflop", "pairs_gflop"}. The
    products are the MatMul kernels (and the Gemms onnxruntime fuses them into); the unfolds the Gathers of
    `unfolds`; the tables the nodes that do not read the features. `dense_gflop`: 2·M·K·Cin·Cout over the
    unfolds, every tap multiplied; `pairs_gflop`: 2·pairs·Cin·Cout, the taps with a neighbour (entry > 0)."""
    found = profile(lowered, feeds, session_options(threads), runs=runs)
    tables = index_only(lowered).graph.node
    gathers = unfolds(lowered, {o for node in tables for o in node.output})
    table_nodes = {node.name for node in tables}
    split = {"total_ms": found["total_ms"],
             "products_ms": sum(found["by_op"].get(op, 0.0) for op in PRODUCTS),
             "unfold_ms": sum(found["by_node"].get(node.name, 0.0) for node, _, _ in gathers),
             "tables_ms": sum(ms for name, ms in found["by_node"].items() if name in table_nodes)}
    split["rest_ms"] = split["total_ms"] - split["products_ms"] - split["unfold_ms"] - split["tables_ms"]
    listed = onnx.ModelProto()
    listed.CopyFrom(lowered)
    names = sorted({node.input[1] for node, _, _ in gathers})
    listed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in names)
    plain = ort.InferenceSession(listed.SerializeToString(), session_options(threads),
                                 providers=["CPUExecutionProvider"])
    nbr = dict(zip(names, plain.run(names, feeds)))
    work = [(nbr[node.input[1]], rows // nbr[node.input[1]].shape[1], cout) for node, rows, cout in gathers]
    split["dense_gflop"] = sum(2 * table.size * cin * cout for table, cin, cout in work) / 1e9
    split["pairs_gflop"] = sum(2 * np.count_nonzero(table) * cin * cout for table, cin, cout in work) / 1e9
    return split


def measure(repeat: int, threads: int = THREADS, log=print) -> dict:
    """{"threads", "peak_gflops", "frames": {frame: {"voxels", "difference", "systems": {system: {"median_ms",
    "peak_mb"}}, "split": time_split}}}; `difference`: the portable outputs' largest distance from the gpu
    target's, relative to its largest magnitude; `peak_gflops`: the two-thread GEMM peak, the best of its
    measures before the first frame and after each."""
    peaks = [gemm_peak_gflops(2048, 9, threads=threads)]
    sessions = {system: session(system, threads) for system in systems()}
    dynamic = backbone(SYSTEMS[1])
    result = {"threads": threads, "frames": {}}
    for frame, file in FRAMES.items():
        feeds = real_feeds(file)
        outputs = [s.run(None, feeds)[0] for s in sessions.values()]
        medians = alternating_medians(sessions, feeds, repeat)
        result["frames"][frame] = {
            "voxels": len(feeds["coords"]),
            "difference": max(float(np.abs(out - outputs[0]).max() / np.abs(outputs[0]).max()) for out in outputs[1:]),
            "systems": {system: {"median_ms": medians[system], "peak_mb": peak_mb(system, file, threads)}
                        for system in sessions},
            "split": time_split(dynamic, feeds, threads)}
        log(f"{frame} frame: " + ", ".join(f"{system} {ms:,.0f} ms" for system, ms in medians.items()))
        peaks.append(gemm_peak_gflops(2048, 9, threads=threads))
    return {**result, "peak_gflops": max(peaks), "peaks": peaks}


if __name__ == "__main__":  # one system's process (see `peak_mb`)
    system, frame, threads = sys.argv[1:]
    run = session(system, int(threads))
    for _ in range(2):
        run.run(None, real_feeds(frame))
    print(json.dumps({"peak_mb": round(process_peak_mb(), 1)}))
