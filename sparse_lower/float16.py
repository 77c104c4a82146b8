"""float16 → float32 for a whole model: the first step of every import, and of the lowering of a
source-op model converted to float16 (passes/float16.py).

The formats in the wild store FP16 weights and declare FP16 features because their engines run in
half precision, and users run onnxconverter-common's float16 conversion on models before deploying;
the source ops (docs/source_ops.md) are float32 throughout, so the model computes in float32 from the
same (exactly representable) values.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def _tensor32(tensor: onnx.TensorProto) -> onnx.TensorProto:
    if tensor.data_type != TensorProto.FLOAT16:
        return tensor
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _value32(value: onnx.ValueInfoProto) -> bool:
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type != TensorProto.FLOAT16:
        return False
    tensor_type.elem_type = TensorProto.FLOAT
    return True


def _node32(node: onnx.NodeProto) -> None:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            attr.t.CopyFrom(_tensor32(attr.t))
        elif node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
            attr.i = TensorProto.FLOAT


def holds_float16(model: onnx.ModelProto) -> bool:
    """Whether anything but a graph input is float16: an initializer, a declared value or output, a
    constant or a Cast to half (a model converted to float16). Float16 feature inputs alone are what the
    lowering casts itself."""
    graph = model.graph
    values = [*graph.output, *graph.value_info]
    return (any(t.data_type == TensorProto.FLOAT16 for t in graph.initializer)
            or any(v.type.tensor_type.elem_type == TensorProto.FLOAT16 for v in values)
            or any(_casts_to_half(node) or any(a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16
                                                for a in node.attribute) for node in graph.node))


def _casts_to_half(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in node.attribute)


def to_float32(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of `model` whose float16 initializers, constants, casts and declared types are float32,
    and the names of the graph inputs and outputs that were float16 (the imported model says so).

    Subgraphs (If/Loop bodies) are left as they are: none of the formats imported here has any.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    converted = [_tensor32(t) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(converted)
    widened = [value.name for value in [*graph.input, *graph.output] if _value32(value)]
    for value in graph.value_info:
        _value32(value)
    for node in graph.node:
        _node32(node)
    return model, widened
