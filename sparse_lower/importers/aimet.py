"""Qualcomm AIMET / QNN: spconv's attributes on `spconv::SparseConvolution(indices, features, W[, B])`.

The coordinates are in the graph, as an int32 input `indices [N, 1 + D]` (batch first, then the spatial
dimensions in the order of `input_spatial_shape`). The imported model keeps that input under its own
name and makes it int64 (DESIGN.md §2 coords; a caller holding int32 indices casts them once, outside
the model), so that its inputs are exactly the section-3 pair the rest of sparse_lower expects.

The indices input of a later node must be the coordinates its features sit on (the second output of
the conv that produced them, where the conv has one) or the network's input indices (an exporter that
passes those to every layer leaves each layer's own coordinates implied, as NVIDIA's engine does);
anything else contradicts the graph and is refused. Every conv's output is sparse features.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ..errors import SparseLowerError
from .context import SparseTensor, Translation
from .translate import STANDARD_DOMAINS, Operands, Reader, input_channels

DOMAIN = "spconv"


class AimetFormat:
    key = "aimet"
    title = "Qualcomm AIMET/QNN (spconv domain)"
    domains = (DOMAIN,)

    def is_conv(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "SparseConvolution" and node.domain == DOMAIN

    def is_scatter_dense(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "ScatterDense" and node.domain in (DOMAIN, *STANDARD_DOMAINS)

    def operands(self, node: onnx.NodeProto, where: str) -> Operands:
        inputs = list(node.input)
        if self.is_scatter_dense(node):
            if len(inputs) not in (1, 2) or len(node.output) != 1:
                raise SparseLowerError(f"ScatterDense takes (indices?, features) and one output, got "
                                       f"{len(inputs)} inputs", where, "export the node as AIMET does")
            return Operands(inputs[-1], indices=inputs[0] if len(inputs) == 2 else None)
        if len(inputs) not in (3, 4) or len(node.output) not in (1, 2):
            raise SparseLowerError(f"SparseConvolution takes (indices, features, W, B?) and 1 or 2 outputs, got "
                                   f"{len(inputs)} inputs and {len(node.output)} outputs", where,
                                   "export the node as AIMET does")
        return Operands(inputs[1], inputs[2], inputs[3] if len(inputs) == 4 and inputs[3] else None, inputs[0])

    def indices_output(self, node: onnx.NodeProto, where: str) -> str | None:
        return node.output[1] if len(node.output) == 2 and node.output[1] else None

    def declare_inputs(self, t: Translation, readers: dict[str, Reader]) -> None:
        graph_inputs = {v.name: position for position, v in enumerate(t.inputs)}
        for name, reader in readers.items():
            indices = reader.operands.indices
            if indices not in graph_inputs:
                raise SparseLowerError(f"the features '{name}' are a graph input but their indices "
                                       f"{f'{indices!r} are' if indices else 'are'} not", reader.where,
                                       "give the indices of the sparse input as a graph input")
            value = t.inputs[graph_inputs[indices]]
            _make_int64_coords(value, len(reader.spatial_shape), reader.where)
            x = SparseTensor(indices, reader.spatial_shape, input_channels(t, name, reader), root=indices)
            t.add_sparse_input(name, indices, x)


def _make_int64_coords(value: onnx.ValueInfoProto, ndim: int, where: str) -> None:
    tensor_type = value.type.tensor_type
    if tensor_type.elem_type not in (TensorProto.INT32, TensorProto.INT64):
        raise SparseLowerError(f"the indices '{value.name}' are not integers", where,
                               f"declare them int32 or int64 [N, {1 + ndim}]")
    dims = tensor_type.shape.dim
    if tensor_type.HasField("shape") and (len(dims) != 2 or dims[1].HasField("dim_value")
                                          and dims[1].dim_value != 1 + ndim):
        raise SparseLowerError(f"the indices '{value.name}' are not [N, {1 + ndim}]", where,
                               f"declare them [N, {1 + ndim}] (batch, then {ndim} spatial indices)")
    tensor_type.elem_type = TensorProto.INT64
