"""int8 on the gpu target, measured (docs/performance.md: int8 on the gpu target): the CenterPoint backbone
(or the sparse UNet) lowered for the gpu target, quantized by `sparse_lower.quantize` calibrated on both
nuScenes frames, against its float form on each frame: max error relative to the output's largest magnitude,
SNR, and the time of both in onnxruntime (medians of --repeat runs, the two models alternating, in one
process), with the time per op type of each from onnxruntime's profile.

    python tools/int8_gpu.py [--model "CenterPoint backbone"|"sparse UNet"] [--threads 2] [--repeat 9]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort

import sparse_lower
from sparse_lower.bench.profile import profile
from sparse_lower.bench.run import alternating_medians
from sparse_lower.bench.systems import session_options
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd, sparse_unet
from sparse_lower.report import render
from sparse_lower.runtime import vector_units
from sparse_lower.verify import relative_error, snr_db

FRAMES = ("nuscenes_bevfusion_voxels.npz", "nuscenes_centerpoint_voxels.npz")
MODELS = {"CenterPoint backbone": sp_middle_resnet_fhd, "sparse UNet": sparse_unet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="CenterPoint backbone", choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    frames = [real_feeds(name) for name in FRAMES]
    lowered = sparse_lower.lower(MODELS[args.model](CanonicalEmitter(), np.random.default_rng(0)))
    quantized, found = sparse_lower.quantize(lowered, frames)
    print(f"{args.model}: {len(found.tops)} of {len(found.tops) + len(found.float_convs)} convs in 8 bits; "
          + "; ".join(f"{name} float: {why}" for name, why in found.float_convs.items()))
    models = {"float": lowered, "int8": quantized}
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    sessions = {title: sparse_lower.create_session(model, sess_options=options) for title, model in models.items()}
    rows = []
    for name, feeds in zip(FRAMES, frames):
        want, got = (session.run(None, feeds)[0] for session in sessions.values())
        fp32, int8 = alternating_medians(sessions, feeds, args.repeat).values()
        rows.append([name, f"{100 * relative_error(got, want):.2f} %", f"{snr_db(got, want):.1f}", f"{fp32:,.1f}",
                     f"{int8:,.1f}", f"{fp32 / int8:.2f}x"])
    print(render(["frame", "max rel error", "SNR dB", f"float ms ({args.threads} threads)", "int8 ms", "float/int8"],
                 rows))
    print(f"our kernels on {vector_units()}")
    by_op = {title: profile(model, frames[-1], session_options(args.threads), runs=3)["by_op"]
             for title, model in models.items()}
    ops = sorted(set(by_op["float"]) | set(by_op["int8"]), key=lambda op: -max(by_op["float"].get(op, 0),
                                                                                by_op["int8"].get(op, 0)))
    print(f"kernel ms per op type on {FRAMES[-1]} (onnxruntime's profile, mean of 3 runs):")
    print(render(["op", "float", "int8"], [[op, f"{by_op['float'].get(op, 0):.1f}", f"{by_op['int8'].get(op, 0):.1f}"]
                                          for op in ops]))


if __name__ == "__main__":
    main()
