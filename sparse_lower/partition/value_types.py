"""The type oracle: what is known about every value of a model, before anything runs.

Device predicates need element types and shapes (the nna computes on float tensors of static shape),
and every exported segment needs typed inputs and outputs. ONNX shape inference knows nothing of the
`sparse_lower` custom ops, so types behind them come from the model's own `value_info` when the
lowering wrote it, and otherwise from onnxruntime, whose graph resolution runs the custom-op
library's type and shape inference.
"""

from __future__ import annotations

import logging

import onnx
from onnx import TensorProto, helper

from ..model_io import exposing
from ..runtime import create_session

log = logging.getLogger("sparse_lower.partition")

Dim = int | str | None  # a static size, a symbol, or unknown


def _tensor_type(tensor: onnx.TensorProto) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))


def _sparse_tensor_type(tensor: onnx.SparseTensorProto) -> onnx.TypeProto:
    return helper.make_sparse_tensor_type_proto(tensor.values.data_type, list(tensor.dims))


def _knowledge(type_proto: onnx.TypeProto) -> tuple[int, int, int]:
    """How much a type says (element type, rank, static dims): where sources disagree the richer wins."""
    tensor = type_proto.tensor_type if type_proto.HasField("tensor_type") else None
    if tensor is None:
        return (1, 0, 0) if type_proto.WhichOneof("value") else (0, 0, 0)
    has_shape = tensor.HasField("shape")
    static = sum(d.HasField("dim_value") for d in tensor.shape.dim) if has_shape else 0
    return int(tensor.elem_type != 0), int(has_shape), static


class ValueTypes:
    """The known type of each value name: graph inputs and outputs, initializers, the model's
    `value_info`, ONNX shape inference (with data propagation) and, for what none of them knows,
    onnxruntime."""

    def __init__(self, types: dict[str, onnx.TypeProto]):
        self._types = types

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ValueTypes:
        """Everything known about the values of `model`; onnxruntime is asked (one session) only
        about node outputs whose element type or rank nothing else gives."""
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except onnx.shape_inference.InferenceError as error:
            log.debug("ONNX shape inference failed (%s); using the model's own value_info", error)
            inferred = model
        types: dict[str, onnx.TypeProto] = {}

        def learn(name: str, type_proto: onnx.TypeProto) -> None:
            if name and (name not in types or _knowledge(type_proto) > _knowledge(types[name])):
                types[name] = type_proto

        for source in (model.graph, inferred.graph):
            for value in (*source.input, *source.output, *source.value_info):
                learn(value.name, value.type)
        for tensor in model.graph.initializer:
            learn(tensor.name, _tensor_type(tensor))
        for sparse in model.graph.sparse_initializer:
            learn(sparse.values.name, _sparse_tensor_type(sparse))
        unknown = [name for node in model.graph.node for name in node.output
                   if name and (name not in types or _knowledge(types[name])[:2] != (1, 1))]
        if unknown:
            for name, resolved in _onnxruntime_types(model, unknown).items():
                known = types.get(name)
                if known is not None and known.tensor_type.HasField("shape"):
                    resolved.tensor_type.shape.CopyFrom(known.tensor_type.shape)
                if known is None or _knowledge(resolved) > _knowledge(known):
                    types[name] = resolved
        return cls(types)

    def type(self, name: str) -> onnx.TypeProto | None:
        return self._types.get(name)

    def elem_type(self, name: str) -> int | None:
        """The TensorProto element type of a tensor, None where unknown (or not a tensor)."""
        type_proto = self._types.get(name)
        if type_proto is None or not type_proto.HasField("tensor_type"):
            return None
        return type_proto.tensor_type.elem_type or None

    def shape(self, name: str) -> tuple[Dim, ...] | None:
        """The dims of a tensor (int, symbol or None each), None where even the rank is unknown."""
        type_proto = self._types.get(name)
        if type_proto is None or not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
            return None
        return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in type_proto.tensor_type.shape.dim)

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        shape = self.shape(name)
        return shape if shape is not None and all(isinstance(d, int) for d in shape) else None

    def describe(self, name: str) -> str:
        """A value's type as people write it, e.g. `float32[N, 16]`, with `?` for what is unknown."""
        return describe_type(self._types.get(name))


def describe_type(type_proto: onnx.TypeProto | None) -> str:
    """A type as people write it, e.g. `float32[N, 16]` or `int32[1024]`, with `?` for what is unknown."""
    tensor = type_proto.tensor_type if type_proto is not None and type_proto.HasField("tensor_type") else None
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor is not None and tensor.elem_type else "?"
    if tensor is None or not tensor.HasField("shape"):
        return f"{dtype}[?]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    return f"{dtype}[{', '.join(dims)}]"


def _onnxruntime_types(model: onnx.ModelProto, names: list[str]) -> dict[str, onnx.TypeProto]:
    """Tensor types that onnxruntime resolves for `names` when they are made graph outputs.

    A shape comes along only where it has a rank: onnxruntime reports a shape it does not know as
    `[]`, which reads like a scalar. A model onnxruntime cannot load (unlowered `sparse` nodes, no
    library) yields nothing.
    """
    try:
        session = create_session(exposing(model, names))
    except Exception as error:  # onnxruntime's own exception types derive from Exception only
        log.debug("onnxruntime could not resolve the types of %d values: %s", len(names), error)
        return {}
    resolved = {}
    for output in session.get_outputs():
        kind = output.type  # "tensor(float)", "tensor(int64)", "seq(tensor(float))", ...
        if output.name in names and kind.startswith("tensor(") and kind.endswith(")"):
            elem_type = getattr(TensorProto, kind[len("tensor("):-1].upper(), None)
            if isinstance(elem_type, int):
                resolved[output.name] = helper.make_tensor_type_proto(elem_type, output.shape or None)
    return resolved
