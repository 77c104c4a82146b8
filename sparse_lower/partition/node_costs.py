"""What any ONNX node costs: multiply-accumulates of a node, bytes of a tensor, and the concrete shapes
a run makes known, for the segment reports (reports.py). Shapes come from the type oracle where
static, else from what the last run saw. It knows ONNX ops and the library's custom ops, not how a
graph was lowered (the lowering's own cost model is sparse_lower/layer_costs.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import prod

import onnx
from onnx import helper

from ..onnx_conventions import CUSTOM_DOMAIN, STANDARD_DOMAINS
from .value_types import ValueTypes

Shape = tuple[int, ...]
INDEXED_CONVS = ("IndexedConv", "IndexedConvInt8")
ShapeOf = Callable[[str], "Shape | None"]


@dataclass
class Seen:
    """What a run saw: the shapes and bytes of every segment input and output, and the shapes of the
    values custom ops produce inside segments (probed, since ONNX shape inference cannot see them)."""

    shapes: dict[str, Shape] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _mac_tensors(node: onnx.NodeProto) -> tuple[str, ...]:
    """The tensors whose shapes `macs` reads (none for ops without multiply-accumulates)."""
    if node.domain == CUSTOM_DOMAIN and node.op_type in INDEXED_CONVS:
        return node.output[0], node.input[2]
    if node.domain not in STANDARD_DOMAINS:
        return ()
    if node.op_type in ("Conv", "MatMul", "Gemm"):
        return node.output[0], node.input[1 if node.op_type == "Conv" else 0]
    if node.op_type == "ConvTranspose":
        return node.input[0], node.input[1]
    return ()


def macs(node: onnx.NodeProto, shape_of: ShapeOf) -> int | None:
    """Multiply-accumulates of a node, None where a shape it needs is unknown.

    Conv: output elements · Cin/group · Πkernel (the weight is [Cout, Cin/group, *K]); ConvTranspose:
    input elements · Cout/group · Πkernel; MatMul and Gemm: M·K·N (output elements · K); the gpu's
    IndexedConv (and IndexedConvInt8): M·K·Cin·Cout (output rows · its weight [K, Cin, Cout]), the bound
    it reaches when every tap of every row exists (it skips the missing ones, which only a run knows).
    """
    tensors = _mac_tensors(node)
    if not tensors:
        return 0
    shapes = [shape_of(name) for name in tensors]
    if any(shape is None for shape in shapes):
        return None
    first, second = shapes
    if node.op_type in INDEXED_CONVS:
        return prod(first[:-1]) * prod(second)
    if node.op_type in ("Conv", "ConvTranspose"):
        return prod(first) * prod(second[1:])
    if node.op_type == "MatMul":
        return prod(first) * second[-1]
    return prod(first) * second[0 if _attribute(node, "transA", 0) else 1]  # Gemm


def tensor_bytes(shape: Shape | None, elem_type: int | None) -> int | None:
    if shape is None or not elem_type:
        return None
    return prod(shape) * helper.tensor_dtype_to_np_dtype(elem_type).itemsize


def total(values) -> int | None:
    """The sum, or None when any part is unknown."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def shapes_after_run(model: onnx.ModelProto, seen: Mapping[str, Shape], types: ValueTypes) -> dict[str, Shape]:
    """Concrete shapes of the values of a segment model, from the shapes a run saw at its inputs,
    outputs and custom-op outputs: ONNX shape inference propagates them through the standard ops.

    Only values ONNX inference cannot see through are observed at run time, because observing a value
    (a `Shape` consumer) can stop onnxruntime from fusing its producer, e.g. MatMul + Add into Gemm,
    which changes the rounding of the results.
    """
    concrete = onnx.ModelProto()
    concrete.CopyFrom(model)
    graph = concrete.graph
    produced_inside = {name for node in graph.node for name in node.output}
    observed = [helper.make_tensor_value_info(name, types.elem_type(name) or 0, None)
                for name in seen if name in produced_inside]
    del graph.value_info[:]
    graph.value_info.extend(observed)
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.name in seen:
            shape = value.type.tensor_type.shape
            shape.Clear()
            for size in seen[value.name]:
                shape.dim.add().dim_value = size
    inferred = onnx.shape_inference.infer_shapes(concrete, strict_mode=False, data_prop=True).graph
    shapes = {}
    for value in (*inferred.input, *inferred.output, *inferred.value_info):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes
