"""QNN's HTP and a quantized Gather (docs/toolchains.md, int8 on QNN's HTP): why the qnn toolchain pads
the gathered rows of its int8 segments to 32 columns (sparse_lower.quantization.htp.htp_form). One
`Gather` (axis 0) of `[rows, columns]` uint8 rows between QuantizeLinear/DequantizeLinear pairs, the
form of every tap's gather in the nna rows layout, run on onnxruntime-qnn's HTP backend (simulated) and
on onnxruntime's CPU, for several column counts; the relative error between them (one quantization
step is 0.01 of these values' range).

    python tools/qnn_gather_check.py [--rows 1701] [--gathered 1700] [--bits 8]

Measured with onnxruntime-qnn 2.7.0 (QNN 2.40): at 8 bits, 16 columns come out 1.3-2.2 off (every
seed), 4 and 32 columns one step off; at 16 bits, 4 columns 191 off on one seed of three. A
reproduction to send upstream, and to try again on a new version (the padding can go where it passes).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from sparse_lower.onnx_conventions import IR_VERSION
from sparse_lower.toolchains.qnn import htp_session_options
from sparse_lower.verify import relative_error


def quantized_gather(rows: int, columns: int, gathered: int, bits: int) -> onnx.ModelProto:
    """x [rows, columns] → Q/DQ → Gather(axis 0, int32 indices [gathered]) → Q/DQ → y."""
    zero = np.array(120 if bits == 8 else 30000, np.uint8 if bits == 8 else np.uint16)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xd"]),
             helper.make_node("Gather", ["xd", "i"], ["g"], axis=0),
             helper.make_node("QuantizeLinear", ["g", "scale", "zero"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "scale", "zero"], ["y"])]
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, columns]),
                          helper.make_tensor_value_info("i", TensorProto.INT32, [gathered])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [gathered, columns])],
        [numpy_helper.from_array(np.array(0.01, np.float32), "scale"), numpy_helper.from_array(zero, "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1701)
    parser.add_argument("--gathered", type=int, default=1700)
    parser.add_argument("--bits", type=int, default=8, choices=(8, 16))
    args = parser.parse_args()
    for seed in range(3):
        rng = np.random.default_rng(seed)
        cells = []
        for columns in (4, 16, 32):
            model = quantized_gather(args.rows, columns, args.gathered, args.bits).SerializeToString()
            feeds = {"x": rng.uniform(-1, 1, (args.rows, columns)).astype(np.float32),
                     "i": rng.integers(0, args.rows, args.gathered).astype(np.int32)}
            on_htp = ort.InferenceSession(model, htp_session_options()).run(None, feeds)[0]
            on_cpu = ort.InferenceSession(model).run(None, feeds)[0]
            cells.append(f"{columns} columns {relative_error(on_htp, on_cpu):.3f}")
        print(f"seed {seed}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
