"""The CenterPoint backbone's time against the thread count, ours beside spconv's, in one run.

    python tools/thread_scaling.py [--threads 1,2,4,8,16] [--repeat 5] [--data DIR] [--json PATH]

Ours is the gpu target's model (SpMiddleResNetFHD, 5 features, deterministic weights) in onnxruntime
with that many intra-op threads; spconv 2.3.8 is the same network with that many torch threads; the
fp32 GEMM peak (onnxruntime's MatMul 2048³, best of 3) on as many threads is beside them. Both real
frames, medians of --repeat runs after a warm-up. spconv's CPU kernels return wrong sums with more than
one thread, so each spconv row also gives its output's distance from ours (relative to the largest
value): its time on many threads is the time of a wrong answer.

The machines here have 2 cores; a lent GPU machine has 16. It has no network, so onnx-graphsurgeon,
spconv and the packages spconv needs that it lacks travel as wheels, and the library is built there:

    mkdir -p .gpu/whl && pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d .gpu/whl onnx-graphsurgeon==0.6.1 spconv==2.3.8 cumm==0.7.11 \\
        pccm==0.4.16 ccimport==0.4.4 fire==0.7.1 termcolor==3.3.0 lark==1.3.1

and there (with .gpu carried, its onnxruntime headers and frames as tools/gpu_check.py's docstring says):

    pip install -q --no-deps --target /tmp/site .gpu/whl/*.whl && export PYTHONPATH=/tmp/site
    cmake -S . -B build/cpu -G Ninja -DSPARSE_LOWER_CUDA=OFF -DORT_INCLUDE_DIR=$PWD/.gpu/ort
    cmake --build build/cpu --target sparse_lower_ops
    SPARSE_LOWER_LIBRARY=build/cpu/libsparse_lower_ops.so python3 tools/thread_scaling.py --data .gpu/data
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparse_lower.api import lower  # noqa: E402
from sparse_lower.bench.run import median_ms  # noqa: E402
from sparse_lower.bench.systems import gemm_peak_gflops, session_options  # noqa: E402
from sparse_lower.frames.sample import load_voxels  # noqa: E402
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd  # noqa: E402
from sparse_lower.report import render  # noqa: E402
from sparse_lower.runtime import create_session  # noqa: E402
from sparse_lower.verify import relative_error  # noqa: E402

FRAMES = {"centerpoint": "nuscenes_centerpoint_voxels.npz", "bevfusion": "nuscenes_bevfusion_voxels.npz"}


def spconv_runner(features: np.ndarray, coords: np.ndarray, grid: tuple):
    """(run(threads) -> the dense output): spconv's network of the same weights, on `threads` torch threads."""
    import torch

    from sparse_lower.importers.spconv_tracer import spconv_inference
    from sparse_lower.models.spconv_emitter import SpconvEmitter

    network = sp_middle_resnet_fhd(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid)

    def run(threads: int) -> np.ndarray:
        with spconv_inference(network.module):  # eval mode, no gradients; it pins 1 thread, undone here
            torch.set_num_threads(threads)
            (output,) = network.module(network.sparse_tensor(features, coords))
        return output.numpy()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = os.cpu_count() or 1
    parser.add_argument("--threads", default=",".join(str(n) for n in (1, 2, 4, 8, 16) if n <= cores),
                        help="comma-separated thread counts (default: powers of two up to the cores)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--json", type=Path, default=Path(os.environ["OUT"], "thread_scaling.json")
                        if os.environ.get("OUT") else None, help="where to write the numbers (default: $OUT/…)")
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    result = {"machine": f"{platform.processor() or platform.machine()}, {cores} cores", "repeat": args.repeat,
              "gemm_peak_gflops": {n: gemm_peak_gflops(2048, 3, threads=n) for n in counts}, "frames": {}}
    for frame, file in FRAMES.items():
        features, coords, grid = load_voxels(args.data / file)
        feeds = {"features": features, "coords": coords}
        model = lower(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid),
                      target="gpu")
        spconv = spconv_runner(features, coords, grid)
        want = None
        rows = result["frames"][frame] = {"voxels": len(coords), "threads": {}}
        for n in counts:
            session = create_session(model, sess_options=session_options(n))
            ours = median_ms(lambda: session.run(None, feeds), args.repeat)
            if want is None:
                (want,) = session.run(None, feeds)
            theirs = median_ms(lambda: spconv(n), args.repeat)
            rows["threads"][n] = {"ours_ms": ours, "spconv_ms": theirs, "spconv_distance": relative_error(spconv(n), want)}
            print(f"{frame} {n} threads: ours {ours:.0f} ms, spconv {theirs:.0f} ms", flush=True)
    print(f"\nThe CenterPoint backbone by thread count ({result['machine']}; medians of {args.repeat} runs)")
    for frame, rows in result["frames"].items():
        one = rows["threads"][counts[0]]
        table = [[str(n), f"{r['ours_ms']:.0f}", f"{one['ours_ms'] / r['ours_ms']:.2f}", f"{r['spconv_ms']:.0f}",
                  f"{one['spconv_ms'] / r['spconv_ms']:.2f}", f"{r['spconv_distance']:.1e}",
                  f"{result['gemm_peak_gflops'][n]:.0f}"] for n, r in rows["threads"].items()]
        print(f"\n{frame} frame, {rows['voxels']:,} voxels")
        print(render(["threads", "ours ms", "ours speed-up", "spconv ms", "spconv speed-up",
                      "spconv vs ours", "GEMM peak GFLOP/s"], table))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
