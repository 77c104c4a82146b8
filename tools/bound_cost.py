"""What a loose bound costs the gpu target: the sparse UNet written on the nuScenes grid [41, 1440, 1440] and
on the export's default bound for a grid it does not fix, 2^16 per axis (exporter.traced_calls.default_bound),
each lowered for the gpu target, run on a real frame on 2 threads, the two sessions taking turns; their
medians printed with the ratio, and their outputs compared bit for bit. The bound changes the choices the
library makes by the grid's size (the strided maps' output bits, custom_ops/index/site_bits.h, fit small
grids only), and the outputs only where a frame reaches the tight grid's far edge: a strided layer's sites
past it exist on the loose grid alone (an export whose grid comes from the frame drops them in the graph,
docs/source_ops.md#grids-computed-from-the-frame). The CenterPoint frame gives equal outputs.

    python tools/bound_cost.py [--frame centerpoint|bevfusion] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import sparse_lower
from sparse_lower.measuring.timing import session_options
from sparse_lower.frames.sample import real_feeds
from sparse_lower.exporter.traced_calls import default_bound
from sparse_lower.models import CanonicalEmitter, sparse_unet
from sparse_lower.bench.portable import FRAMES

GRID = (41, 1440, 1440)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frame", choices=list(FRAMES), default="centerpoint")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    feeds = real_feeds(FRAMES[args.frame])
    sessions = {}
    for name, grid in (("grid", GRID), ("bound", tuple(default_bound(3)))):
        model = sparse_unet(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid)
        sessions[f"{name} {list(grid)}"] = sparse_lower.create_session(sparse_lower.lower(model, target="gpu"),
                                                                       sess_options=session_options(2))
    outputs = [session.run(None, feeds) for session in sessions.values()]
    same = all(np.array_equal(a, b) for a, b in zip(*outputs))
    times = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    for name, ms in medians.items():
        print(f"{name:30s} {ms:8.1f} ms")
    grid, bound = medians.values()
    said = "bitwise equal" if same else "different: the frame reaches the grid's far edge, past which a strided layer " \
                                        "has sites on the bound alone"
    print(f"outputs {said}; the bound / the grid: {bound / grid:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
