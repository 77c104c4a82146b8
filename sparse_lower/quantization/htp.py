"""int8 segments for QNN's HTP: every tensor in QDQ form, in the ops the HTP quantizes right.

Why whole-graph: the HTP runs an op quantized only when every input and output of it is; in the form
the other toolchains take (only the products in QDQ, their sums float) each float op runs in fp16 or on
the CPU, and the products with their weights dequantized (the same error at 8 and 16 bits: not int8).
So every tensor is quantized: a layer at 8 bits holds uint8 tensors with int8 weights (w8a8), a *wide*
layer uint16 tensors with int16 weights (the HTP has no float in this form: where other toolchains keep a
layer float, it is wide here). The segment's first and last layers are always wide: the first reads raw
point features (x and y in ±54 m beside intensity up to 255), whose int8 weights left the CenterPoint
backbone 15 % and 30 % off on the real frames even with every tensor at 16 bits (1.9 % and 2.5 % with
int16 weights). Element-wise work between layers stays 16 bits. With the `unfold` combine each output
is rounded once (one product per layer); the per-tap combines round every partial and running sum too.

`htp_form` pads what the HTP computes wrong (pre: a rows-layout segment; post: the same numbers in
onnxruntime): a `Gather` of rows narrower than 32 columns gathers them padded to 32 (one `Pad` per
gathered tensor, a `Slice` after each Gather): the HTP's quantized Gather of 16-column uint8 rows is
1.3–2.2 off (tools/qnn_gather_check.py at commit c2155e0), of 32 columns right.

`quantize_for_htp` then quantizes with onnxruntime's QNN configuration (`get_qnn_qdq_config`: the
types and overrides QNN needs, and the conversions between 8 and 16 bits where a wide layer meets a
narrow one), MinMax ranges of every tensor computed here one sample at a time (onnxruntime's
calibrator would hold every tensor of every sample at once). One exception to that configuration: it
gives a MatMul's weight one scale ("QNN does not support per-channel MatMul"), which is 57 % off on the
CenterPoint backbone's first layer; here each output column has its own, and the HTP (QNN 2.40) runs
that as it runs the same product as a per-channel 1×1 Conv (the same error on the head stack and the
single SubM, measured), and onnxruntime's CPU, where the mixed-precision search runs, far faster than
a Conv over `[rows, Cin, 1, 1]` (a search step on the backbone: about 8 s against 60 s).

Every tensor is clipped to its range, so the ranges may reach past what the calibration frames held
(`Margins`, by kind of tensor and width; QNN's default `OUTSIDE_CALIBRATION`): a frame outside
calibration whose values reach further is then not cut at every partial and residual sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .calibration import tensor_ranges
from .forms import QuantizedForm
from .qdq import static_quantized

@dataclass(frozen=True)
class Margins:
    """How far each tensor's range reaches past the values the calibration frames held, as a fraction of
    those values (0: MinMax). Why: every tensor of this form is clipped to its range, so a frame outside
    calibration whose values reach further is cut at each tensor, partial and residual sums included;
    a margin trades resolution for that reach, which costs little in 16 bits and much in 8. So by kind:
    `features`, the segment's inputs that products read (the first layer's raw point features) and
    their gathered rows; `wide` and `narrow`, every tensor computed in the segment (products, bias and
    residual sums, activations) and the rows gathered of it, where it is held in 16 bits or in 8. The
    other inputs (the rows' masks, 0 or 1) keep their ranges."""

    features: float = 0.0
    wide: float = 0.0
    narrow: float = 0.0


# QNN's default (Qnn.int8_form). Why: the nuScenes frames' tensors differ up to 4-5x in magnitude past the first
# layer (1 sweep against 10: more neighbours summed per site), so calibrated on the sparser frame alone MinMax
# clipped the denser one 74 % off with every tensor in 16 bits, and 16-bit ranges 5x as wide held both frames
# (0.26 % and 0.28 %) for about 2 of their 16 bits; the raw features' own reach (intensity 225 against 255)
# takes 15 %. At 8 bits no margin held both ways beyond one layer (docs/toolchains.md, QNN): MinMax keeps their
# resolution, and calibrated on the denser frame the search's plan (3 layers at 8 bits) held the other at 1.27 %.
OUTSIDE_CALIBRATION = Margins(features=0.15, wide=4.0)


@dataclass(frozen=True)
class WholeGraphQdq(QuantizedForm):
    """This module's form as a toolchain names it (Toolchain.int8_form): the segment in `htp_form`, every
    tensor quantized, the products in `wide` and in `keep_float` with 16-bit tensors and weights (the HTP
    has no float beside int8: 16 bits is the widest). `search_limit`: what the mixed-precision search
    holds this form to in onnxruntime. `margins`: how far the ranges reach past the calibration frames'."""

    search_limit: float = 2e-2
    margins: Margins = Margins()
    # each segment's htp_form, by the model it was made of: the search quantizes one segment many times
    _forms: dict = field(default_factory=dict, compare=False, repr=False)

    def form(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """`htp_form(model)`, made once per model."""
        if id(model) not in self._forms:
            self._forms[id(model)] = (model, htp_form(model))  # the model kept: its id stays its own
        return self._forms[id(model)][1]

    def ranges(self, model: onnx.ModelProto, samples: list[dict]) -> dict[str, tuple]:
        return htp_ranges(self.form(model), samples)

    def quantized(self, model: onnx.ModelProto, samples: list[dict], keep_float: set[str],
                  activation_bits: int = 8, wide: set[str] = frozenset(),
                  ranges: dict[str, tuple] | None = None) -> onnx.ModelProto:
        form = self.form(model)
        return quantize_for_htp(form, ranges or htp_ranges(form, samples), set(wide) | set(keep_float),
                                activation_bits, self.margins)

    def layer_precision(self, kept: bool, wide: bool, activation_bits: int) -> str:
        """16-bit weights and tensors for the kept and wide layers (no float on the HTP), else int8
        weights under 8-bit tensors (16-bit at `activation_bits=16`): quantize_for_htp."""
        return "w16a16" if kept or wide else "w8a8" if activation_bits == 8 else "w8a16"


GATHER_COLUMNS = 32  # the narrowest rows the HTP's quantized Gather was measured right on
# ops that move or copy values without computing: a layer's input reaches its product through them
_MOVES = {"Gather", "Concat", "Pad", "Slice", "Reshape", "Identity", "Transpose"}


def htp_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its narrow Gathers padded (module docstring)."""
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(model))
    constants = _Int64Constants()
    padded: dict[str, gs.Variable] = {}
    for node in list(graph.nodes):
        if node.op == "Gather" and _columns(node.inputs[0]) < GATHER_COLUMNS:
            _gather_padded(graph, node, padded, constants)
    graph.cleanup().toposort()
    return gs.export_onnx(graph, do_type_check=False, ir_version=model.ir_version,
                          opset_imports=list(model.opset_import))


def _columns(tensor: gs.Tensor) -> int:
    """The column count of a 2-D tensor; GATHER_COLUMNS (nothing to pad) for any other."""
    shape = tensor.shape or []
    return shape[1] if len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0 else GATHER_COLUMNS


class _Int64Constants(dict):
    """int64 constants by name, each made once (a graph holds one initializer per name), named apart
    from the segment's own."""

    def __call__(self, name: str, values: list[int]) -> gs.Constant:
        return self.setdefault(name, gs.Constant(f"htp_form/{name}", np.array(values, np.int64)))


def _gather_padded(graph: gs.Graph, node: gs.Node, padded: dict[str, gs.Variable], constants: _Int64Constants) -> None:
    """Gather(x [rows, C < 32]) → Gather(x padded to 32 columns, once per x) → Slice back to C."""
    x, y = node.inputs[0], node.outputs[0]
    columns = x.shape[1]
    if x.name not in padded:
        padded[x.name] = gs.Variable(f"{x.name}/columns_padded", x.dtype, [x.shape[0], GATHER_COLUMNS])
        graph.nodes.append(gs.Node("Pad", f"{x.name}/pad_columns",
                                   inputs=[x, constants(f"pads_columns_{columns}", [0, 0, 0, GATHER_COLUMNS - columns])],
                                   outputs=[padded[x.name]]))
    wide = gs.Variable(f"{y.name}/columns_padded", x.dtype, [y.shape[0], GATHER_COLUMNS])
    node.inputs[0], node.outputs[0] = padded[x.name], wide
    graph.nodes.append(gs.Node("Slice", f"{node.name}/columns", outputs=[y], inputs=[
        wide, constants("zero_1", [0]), constants(f"columns_{columns}", [columns]), constants("one_1", [1])]))


def layer_tensors(model: onnx.ModelProto, products: set[str]) -> set[str]:
    """The tensors that belong to the layers of the weight products named in `products`: what the
    products read, back through the ops that only move values (the gathers, their concatenation,
    padding) to the tensor some op computed, or a graph input; and what they write, forward through the
    move of a product's rows to their sites (the gather combine's), bias, residual sum and activation
    to the tensor that more than one op, or a move, reads."""
    graph = gs.import_onnx(model)
    tensors: set[str] = set()
    for node in graph.nodes:
        if node.name not in products:
            continue
        reading = [node.inputs[0]]
        while reading:
            tensor = reading.pop()
            if tensor.name in tensors or isinstance(tensor, gs.Constant):
                continue
            tensors.add(tensor.name)
            producer = tensor.inputs[0] if tensor.inputs else None
            if producer is not None and producer.op in _MOVES:
                reading += producer.inputs if producer.op == "Concat" else producer.inputs[:1]
        tensor = node.outputs[0]
        while True:
            tensors.add(tensor.name)
            readers = tensor.outputs
            if len(readers) != 1 or readers[0].op in _MOVES and tensor is not node.outputs[0]:
                break
            tensor = readers[0].outputs[0]
    return tensors


def float_tensors(model: onnx.ModelProto) -> list[str]:
    """Every float tensor a run of `model` computes or reads (its inputs included), in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    values = [*inferred.input, *inferred.value_info, *inferred.output]
    return list(dict.fromkeys(v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT))


def quantize_for_htp(model: onnx.ModelProto, ranges: dict[str, tuple], wide: set[str],
                     activation_bits: int = 8, margins: Margins = Margins()) -> onnx.ModelProto:
    """`model` (in `htp_form`) in whole-graph QDQ: with `activation_bits=8` the layers of the weight
    products not in `wide` hold uint8 tensors (`layer_tensors`, but those a wide layer holds too) and
    int8 weights per output column (w8a8), those in `wide` int16 weights, and every other tensor is
    uint16; with 16 every tensor is uint16, the weights int8 but in `wide`. `ranges`: MinMax of every
    float tensor (`htp_ranges`), reaching past it by `margins`."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    stored = {tensor.name for tensor in model.graph.initializer}
    products = [node for node in model.graph.node if node.op_type == "MatMul" and node.input[1] in stored]
    narrow = {node.name for node in products if node.name not in wide} if activation_bits == 8 else set()
    # a tensor between a narrow and a 16-bit layer (a layer's input, a residual) stays 16 bits where it is
    # written, converted to 8 for the narrow one: measured better than 8 bits for both
    eight_bits = layer_tensors(model, narrow) - layer_tensors(model, {node.name for node in products} - narrow)
    overrides = {name: [{"quant_type": QuantType.QUInt8}] for name in eight_bits}
    overrides.update({node.input[1]: [{"quant_type": QuantType.QInt16 if node.name in wide else QuantType.QInt8,
                                       "symmetric": True, "axis": 1}] for node in products})
    activations = QuantType.QUInt16
    config = get_qnn_qdq_config(model, None, activation_type=activations, weight_type=QuantType.QInt8,
                                per_channel=True, init_overrides=overrides)
    config.extra_options["QDQOpTypePerChannelSupportToAxis"] = {"MatMul": 1}
    # a tensor a narrow layer reads at 8 bits takes the narrow margin where it is written at 16 as well: the
    # conversion to 8 bits keeps its range
    ranges = with_margins(model, ranges, margins, layer_tensors(model, narrow))
    return static_quantized(model, ranges, op_types_to_quantize=config.op_types_to_quantize, per_channel=True,
                            activation_type=activations, weight_type=QuantType.QInt8,
                            extra_options=config.extra_options)


def htp_ranges(model: onnx.ModelProto, samples: list[dict]) -> dict[str, tuple]:
    """MinMax over `samples` of every float tensor of `model` (in `htp_form`)."""
    return tensor_ranges(model, samples, float_tensors(model))


def with_margins(model: onnx.ModelProto, ranges: dict[str, tuple], margins: Margins,
                 eight_bits: set[str]) -> dict[str, tuple]:
    """`ranges` (each holding 0) reaching past their ends by `margins`, by the kind of each tensor: where it
    comes from, through the ops that only move values (`Margins`), and, if computed, whether an 8-bit layer
    holds it (`eight_bits`)."""
    if margins == Margins():
        return ranges
    stored = {tensor.name for tensor in model.graph.initializer}
    inputs = {value.name for value in model.graph.input}
    origin = {name: name for name in inputs}
    for node in model.graph.node:  # in graph order: a move's output comes from where its input came
        for name in node.output:
            origin[name] = origin.get(node.input[0], name) if node.op_type in _MOVES else name
    features = inputs & {origin.get(node.input[0]) for node in model.graph.node
                         if node.op_type == "MatMul" and node.input[1] in stored}

    def margin(name: str) -> float:
        source = origin.get(name, name)
        if source in inputs:
            return margins.features if source in features else 0.0
        return margins.narrow if name in eight_bits else margins.wide

    return {name: (low * (1 + margin(name)), high * (1 + margin(name))) for name, (low, high) in ranges.items()}
