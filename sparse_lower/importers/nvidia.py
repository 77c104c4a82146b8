"""NVIDIA Lidar_AI_Solution (libspconv, CUDA-CenterPoint, CUDA-BEVFusion): the de-facto format.

`SparseConvolution` in the default domain with inputs `(features, W[, B])`, `ScatterDense(features)`,
and no coordinates anywhere in the graph: the engine receives int32 `[N, 1 + D]` indices at run time
(batch first, then the spatial dimensions in the order of `input_spatial_shape`). The imported model
therefore gets an int64 input `coords [N, 1 + D]` in that order, beside the unchanged feature input.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ..errors import SparseLowerError
from .context import SparseTensor, Translation
from .translate import STANDARD_DOMAINS, Operands, Reader, input_channels

COORDS = "coords"


def _arity(node: onnx.NodeProto, where: str, low: int, high: int, inputs: str) -> list[str]:
    if not low <= len(node.input) <= high or len(node.output) != 1:
        raise SparseLowerError(f"{node.op_type} takes inputs ({inputs}) and one output, got {len(node.input)} "
                               f"inputs and {len(node.output)} outputs", where, "export the node as libspconv does")
    return list(node.input) + [""] * (high - len(node.input))


class NvidiaFormat:
    key = "nvidia"
    title = "NVIDIA Lidar_AI_Solution (libspconv)"
    domains: tuple[str, ...] = ()

    def is_conv(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "SparseConvolution" and node.domain in STANDARD_DOMAINS

    def is_scatter_dense(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "ScatterDense" and node.domain in STANDARD_DOMAINS

    def operands(self, node: onnx.NodeProto, where: str) -> Operands:
        if self.is_scatter_dense(node):
            return Operands(_arity(node, where, 1, 1, "features")[0])
        features, weight, bias = _arity(node, where, 2, 3, "features, W, B?")
        return Operands(features, weight, bias or None)

    def indices_output(self, node: onnx.NodeProto, where: str) -> None:
        return None

    def declare_inputs(self, t: Translation, readers: dict[str, Reader]) -> None:
        """The feature input stays; `coords` is added, its row count the same dimension as the features'."""
        if len(readers) > 1:
            raise SparseLowerError(f"{len(readers)} graph inputs ({', '.join(sorted(readers))}) are sparse "
                                   f"features, but the format has one set of run-time indices",
                                   fix="export one sparse input per model")
        for name, reader in readers.items():
            if t.taken(COORDS):
                raise SparseLowerError(f"the graph already has a tensor named '{COORDS}'", reader.where,
                                       f"rename it: the imported model's coordinates input is '{COORDS}'")
            value = next(v for v in t.inputs if v.name == name)
            rows = value.type.tensor_type.shape.dim[0] if value.type.tensor_type.shape.dim else None
            coords = helper.make_tensor_value_info(COORDS, TensorProto.INT64, [None, 1 + len(reader.spatial_shape)])
            if rows is not None:
                coords.type.tensor_type.shape.dim[0].CopyFrom(rows)
            t.inputs.append(coords)
            x = SparseTensor(COORDS, reader.spatial_shape, input_channels(t, name, reader), root=COORDS)
            t.add_sparse_input(name, COORDS, x)
