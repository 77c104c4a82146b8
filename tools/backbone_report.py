"""The CenterPoint backbone (SpMiddleResNetFHD) on the real frames: active sites per layer, wall time
of the lowered model in onnxruntime, and the error against spconv when torch + spconv are installed.

    python tools/backbone_report.py [--repeat 5] [--threads 2]

The backbone is built as NVIDIA's tooling exports it and imported, as a user's model would be.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort

import sparse_lower
from sparse_lower.frames.sample import find_data, load_voxels
from sparse_lower.model_io import exposing
from sparse_lower.models import CanonicalEmitter, NvidiaEmitter, sp_middle_resnet_fhd
from sparse_lower.onnx_conventions import SOURCE_DOMAIN
from sparse_lower.report import render

FRAMES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")


def with_layer_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with every sparse conv's output coords exposed as graph outputs."""
    names = [(n.name, n.output[1]) for n in model.graph.node if n.domain == SOURCE_DOMAIN and len(n.output) == 2]
    return exposing(model, [c for _, c in names], onnx.TensorProto.INT64), [n for n, _ in names]


def spconv_error(features, coords, grid, output) -> str:
    try:
        from sparse_lower.models.spconv_emitter import SpconvEmitter
    except ImportError as error:  # torch / spconv absent
        return f"n/a ({error.name} not installed)"
    network = sp_middle_resnet_fhd(SpconvEmitter(np.float16), np.random.default_rng(0), spatial_shape=grid)
    (expected,) = network(features, coords)
    return f"{np.abs(output - expected).max() / np.abs(expected).max():.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for frame in FRAMES:
        path = find_data(frame)
        if path is None:
            print(f"{frame}: not found, skipped")
            continue
        features, coords, grid = load_voxels(path)
        canonical = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid)
        exposed, layers = with_layer_outputs(canonical)
        counts = sparse_lower.create_session(sparse_lower.lower(exposed)).run(None, {"features": features,
                                                                                     "coords": coords})[1:]
        print(f"{path.name}: {len(coords):,} voxels on {grid}")
        print(render(["layer", "active sites"], [[name, f"{len(c):,}"] for name, c in zip(layers, counts)]))
        imported = sparse_lower.import_model(sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0),
                                                                  spatial_shape=grid))
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = sparse_lower.create_session(sparse_lower.lower(imported), sess_options=options)
        feeds = {imported.graph.input[0].name: features, "coords": coords}
        (output,) = session.run(None, feeds)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            session.run(None, feeds)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"backbone (NVIDIA export imported, gpu target, {args.threads} threads): "
              f"median {np.median(times):,.0f} ms of {args.repeat}; output {list(output.shape)}; "
              f"max relative error vs spconv (fp16 weights, 1 thread): {spconv_error(features, coords, grid, output)}\n")


if __name__ == "__main__":
    main()
