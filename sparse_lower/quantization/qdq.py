"""onnxruntime's QDQ form of a segment's products by a weight (QuantizeLinear/DequantizeLinear pairs
around them), which onnxruntime, OpenVINO and TVM run as int8: per-output-channel int8 weights, per-tensor
int8 or int16 activations, MinMax-calibrated (calibration.py).

Only the products by weights are quantized (the 1×1 Convs, or the MatMuls by a constant weight in the
rows layout), and their outputs stay float (int32 sums dequantized): the combine (gather, scatter-add,
the MatMul by a 0/1 scatter matrix) adds up to 27 partials per output, and quantizing each before the
sum gives 1.4–7.5 % error, 51 % on the matmul combine (docs/toolchains.md). The products of the
network's first layer (raw point features: x, y in ±54 m next to a 0..0.5 s time channel, one
per-tensor scale for all) and last layer (the output itself) stay float too, as usual in post-training
quantization; on the CenterPoint backbone, calibrated and measured on the BEVFusion frame, that takes the
error from 9.2 % to 1.8 % (calibrated on both nuScenes frames: 4.7 % and 2.4 %, docs/toolchains.md).
With 16-bit activations the error stays within 2 %: the 8-bit activations, not the weights, take the
backbone above it (tools/int8_layers.py at commit c2155e0).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .calibration import activation_ranges
from .forms import QuantizedForm
from .products import activations_read, weight_products


@dataclass(frozen=True)
class PartialQdq(QuantizedForm):
    """This module's form as a toolchain names it (Toolchain.int8_form). `seven_bit_weights`: the products
    that read 8-bit activations take weights in −63…63, for an accelerator whose runtime may run them on a
    CPU without VNNI (OpenVINO: `vpmaddubsw` sums pairs of u8 · s8 products in 16 bits, saturating)."""

    seven_bit_weights: bool = False

    def ranges(self, model: onnx.ModelProto, samples: list[dict]) -> dict[str, tuple]:
        return activation_ranges(model, samples, weight_products(model))

    def quantized(self, model: onnx.ModelProto, samples: list[dict], keep_float: set[str],
                  activation_bits: int = 8, wide: set[str] = frozenset(),
                  ranges: dict[str, tuple] | None = None) -> onnx.ModelProto:
        return quantize_qdq(model, samples, keep_float, activation_bits, ranges, wide=wide,
                            reduce_range=self.seven_bit_weights)


def quantize_qdq(model: onnx.ModelProto, samples: list[dict], keep_float: set[str] = frozenset(),
                 activation_bits: int = 8, ranges: dict[str, tuple] | None = None,
                 wide: set[str] = frozenset(), reduce_range: bool = False) -> onnx.ModelProto:
    """`model` with its weight products but `keep_float` in QDQ form, calibrated on `samples` (its
    inputs): int8 weights, and int8 or (`activation_bits=16`, onnxruntime's int16 QuantizeLinear of its
    com.microsoft domain) int16 activations; the products in `wide` read int16 activations whatever
    `activation_bits` (mixed precision, mixed_precision.py). `ranges`: `activation_ranges` of these
    samples for at least the quantized products, when the caller quantizes the same model several ways
    (computed here otherwise). `reduce_range`: the products that read 8-bit activations take 7-bit
    weights (−63…63), whose products with them cannot overflow the 16-bit pair sums of CPUs without
    VNNI (`vpmaddubsw`)."""
    from onnxruntime.quantization import QuantType

    chosen = [name for name in weight_products(model) if name not in keep_float]
    if not chosen:  # onnxruntime reads an empty nodes_to_quantize as "every node"
        return model
    read = set(activations_read(model, chosen))
    ranges = {name: span for name, span in (ranges or activation_ranges(model, samples, chosen)).items()
              if name in read}
    narrow = [n for n in chosen if n not in wide] if activation_bits == 8 else []
    widened = {name: [{"quant_type": QuantType.QInt16}]
               for name in activations_read(model, [n for n in chosen if n in wide])} if activation_bits == 8 else {}
    seven_bits = {node.input[1]: [{"axis": 0 if node.op_type == "Conv" else 1, "reduce_range": True}]
                  for node in model.graph.node if reduce_range and node.name in narrow}
    return static_quantized(model, ranges, op_types_to_quantize=["Conv", "MatMul"], nodes_to_quantize=chosen,
                            per_channel=True, weight_type=QuantType.QInt8,
                            activation_type={8: QuantType.QInt8, 16: QuantType.QInt16}[activation_bits],
                            extra_options={"QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
                                           "OpTypesToExcludeOutputQuantization": ["Conv", "MatMul"],
                                           "UseQDQContribOps": activation_bits == 16 or bool(widened),
                                           "TensorQuantOverrides": {**widened, **seven_bits}})


def static_quantized(model: onnx.ModelProto, ranges: dict[str, tuple], **options) -> onnx.ModelProto:
    """`model` through onnxruntime's `quantize_static` in QDQ form with `options`, calibrated with the
    MinMax `ranges` given (as its calibration cache) instead of running its own calibrator."""
    from onnxruntime.quantization import QuantFormat, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData, save_tensors_data

    with tempfile.TemporaryDirectory() as work:
        source, target, cache = Path(work) / "float.onnx", Path(work) / "int8.onnx", Path(work) / "ranges.json"
        onnx.save(model, source)
        save_tensors_data(TensorsData(CalibrationMethod.MinMax, {
            name: TensorData(lowest=np.array(low), highest=np.array(high)) for name, (low, high) in ranges.items()}),
            cache)
        quantize_static(str(source), str(target), None, quant_format=QuantFormat.QDQ, calibration_cache_path=cache,
                        **options)
        return onnx.load(target)
