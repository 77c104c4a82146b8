"""An accelerator segment in the form a toolchain takes (pre: a segment model written by the
partitioner; post: the same computation, with the index inputs in the toolchain's integer width).

Index inputs (the gather columns and scatter targets the host segment computes) are int64 in the
lowered graph. Toolchains take int32 indices and run int64 tensors on a fallback unit or not at all
(rknn-toolkit2 places every int64 input on its CPU), so an input read only as the indices of a
`Gather` or `Scatter*` is declared int32 and the runner narrows it on the host, where a value that does
not fit is an error rather than a wrapped index.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import SparseLowerError

# op -> the input positions that are indices (int32 or int64 in the ONNX standard)
_INDEX_INPUTS = {"Gather": {1}, "GatherElements": {1}, "ScatterElements": {1}}


def narrowable_inputs(model: onnx.ModelProto) -> list[str]:
    """The int64 graph inputs that only Gather/ScatterElements read, as their indices."""
    readers: dict[str, list[tuple[str, int]]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node.op_type, position))
    return [value.name for value in model.graph.input
            if value.type.tensor_type.elem_type == TensorProto.INT64 and readers.get(value.name)
            and all(position in _INDEX_INPUTS.get(op, ()) for op, position in readers[value.name])]


def prepare(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose index inputs are declared int32 (every toolchain here takes them)."""
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    narrow = set(narrowable_inputs(prepared))
    for value in prepared.graph.input:
        if value.name in narrow:
            value.type.tensor_type.elem_type = TensorProto.INT32
    onnx.checker.check_model(prepared)
    return prepared


def fed(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs in the element types `model` declares: float as float32, int64 narrowed where declared
    int32 (refused when a value does not fit)."""
    result = {}
    for value in model.graph.input:
        array = np.asarray(inputs[value.name])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if dtype == np.int32 and array.dtype != np.int32 and array.size:
            low, high = int(array.min()), int(array.max())
            if low < np.iinfo(np.int32).min or high > np.iinfo(np.int32).max:
                raise SparseLowerError(f"index input '{value.name}' holds {low}..{high}, outside int32",
                                       fix="lower with a smaller max_active")
        # np.dtype(...) and not the array's own: some runtimes refuse numpy's longlong spelling of int64
        result[value.name] = np.ascontiguousarray(array, dtype=np.dtype(dtype.name))
    return result
