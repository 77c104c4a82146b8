"""Time per layer of the lowered CenterPoint head stack on a real nuScenes frame.

    python tools/bench_layers.py [--data ../shared/data/nuscenes_centerpoint_voxels.npz] [--repeat 20]

Each layer of `centerpoint_head_stack` (SubM 5→16, SubM 16→16, SparseConv 16→32 s2) is lowered as a
model of its own and fed the real output of the layer before it. For each it reports the median of
`--repeat` runs after a warm-up of the whole layer (index table included, as in real inference) and
of its index table alone, for 1 and 2 intra-op threads, side by side in one run.
"""

from __future__ import annotations

import argparse

import numpy as np

import sparse_lower
from sparse_lower.bench.run import median_ms
from sparse_lower.bench.systems import index_only, session_options
from sparse_lower.frames.sample import find_data, load_voxels, synthetic_voxels
from sparse_lower.models import SparseModelBuilder

LAYERS = [("SubM 3x3x3 5->16", "SubmanifoldConv", 5, 16, {}),
          ("SubM 3x3x3 16->16", "SubmanifoldConv", 16, 16, {}),
          ("SparseConv 3x3x3 s2 16->32", "SparseConv", 16, 32, {"strides": [2, 2, 2], "pads": [1] * 6})]


def layer_model(op_type, cin, cout, grid, attrs, seed):
    builder = SparseModelBuilder(3, cin, np.random.default_rng(seed))
    builder.conv(op_type, cout, (3, 3, 3), grid, **attrs)
    return builder.build()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    path = args.data or find_data()
    features, coords, grid = load_voxels(path) if path else synthetic_voxels()
    print(f"frame: {path or 'synthetic'}: {len(coords):,} voxels, grid {grid}")
    print(f"{'layer':28s} {'rows in':>8s} {'rows out':>8s} {'threads':>7s} {'layer ms':>9s} {'table ms':>9s}")
    for index, (label, op_type, cin, cout, attrs) in enumerate(LAYERS):
        model = layer_model(op_type, cin, cout, grid, attrs, index)
        lowered = sparse_lower.lower(model)
        feeds = {"features": features, "coords": coords}
        for threads in (1, 2):
            full = sparse_lower.create_session(lowered, sess_options=session_options(threads))
            layer = median_ms(lambda: full.run(None, feeds), args.repeat)
            tables = sparse_lower.create_session(index_only(lowered), sess_options=session_options(threads))
            table = median_ms(lambda: tables.run(None, {"coords": coords}), args.repeat)
            out_features, out_coords = full.run(None, feeds)
            print(f"{label:28s} {len(coords):8,d} {len(out_coords):8,d} {threads:7d} {layer:9.1f} {table:9.1f}")
        features, coords = np.maximum(out_features, 0), out_coords


if __name__ == "__main__":
    main()
