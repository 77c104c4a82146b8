"""The nna form's two ways of multiplying, side by side on the CenterPoint backbone and both real
nuScenes frames (docs/performance/pair_list.md): the per-level gather form (every input row times
every tap, at a capacity per level) and the pairs combine (each tap multiplies only the rows it pairs,
at the per-tap capacities measured on the frames).

For each frame it prints the useful multiply-adds (one per (input, output) pair and channel pair, the
reference's pairs), the products' multiply-adds counted from each lowered graph's static shapes (MatMul
rows · Cin · Cout) and their ratio to the useful ones, and the median time of a run in onnxruntime
(2 threads, the forms taking turns) and, with --toolchains, in OpenVINO and TVM (the nna segment on the
toolchain, the index part in onnxruntime with the library; median of half as many runs, each form
compiled once); every output is compared with the per-level form's in onnxruntime.

    python tools/pair_list.py [--repeat 5] [--layout rows] [--toolchains openvino tvm]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

import sparse_lower
from sparse_lower.bench.run import alternating_medians
from sparse_lower.capacity import level_and_pair_rows, pair_rows
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.onnx_conventions import SOURCE_DOMAIN
from sparse_lower.report import render
from sparse_lower.schemas import CONV_OPS, conv_channels
from sparse_lower.toolchains import compile_partition
from sparse_lower.verify import relative_error

FRAMES = ("nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz")


def useful_macs(model: onnx.ModelProto, pairs: dict[str, list[int]]) -> int:
    """Σ over convs of (pairs over all taps) · Cin · Cout."""
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    return sum(sum(pairs[n.name]) * np.prod(conv_channels(n.op_type, weights[n.input[2]]))
               for n in model.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS)


def product_macs(lowered: onnx.ModelProto) -> int:
    """The multiply-adds of every MatMul by a constant weight [Cin, Cout], from the inferred static
    shapes of its rows [R, Cin] (the rows layout): R · Cin · Cout."""
    inferred = onnx.shape_inference.infer_shapes(lowered)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    weights = {t.name: list(t.dims) for t in lowered.graph.initializer}
    total = 0
    for node in lowered.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            rows = shapes[node.input[0]][0]
            assert rows > 0, f"{node.name}: rows not static"
            total += rows * int(np.prod(weights[node.input[1]]))
    return total


def median_run_ms(compiled, feeds: dict, repeat: int) -> float:
    """Median ms of `repeat` runs of a compiled partition on `feeds` (after the run that checked it)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        compiled.run(feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layout", default="rows", choices=["rows", "image"])
    parser.add_argument("--toolchains", nargs="*", default=[], choices=["openvino", "tvm"])
    args = parser.parse_args()
    model = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    frames = [real_feeds(name) for name in FRAMES]
    levels, pairs = level_and_pair_rows(model, frames)
    print(f"capacities per level (most over both frames): {levels}; pairs per tap measured on the same frames")
    forms = {"per level (gather)": {"combine": "gather"}, "pairs": {"combine": "pairs", "max_pairs": pairs}}
    lowered = {title: sparse_lower.lower(model, target="nna", max_active=levels, layout="rows", **options)
               for title, options in forms.items()}
    macs = {title: product_macs(m) for title, m in lowered.items()}  # the layouts multiply alike
    if args.layout == "image":
        lowered = {title: sparse_lower.lower(model, target="nna", max_active=levels, **options)
                   for title, options in forms.items()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sessions = {title: sparse_lower.create_session(m, sess_options=options) for title, m in lowered.items()}
    compiled = {(toolchain, title): compile_partition(sparse_lower.partition(m), toolchain,
                                                      tempfile.mkdtemp(prefix=f"pairs-{toolchain}-"))
                for toolchain in args.toolchains for title, m in lowered.items()}
    rows = []
    for name, feeds in zip(FRAMES, frames):
        useful = useful_macs(model, pair_rows(model, [feeds]))
        outputs = {title: session.run(None, feeds)[0] for title, session in sessions.items()}
        error = relative_error(*outputs.values())
        times = alternating_medians(sessions, feeds, args.repeat)
        extra = {title: [] for title in forms}
        for (toolchain, title), partition in compiled.items():
            got = partition.run(feeds)
            error = max(error, relative_error(next(iter(got.values())), outputs[title]))
            extra[title].append(f"{median_run_ms(partition, feeds, max(1, args.repeat // 2)):,.0f}")
        for title in forms:
            rows.append([name.split("_")[1], title, f"{useful / 1e9:.1f}", f"{macs[title] / 1e9:.1f}",
                         f"{macs[title] / useful:.2f}", f"{times[title]:,.0f}",
                         f"{times['per level (gather)'] / times[title]:.2f}", *extra[title]])
        print(f"{name}: the outputs differ by at most {error:.1e} (relative to the largest value), between the forms "
              f"and between the runtimes", flush=True)
    print(render(["frame", "form", "useful GMACs", "product GMACs", "x useful", "onnxruntime ms", "speed-up",
                  *(f"{t} ms" for t in args.toolchains)], rows))
    print(f"{args.layout} layout; onnxruntime {ort.__version__}, 2 threads, median of {args.repeat} runs, the forms "
          f"taking turns; vector units: {sparse_lower.runtime.vector_units()}")


if __name__ == "__main__":
    main()
