"""Where the int8 error of a real-frame model comes from (docs/toolchains.md, int8): its nna segment
with every product's weights rounded to per-output-channel int8 and activations float (the floor of
int8 weights), with int8 and with int16 activations (first and last layers float, as
compile_partition quantizes), and with --layers one layer at a time quantized, every other float.
Calibrated on both nuScenes frames and measured on each: max error relative to the output's largest
magnitude, and SNR.

    python tools/int8_layers.py [--model "CenterPoint backbone"|"sparse UNet"] [--layers]

The gather combine in the image layout, at the capacity both frames fit; each line takes a minute or
more on 2 cores (a run of the model on both frames, and a quantization).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import numpy_helper

import sparse_lower
from sparse_lower.runtime import create_session
from sparse_lower.partition.devices import ACCELERATOR
from sparse_lower.quantization.calibration import activation_ranges, run_segments, segment_samples, segment_sessions
from sparse_lower.quantization.products import first_and_last_products, layer_products, weight_products
from sparse_lower.quantization.qdq import quantize_qdq
from sparse_lower.verify import relative_error, snr_db
from toolchain_table import FRAMES, capacities_for, frame, real_models


def int8_rounded(weight: np.ndarray, reduced: tuple[int, ...]) -> np.ndarray:
    """`weight` rounded to symmetric int8 with one scale per slice along the axes not in `reduced`
    (the scale: the slice's largest magnitude / 127), back in float32."""
    scale = np.abs(weight).max(axis=reduced, keepdims=True) / 127
    scale[scale == 0] = 1
    return (np.round(weight / scale) * scale).astype(np.float32)


def rounded_weights(segment: onnx.ModelProto, products: set[str]) -> onnx.ModelProto:
    """`segment` with the weights of `products` rounded to symmetric per-output-channel int8 (axis 0 of a
    Conv weight, 1 of a MatMul's), in float: int8 weights with float activations."""
    rounded = onnx.ModelProto()
    rounded.CopyFrom(segment)
    stored = {tensor.name: tensor for tensor in rounded.graph.initializer}
    for node in rounded.graph.node:
        if node.name in products:
            weight = numpy_helper.to_array(stored[node.input[1]])
            axis = 0 if node.op_type == "Conv" else 1
            reduced = tuple(i for i in range(weight.ndim) if i != axis)
            stored[node.input[1]].CopyFrom(numpy_helper.from_array(int8_rounded(weight, reduced), node.input[1]))
    return rounded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="CenterPoint backbone", choices=[name for name, _ in real_models()])
    parser.add_argument("--layers", action="store_true", help="also quantize one layer at a time")
    args = parser.parse_args()
    model = dict(real_models())[args.model]
    frames = [frame(name) for name in FRAMES]
    capacity = capacities_for(model, frames)
    lowered = sparse_lower.lower(model, target="nna", combine="gather", max_active=capacity)
    parts = sparse_lower.partition(lowered)
    session = sparse_lower.create_session(lowered)
    names = [output.name for output in session.get_outputs()]
    wanted = [dict(zip(names, session.run(None, feeds))) for feeds in frames]
    samples = segment_samples(parts, frames)
    (index,) = [segment.index for segment in parts.segments if segment.device == ACCELERATOR]
    segment = parts.segment_model(index)
    sessions = segment_sessions(parts)

    def report(label: str, replacement: onnx.ModelProto) -> None:
        """Run the partition with the nna segment replaced; print its error on each frame."""
        sessions[index] = create_session(replacement)
        cells = []
        for feeds, want in zip(frames, wanted):
            values = run_segments(parts, sessions, feeds)
            floats = [n for n in names if want[n].dtype.kind == "f"]
            error = max(relative_error(values[n], want[n]) for n in floats)
            cells.append(f"{100 * error:.2f} % ({min(snr_db(values[n], want[n]) for n in floats):.1f} dB)")
        print(f"{label:<40} " + "   ".join(cells), flush=True)

    products = weight_products(segment)
    edges = first_and_last_products(parts.graph)
    print(f"{args.model}, capacity {capacity:,}; max error (SNR) on {' and '.join(FRAMES)}")
    report("int8 weights, float activations", rounded_weights(segment, set(products) - edges))
    ranges = activation_ranges(segment, samples[index], products)  # once: each quantize_qdq below reads them
    report("int8 weights, int8 activations", quantize_qdq(segment, samples[index], edges, ranges=ranges))
    report("int8 weights, int16 activations", quantize_qdq(segment, samples[index], edges, 16, ranges))
    if args.layers:
        for layer, members in layer_products(products).items():
            if not set(members) <= edges:
                report(f"only {layer} in int8",
                       quantize_qdq(segment, samples[index], set(products) - set(members), ranges=ranges))


if __name__ == "__main__":
    main()
