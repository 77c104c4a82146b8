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
from .systems import session_options
from .timing import alternating_medians

FRAMES = {"centerpoint": CENTERPOINT_FILE, "bevfusion": BEVFUSION_FILE}
SYSTEMS = ("gpu target, library", "portable, plain onnxruntime", "portable static (max_active per level)")
OPENVINO = "portable, OpenVINO (f32)"
LEVELS = (80_000, 70_000, 30_000, 11_000, 9_000)  # both real frames' sites per level, with a margin
THREADS = 2


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


def session(system: str, threads: int = THREADS):
    """The backbone lowered for `system`, in its session."""
    model = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    if system == SYSTEMS[0]:
        return create_session(lower(model, target="gpu"), sess_options=session_options(threads))
    lowered = lower(model, target="portable", max_active=LEVELS if system == SYSTEMS[2] else None)
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


def measure(repeat: int, threads: int = THREADS, log=print) -> dict:
    """{"threads", "frames": {frame: {"voxels", "difference", "systems": {system: {"median_ms",
    "peak_mb"}}}}}; `difference`: the portable outputs' largest distance from the gpu target's, relative
    to its largest magnitude."""
    sessions = {system: session(system, threads) for system in systems()}
    result = {"threads": threads, "frames": {}}
    for frame, file in FRAMES.items():
        feeds = real_feeds(file)
        outputs = [s.run(None, feeds)[0] for s in sessions.values()]
        medians = alternating_medians(sessions, feeds, repeat)
        result["frames"][frame] = {
            "voxels": len(feeds["coords"]),
            "difference": max(float(np.abs(out - outputs[0]).max() / np.abs(outputs[0]).max()) for out in outputs[1:]),
            "systems": {system: {"median_ms": medians[system], "peak_mb": peak_mb(system, file, threads)}
                        for system in sessions}}
        log(f"{frame} frame: " + ", ".join(f"{system} {ms:,.0f} ms" for system, ms in medians.items()))
    return result


if __name__ == "__main__":  # one system's process (see `peak_mb`)
    system, frame, threads = sys.argv[1:]
    run = session(system, int(threads))
    for _ in range(2):
        run.run(None, real_feeds(frame))
    print(json.dumps({"peak_mb": round(process_peak_mb(), 1)}))
