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
class WholeGraphQdq(QuantizedForm):
    """This module's form as a toolchain names it (Toolchain.int8_form): the segment in `htp_form`, every
    tensor quantized, the products in `wide` and in `keep_float` with 16-bit tensors and weights (the HTP
    has no float beside int8: 16 bits is the widest). `search_limit`: what the mixed-precision search
    holds this form to in onnxruntime."""

    search_limit: float = 2e-2
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
                                activation_bits)


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
    padding) to the tensor some op computed, or a graph input; and what they write, forward through
    bias, residual sum and activation to the tensor that more than one op, or a move, reads."""
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
            if len(readers) != 1 or readers[0].op in _MOVES:
                break
            tensor = readers[0].outputs[0]
    return tensors


def float_tensors(model: onnx.ModelProto) -> list[str]:
    """Every float tensor a run of `model` computes or reads (its inputs included), in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    values = [*inferred.input, *inferred.value_info, *inferred.output]
    return list(dict.fromkeys(v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT))


def quantize_for_htp(model: onnx.ModelProto, ranges: dict[str, tuple], wide: set[str],
                     activation_bits: int = 8) -> onnx.ModelProto:
    """`model` (in `htp_form`) in whole-graph QDQ: with `activation_bits=8` the layers of the weight
    products not in `wide` hold uint8 tensors (`layer_tensors`, but those a wide layer holds too) and
    int8 weights per output column (w8a8), those in `wide` int16 weights, and every other tensor is
    uint16; with 16 every tensor is uint16, the weights int8 but in `wide`. `ranges`: MinMax of every
    float tensor (`htp_ranges`)."""
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
    return static_quantized(model, ranges, op_types_to_quantize=config.op_types_to_quantize, per_channel=True,
                            activation_type=activations, weight_type=QuantType.QInt8,
                            extra_options=config.extra_options)


def htp_ranges(model: onnx.ModelProto, samples: list[dict]) -> dict[str, tuple]:
    """MinMax over `samples` of every float tensor of `model` (in `htp_form`)."""
    return tensor_ranges(model, samples, float_tensors(model))

