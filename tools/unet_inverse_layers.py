"""The inverse convs inside the sparse UNet on a real frame, ours against spconv 2.3.8, per layer
(README: Performance): spconv's inverse conv reuses the pairs its forward conv built earlier in the same
network, so its time is the layer's own; ours is the layer's nodes in onnxruntime's profile (its
`TargetMap` table included). One thread each (spconv's CPU kernels need it), medians of --repeat runs.

    python tools/unet_inverse_layers.py [--frame nuscenes_centerpoint_voxels.npz] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import sparse_lower
from sparse_lower.bench.cases import _frame
from sparse_lower.bench.profile import profile
from sparse_lower.bench.systems import session_options
from sparse_lower.models import CanonicalEmitter, sparse_unet

INVERSE_LAYERS = ("up3", "up2", "up1")


def spconv_layer_ms(features, coords, grid, repeat: int) -> dict[str, float]:
    """Median ms of each inverse conv module of spconv's UNet, timed by forward hooks."""
    import torch

    from sparse_lower.models.spconv_emitter import SpconvEmitter

    torch.set_num_threads(1)  # spconv's CPU kernels give wrong sums on more
    net = sparse_unet(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid)
    samples: dict[str, list[float]] = {name: [] for name in INVERSE_LAYERS}
    starts: dict[str, float] = {}
    for name in INVERSE_LAYERS:
        module = net.module.convs[name]
        module.register_forward_pre_hook(lambda _m, _i, n=name: starts.__setitem__(n, time.perf_counter()))
        module.register_forward_hook(lambda _m, _i, _o, n=name: samples[n].append(time.perf_counter() - starts[n]))
    net(features, coords)  # warm-up
    for values in samples.values():
        values.clear()
    for _ in range(repeat):
        net(features, coords)
    return {name: 1e3 * statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frame", default="nuscenes_centerpoint_voxels.npz")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    features, coords, grid = _frame(args.frame)
    lowered = sparse_lower.lower(sparse_unet(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid))
    ours = profile(lowered, {"features": features, "coords": coords}, session_options(1), runs=args.repeat)["by_layer"]
    theirs = spconv_layer_ms(features, coords, grid, args.repeat)
    print(f"sparse UNet on {args.frame}, 1 thread: ms per inverse conv (ours: mean of {args.repeat} runs in the "
          f"profile, its table included; spconv: median)")
    for name in INVERSE_LAYERS:
        print(f"  {name}: ours {ours[name]:7.2f}   spconv {theirs[name]:7.2f}   ours/spconv {ours[name] / theirs[name]:.2f}")


if __name__ == "__main__":
    main()
