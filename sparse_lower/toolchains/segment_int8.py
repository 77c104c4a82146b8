"""int8 accelerator segments: post-training quantization calibrated on real frames.

`segment_samples` runs a partition on calibration feeds and keeps what each accelerator segment
reads; `quantize_qdq` turns a segment into onnxruntime's QDQ form (QuantizeLinear/DequantizeLinear
pairs around the int8 ops, which onnxruntime, OpenVINO and TVM run as int8): per-output-channel int8
weights and per-tensor int8 activations, MinMax-calibrated on those samples (`activation_ranges`).
With `activation_bits=16` the activations are int16: on the CenterPoint backbone the 8-bit
activations, not the weights, take the error above 2 % (tools/int8_layers.py).

Only the products by weights are quantized (the 1×1 Convs, or the MatMuls by a constant weight in the
rows layout), and their outputs stay float (int32 sums dequantized): the combine (gather,
scatter-add, the MatMul by a 0/1 scatter matrix) adds up to 27 partials per output, and quantizing
each before the sum gives 1.4–7.5 % error, 51 % on the matmul combine (docs/toolchains.md). The
products of the network's first layer (raw point features: x, y in ±54 m next to a 0..0.5 s time
channel, one per-tensor scale for all) and last layer (the output itself) stay float too, as usual in
post-training quantization; on the CenterPoint backbone, calibrated and measured on the BEVFusion
frame, that takes the error from 9.2 % to 1.8 % (calibrated on both nuScenes frames: 4.7 % and 2.4 %,
docs/toolchains.md).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import networkx as nx
import numpy as np
import onnx

from ..model_io import exposing
from ..partition import Partition
from ..partition.segments import NodeGraph
from ..runtime import create_session
from .base import ACCELERATOR


def run_segments(parts: Partition, sessions: Mapping[int, object], feeds: Mapping[str, np.ndarray]) -> dict:
    """Every value at a segment boundary on `feeds` (the graph inputs and outputs among them): the
    segments run in order, each in `sessions[index]` (an onnxruntime session, or one with a quantized
    segment in its place)."""
    values = dict(feeds)
    for segment in parts.segments:
        inputs = {name: values[name] for name in segment.inputs}
        values.update(zip(segment.outputs, sessions[segment.index].run(list(segment.outputs), inputs)))
    return values


def segment_sessions(parts: Partition) -> dict[int, object]:
    """An onnxruntime session of every segment of `parts`, by index: what `run_segments` runs."""
    return {s.index: create_session(parts.segment_model(s.index)) for s in parts.segments}


def accelerator_inputs(parts: Partition, values: Mapping[str, np.ndarray]) -> dict[int, dict]:
    """What each accelerator segment of `parts` reads, from one run's `run_segments` values."""
    return {s.index: {name: values[name] for name in s.inputs} for s in parts.segments if s.device == ACCELERATOR}


def segment_samples(parts: Partition, calibration: Iterable[Mapping[str, np.ndarray]]) -> dict[int, list[dict]]:
    """For every accelerator segment of `parts`, its inputs on each calibration feed (in onnxruntime)."""
    sessions = segment_sessions(parts)
    samples: dict[int, list[dict]] = {s.index: [] for s in parts.segments if s.device == ACCELERATOR}
    for feeds in calibration:  # one frame's values at a time
        for index, inputs in accelerator_inputs(parts, run_segments(parts, sessions, feeds)).items():
            samples[index].append(inputs)
    return samples


def _multiplies_by_a_weight(node: onnx.NodeProto, stored: set[str]) -> bool:
    return node.op_type == "Conv" or (node.op_type == "MatMul" and node.input[1] in stored)


def weight_products(model: onnx.ModelProto) -> list[str]:
    """The nodes that multiply by a stored weight: Conv, and MatMul whose right operand is an initializer."""
    stored = {t.name for t in model.graph.initializer}
    return [node.name for node in model.graph.node if _multiplies_by_a_weight(node, stored)]


def first_and_last_products(graph: NodeGraph) -> set[str]:
    """The weight products of the network's first and last layers, by the partition's node names: those
    with no other weight product upstream, or none downstream on the partition's data-flow graph (so any
    naming and any number of branches). Empty when that would be every product (a network of one or
    two layers): int8 means quantizing them."""
    products = {i for i in graph.dag if _multiplies_by_a_weight(graph.nodes[i], graph.initializers)}

    def behind_a_product(flow: nx.DiGraph) -> set[int]:
        """The nodes with a product upstream in `flow` (one topological pass, not a search per node)."""
        behind: set[int] = set()
        for i in nx.topological_sort(flow):
            if any(other in behind or other in products for other in flow.pred[i]):
                behind.add(i)
        return behind

    after, before = behind_a_product(graph.dag), behind_a_product(graph.dag.reverse(copy=False))
    edges = (products - after) | (products - before)
    return {graph.names[i] for i in edges} if edges != products else set()


def activations_read(model: onnx.ModelProto, products: list[str]) -> list[str]:
    """The activations (first inputs) that the nodes named in `products` read, sorted."""
    named = set(products)
    return sorted({node.input[0] for node in model.graph.node if node.name in named})


def tensor_ranges(model: onnx.ModelProto, samples: list[dict], names: list[str]) -> dict[str, tuple]:
    """MinMax over `samples` (the model's inputs) of the float tensors `names`, each range holding 0,
    one sample's values at a time."""
    session = create_session(exposing(model, names, onnx.TensorProto.FLOAT))
    ranges: dict[str, tuple] = {}
    for sample in samples:
        for name, value in zip(names, session.run(names, sample)):
            low, high = np.float32(value.min(initial=0.0)), np.float32(value.max(initial=0.0))
            if name in ranges:
                low, high = min(low, ranges[name][0]), max(high, ranges[name][1])
            ranges[name] = (low, high)
    return ranges


def activation_ranges(model: onnx.ModelProto, samples: list[dict], products: list[str]) -> dict[str, tuple]:
    """MinMax over `samples` of the activations that `products` read: the only ranges a QDQ model whose
    products keep float outputs needs. onnxruntime's own calibrator would also keep every product's
    output, 27 partials of `[capacity, Cout]` per layer: tens of GB on a real frame."""
    return tensor_ranges(model, samples, activations_read(model, products))


def layer_of(product: str) -> str:
    """The layer (source conv) of a product node: the lowering names a layer's products `LAYER/tapK/OP`
    (one per tap), or `LAYER/OP` (one for all taps: fuse_taps, the unfold combine)."""
    return re.sub(r"/tap\d+/.*$|/[^/]*$", "", product)


def layer_products(products: list[str]) -> dict[str, list[str]]:
    """The products by layer (`layer_of`)."""
    layers: dict[str, list[str]] = {}
    for product in products:
        layers.setdefault(layer_of(product), []).append(product)
    return layers


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
