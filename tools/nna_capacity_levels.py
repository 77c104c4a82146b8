"""One capacity against one per level, for the nna form of the CenterPoint backbone on the real frames
(docs/lowered_forms.md: a capacity per level).

Measures the active sites of every level on both nuScenes frames (`sparse_lower.capacity.level_rows`),
lowers the backbone for the nna target twice, with `max_active` = the largest level (one capacity for
all) and with one per level, and reports the 1x1 products' multiply-adds of each and the time of both in
onnxruntime (2 threads, medians of --repeat runs, side by side in one process) on each frame, checking
that both give the same outputs.

    python tools/nna_capacity_levels.py [--combine gather] [--layout rows] [--repeat 3]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort

import sparse_lower
from sparse_lower.bench.run import alternating_medians
from sparse_lower.capacity import level_rows
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.onnx_conventions import SOURCE_DOMAIN
from sparse_lower.report import render
from sparse_lower.schemas import CONV_OPS, conv_geometry, coords_levels

FRAMES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")


def product_macs(model, capacities) -> int:
    """The nna form's per-tap products: K · (input rows) · Cin · Cout per conv, at the capacities."""
    levels = coords_levels(model.graph)
    weights = {t.name: t.dims for t in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.domain == SOURCE_DOMAIN and node.op_type in CONV_OPS:
            rows = capacities[min(levels.get(node.input[1], 0), len(capacities) - 1)]
            dims = weights[node.input[2]]
            total += conv_geometry(node).volume * rows * dims[0] * dims[1]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--combine", default="gather")
    parser.add_argument("--layout", default="rows")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    frames = [real_feeds(name) for name in FRAMES]
    levels = level_rows(model, frames)
    print(f"active sites per level, most over both frames: {levels}")
    forms = {"one capacity": [max(levels)], "one per level": levels}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sessions = {title: sparse_lower.create_session(sparse_lower.lower(model, target="nna", max_active=capacities,
                                                                      combine=args.combine, layout=args.layout),
                                                   sess_options=options)
                for title, capacities in forms.items()}
    rows = []
    for name, feeds in zip(FRAMES, frames):
        outputs = {title: session.run(None, feeds)[0] for title, session in sessions.items()}
        assert np.array_equal(*outputs.values()), "the two forms disagree"
        times = alternating_medians(sessions, feeds, args.repeat)
        for title, capacities in forms.items():
            rows.append([name, title, ",".join(map(str, capacities)), f"{product_macs(model, capacities) / 1e9:.1f}",
                         f"{times[title]:,.0f}"])
    print(render(["frame", "max_active", "capacities", "product GMACs", f"onnxruntime ms (2 threads, {args.combine}, "
                  f"{args.layout})"], rows))


if __name__ == "__main__":
    main()
