"""What integer activations and weights would cost the gpu form's accuracy, before any int8 kernel is written
(docs/performance.md: int8 on the gpu target): the CenterPoint backbone lowered for the gpu target, with every
IndexedConv's input rows rounded to a grid of `levels` steps of [0, max] (producer side, so that the residual
reads the rounded rows too, as it would from an integer buffer) and its weights rounded to symmetric int8, per
output channel or per (tap, output channel). The network's first conv keeps its raw float point features (x, y
in ±54 m beside a 0..0.5 s time), as in post-training quantization. Ranges are the MinMax over both nuScenes
frames; the error is measured on each: max error relative to the output's largest magnitude, and SNR.

    python tools/int8_gpu_accuracy.py [--model "CenterPoint backbone"|"sparse UNet"]

Each line runs the model on both frames (about half a minute on 2 cores).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import helper, numpy_helper

import sparse_lower
from sparse_lower.model_io import exposing
from sparse_lower.verify import relative_error, snr_db
from int8_layers import int8_rounded
from toolchain_table import FRAMES, frame, real_models

# (label, activation levels or None for float, activation range per channel, weight scale per tap)
VARIANTS = (("int8 weights per output channel, float activations", None, False, False),
            ("int8 weights per (tap, output channel), float activations", None, False, True),
            ("u8 activations per tensor, int8 weights per (tap, output channel)", 255, False, True),
            ("u8 activations per channel, int8 weights per (tap, output channel)", 255, True, True),
            ("10-bit activations per channel, int8 weights per (tap, output channel)", 1023, True, True),
            ("12-bit activations per tensor, int8 weights per (tap, output channel)", 4095, False, True))


def conv_inputs(lowered: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[str]]:
    """The IndexedConvs, and the rows they read that a node computes (not the graph's own features)."""
    convs = [node for node in lowered.graph.node if node.op_type == "IndexedConv"]
    produced = {name for node in lowered.graph.node for name in node.output}
    return convs, sorted({node.input[0] for node in convs} & produced)


def ranges(lowered: onnx.ModelProto, rows: list[str], frames: list[dict]) -> dict[str, np.ndarray]:
    """Per tensor of `rows`, the largest magnitude of each channel over `frames`."""
    session = sparse_lower.create_session(exposing(lowered, rows, onnx.TensorProto.FLOAT))
    found = [dict(zip(rows, session.run(rows, feeds))) for feeds in frames]
    if any(float(values[name].min()) < 0 for values in found for name in rows):
        raise SystemExit("a conv reads negative rows: this model needs signed activations")
    return {name: np.max([np.abs(values[name]).max(axis=0) for values in found], axis=0) for name in rows}


def rounded(lowered: onnx.ModelProto, convs, maxima: dict, levels: int | None, per_channel: bool,
            per_tap: bool) -> onnx.ModelProto:
    """`lowered` with the weights of every conv but the first-layer ones rounded to int8 and, with
    `levels`, every conv input rounded to `levels` steps of its range (standard ops after its producer)."""
    model = onnx.ModelProto()
    model.CopyFrom(lowered)
    stored = {tensor.name: tensor for tensor in model.graph.initializer}
    for conv in convs:
        if conv.input[0] in maxima:  # not a first-layer conv
            weight = numpy_helper.to_array(stored[conv.input[2]])  # [K, Cin, Cout]
            stored[conv.input[2]].CopyFrom(numpy_helper.from_array(int8_rounded(weight, (1,) if per_tap else (0, 1)),
                                                                   conv.input[2]))
    if levels is None:
        return model
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        for position, name in enumerate(node.output):
            if name not in maxima:
                continue
            top = maxima[name] if per_channel else np.full_like(maxima[name], maxima[name].max())
            step = np.where(top > 0, top / levels, 1).astype(np.float32)
            raw = node.output[position] = f"{name}/unrounded"
            model.graph.initializer.extend([numpy_helper.from_array(step, f"{name}/step"),
                                            numpy_helper.from_array(np.float32(0), f"{name}/low"),
                                            numpy_helper.from_array(np.float32(levels), f"{name}/high")])
            nodes += [helper.make_node("Div", [raw, f"{name}/step"], [f"{name}/steps"]),
                      helper.make_node("Round", [f"{name}/steps"], [f"{name}/whole"]),
                      helper.make_node("Clip", [f"{name}/whole", f"{name}/low", f"{name}/high"], [f"{name}/code"]),
                      helper.make_node("Mul", [f"{name}/code", f"{name}/step"], [name])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="CenterPoint backbone", choices=[name for name, _ in real_models()])
    args = parser.parse_args()
    frames = [frame(name) for name in FRAMES]
    lowered = sparse_lower.lower(dict(real_models())[args.model], target="gpu")
    session = sparse_lower.create_session(lowered)
    wanted = [session.run(None, feeds)[0] for feeds in frames]
    convs, rows = conv_inputs(lowered)
    maxima = ranges(lowered, rows, frames)
    print(f"{args.model}, gpu form; max error (SNR) on {' and '.join(FRAMES)}")
    for label, levels, per_channel, per_tap in VARIANTS:
        variant = sparse_lower.create_session(rounded(lowered, convs, maxima, levels, per_channel, per_tap))
        cells = []
        for feeds, want in zip(frames, wanted):
            got = variant.run(None, feeds)[0]
            cells.append(f"{100 * relative_error(got, want):.2f} % ({snr_db(got, want):.1f} dB)")
        print(f"{label:<72} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()
