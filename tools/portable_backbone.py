"""The portable target against the gpu target on CenterPoint's backbone (docs/portable.md: Performance).

Lowers SpMiddleResNetFHD (5 voxel features, deterministic weights) for the gpu target and for the
portable one, dynamic and static (max_active per level), and runs each real nuScenes frame through
all three in one process: the portable models in plain onnxruntime sessions (no library registered,
the static one fed the frame padded to its rows), the gpu model in a session with the library. The sessions take turns, --repeat
runs each, and the medians are reported with their ratio and the largest difference between the
two outputs. Each system's peak memory is measured in a child process of its own, which lowers the
model, creates the session and runs the frame twice (the high-water mark of a process cannot tell
two systems sharing it apart).

    python tools/portable_backbone.py [--repeat 7] [--threads 2] [--write docs/performance/portable.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import onnxruntime as ort

import sparse_lower
from sparse_lower.bench.memory import process_peak_mb
from sparse_lower.bench.run import alternating_medians
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.report import render
from sparse_lower.runtime import pad_rows

FRAMES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")
SYSTEMS = ("gpu target, library", "portable, plain onnxruntime", "portable static (max_active per level)")
LEVELS = (80_000, 70_000, 30_000, 11_000, 9_000)  # both real frames' sites per level, with a margin


class Padded:
    """A session of the static form that takes a frame as it is: padded to the model's rows first."""

    def __init__(self, model, session: ort.InferenceSession):
        self.model, self.session = model, session

    def run(self, names, feeds):
        return self.session.run(names, pad_rows(self.model, feeds))


def session(system: str, model, threads: int):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if system == SYSTEMS[0]:
        return sparse_lower.create_session(sparse_lower.lower(model, target="gpu"), sess_options=options)
    lowered = sparse_lower.lower(model, target="portable", max_active=LEVELS if system == SYSTEMS[2] else None)
    plain = ort.InferenceSession(lowered.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Padded(lowered, plain) if system == SYSTEMS[2] else plain


def peak_child(system: str, frame: str, threads: int) -> float:
    """Peak resident MiB of a process that lowers the backbone for `system` and runs `frame` twice."""
    child = subprocess.run([sys.executable, __file__, "--peak", system, frame, "--threads", str(threads)],
                           capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])["peak_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", help="also write the table as markdown to this file")
    parser.add_argument("--peak", nargs=2, metavar=("SYSTEM", "FRAME"), help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args()
    model = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    if args.peak:
        system, frame = args.peak
        run = session(system, model, args.threads)
        for _ in range(2):
            run.run(None, real_feeds(frame))
        print(json.dumps({"peak_mb": round(process_peak_mb(), 1)}))
        return
    sessions = {system: session(system, model, args.threads) for system in SYSTEMS}
    rows = []
    for frame in FRAMES:
        feeds = real_feeds(frame)
        outputs = [s.run(None, feeds)[0] for s in sessions.values()]
        difference = max(float(np.abs(out - outputs[0]).max() / np.abs(outputs[0]).max()) for out in outputs[1:])
        medians = alternating_medians(sessions, feeds, args.repeat)
        peaks = {system: peak_child(system, frame, args.threads) for system in SYSTEMS}
        gpu = medians[SYSTEMS[0]]
        rows += [[frame.split("_")[1], f"{len(feeds['coords']):,}", system, f"{medians[system]:,.0f} ms",
                  f"{medians[system] / gpu:.2f}×", f"{peaks[system]:,.0f} MiB", f"{difference:.1e}"]
                 for system in SYSTEMS]
    table = render(["frame", "voxels", "system", "median", "/ gpu target", "peak memory",
                    "max rel difference (portable forms against gpu)"], rows)
    print(table)
    if args.write:
        Path(args.write).write_text(
            f"# The portable target on CenterPoint's backbone\n\n`python tools/portable_backbone.py --repeat "
            f"{args.repeat} --threads {args.threads}`, {date.today().isoformat()}, this machine (2 cores): the "
            f"medians of {args.repeat} runs each, the two systems taking turns in one process; peak memory "
            f"(resident high-water mark) of a process that lowers the model, creates the session and runs the "
            f"frame twice.\n\n```\n{table}\n```\n")


if __name__ == "__main__":
    main()
