"""The inverse convs inside the sparse UNet on a real frame, ours against spconv 2.3.8, per layer
(docs/performance.md: inverse convs inside the UNet): spconv's inverse conv reuses the pairs its forward conv
built earlier in the same network, so its time is the layer's own; ours is the layer's nodes in onnxruntime's
profile (its `TargetMap` table included). One thread each (spconv's CPU kernels need it), the two networks'
runs alternating, medians of --repeat runs.

    python tools/unet_inverse_layers.py [--frame nuscenes_centerpoint_voxels.npz] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

import sparse_lower
from sparse_lower.bench.cases import _frame
from sparse_lower.bench.profile import layers_per_run
from sparse_lower.bench.systems import session_options
from sparse_lower.models import CanonicalEmitter, sparse_unet

INVERSE_LAYERS = ("up3", "up2", "up1")


def interleaved_layer_ms(lowered, features, coords, grid, repeat: int) -> tuple[dict, dict]:
    """Median ms of each inverse layer, ours and spconv's, their runs alternating (this machine's speed
    drifts by tens of percent over seconds: runs side by side see the same drift). spconv's modules are
    timed by forward hooks."""
    import torch

    from sparse_lower.models.spconv_emitter import SpconvEmitter

    torch.set_num_threads(1)  # spconv's CPU kernels give wrong sums on more
    net = sparse_unet(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid)
    theirs: dict[str, list[float]] = {name: [] for name in INVERSE_LAYERS}
    starts: dict[str, float] = {}
    for name in INVERSE_LAYERS:
        module = net.module.convs[name]
        module.register_forward_pre_hook(lambda _m, _i, n=name: starts.__setitem__(n, time.perf_counter()))
        module.register_forward_hook(lambda _m, _i, _o, n=name: theirs[n].append(1e3 * (time.perf_counter() - starts[n])))
    feeds = {"features": features, "coords": coords}
    with tempfile.TemporaryDirectory() as scratch:
        options = session_options(1)
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(scratch, "profile")
        session = sparse_lower.create_session(lowered, sess_options=options)
        for _ in range(repeat + 1):  # the first round is a warm-up
            session.run(None, feeds)
            net(features, coords)
        with open(session.end_profiling()) as file:
            ours = layers_per_run(json.load(file))[1:]
    return ({name: statistics.median(run[name] for run in ours) for name in INVERSE_LAYERS},
            {name: statistics.median(values[1:]) for name, values in theirs.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frame", default="nuscenes_centerpoint_voxels.npz")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    features, coords, grid = _frame(args.frame)
    lowered = sparse_lower.lower(sparse_unet(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid))
    ours, theirs = interleaved_layer_ms(lowered, features, coords, grid, args.repeat)
    print(f"sparse UNet on {args.frame}, 1 thread, runs alternating: median ms per inverse conv over {args.repeat} "
          f"runs (ours: onnxruntime's profile, its table included; spconv: forward hooks)")
    for name in INVERSE_LAYERS:
        print(f"  {name}: ours {ours[name]:7.2f}   spconv {theirs[name]:7.2f}   ours/spconv {ours[name] / theirs[name]:.2f}")


if __name__ == "__main__":
    main()
