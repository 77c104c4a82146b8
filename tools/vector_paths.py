"""The CenterPoint backbone's float and int8 gpu forms on each vector path of this CPU, side by side.

    python tools/vector_paths.py [--threads 2] [--rounds 5] [--repeat 3] [--portable]

The library reads SPARSE_LOWER_NO_AVX512 and SPARSE_LOWER_PORTABLE_KERNELS once per process, so each
path runs in a process of its own: the widest units (sparse_lower.runtime.vector_units()), AVX2 alone,
and with --portable the portable loops. The processes alternate for --rounds rounds, so that a shared
machine's drift falls on every path alike, and each reports --repeat runs after a warm-up on the real
CenterPoint frame; the table gives the median of all of a path's runs. The int8 form is calibrated on
both real frames (sparse_lower.quantize). Whether each path's outputs are the same bits as the widest
path's is checked too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import sparse_lower
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.report import render

FRAMES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")  # timed on the first
PATHS = {"widest": {}, "avx2": {"SPARSE_LOWER_NO_AVX512": "1"}, "portable": {"SPARSE_LOWER_PORTABLE_KERNELS": "1"}}


def frames() -> list[dict]:
    return [real_feeds(name) for name in FRAMES]


def child(folder: Path, threads: int, repeat: int) -> None:
    """One path's runs: {"units", "float": [ms…], "int8": [ms…], "digests"} as JSON on stdout."""
    import onnxruntime as ort

    from sparse_lower.runtime import vector_units

    feeds = frames()[0]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    result = {"units": vector_units(), "digests": {}}
    for form in ("float", "int8"):
        session = sparse_lower.create_session(str(folder / f"{form}.onnx"), sess_options=options)
        (output,) = session.run(None, feeds)
        result["digests"][form] = hashlib.sha256(output.tobytes()).hexdigest()
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            session.run(None, feeds)
            times.append(1e3 * (time.perf_counter() - started))
        result[form] = times
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--portable", action="store_true", help="also the portable loops (slow)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads, args.repeat)
        return
    paths = {name: env for name, env in PATHS.items() if name != "portable" or args.portable}
    with tempfile.TemporaryDirectory() as folder:
        lowered = sparse_lower.lower(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0)), target="gpu")
        quantized, _ = sparse_lower.quantize(lowered, frames())
        onnx.save(lowered, Path(folder) / "float.onnx")
        onnx.save(quantized, Path(folder) / "int8.onnx")
        runs = {name: {"float": [], "int8": []} for name in paths}
        for _ in range(args.rounds):
            for name, env in paths.items():
                done = subprocess.run([sys.executable, __file__, "--child", folder, "--threads", str(args.threads),
                                       "--repeat", str(args.repeat)], env={**os.environ, **env}, check=True,
                                      capture_output=True, text=True)
                result = json.loads(done.stdout.splitlines()[-1])
                for form in ("float", "int8"):
                    runs[name][form] += result[form]
                runs[name]["units"], runs[name]["digests"] = result["units"], result["digests"]
    widest = runs["widest"]
    rows = []
    for name, r in runs.items():
        same = ", ".join(form for form in ("float", "int8") if r["digests"][form] == widest["digests"][form]) or "none"
        float_ms, int8_ms = statistics.median(r["float"]), statistics.median(r["int8"])
        rows.append([f"{name} ({r['units']})", f"{float_ms:.1f}", f"{int8_ms:.1f}", f"{float_ms / int8_ms:.2f}x", same])
    print(f"CenterPoint backbone, {FRAMES[0]}, {args.threads} threads: medians of {args.rounds} rounds x "
          f"{args.repeat} runs, the paths' processes alternating")
    print(render(["path", "float ms", "int8 ms", "float/int8", "same bits as widest"], rows))


if __name__ == "__main__":
    main()
