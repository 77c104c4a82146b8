"""NVIDIA Lidar_AI_Solution (libspconv, CUDA-CenterPoint, CUDA-BEVFusion): the de-facto format.

What its exporters (`tool/{centerpoint,bevfusion}-export/exptool.py`, the QAT `exptool.py`s) write
with `onnx.helper`, and what libspconv's `parser/onnx-parser.cpp` reads:

* `SparseConvolution(features, W, B)` in the default domain (spelled "ai.onnx" in
  `opset_import = [("ai.onnx", 11)]`), FP16 raw initializers, KRSC weights; `Add` (also `QuantAdd`),
  `Relu`, `ScatterDense`, and `Reshape` / `Transpose` with a non-standard `dims` attribute;
* no coordinates anywhere in the graph: the engine receives int32 `[N, 1 + D]` indices at run time,
  batch first, then the spatial axes in the order the export variant uses (CenterPoint and BEVFusion's
  default: z, y, x; BEVFusion's `--origin` export: x, y, z; `ScatterDense`'s `format` names it). The
  imported model therefore gets an int64 input `coords [N, 1 + D]` in that order, beside the
  unchanged feature input;
* the graph input "0" and the output declare the traced frame's shapes (its N frozen in): the imported
  model's row counts are symbolic;
* the INT8 (PTQ/QAT) export adds `input_dynamic_range`, `weight_dynamic_ranges`, `precision` and
  `output_precision` to convs, the same ranges to `Add`/`QuantAdd`, and `ScatterDense` may carry
  `input_dynamic_range` and `output_layout`. The import computes in float32 from the stored weights and
  keeps the ranges in the model's metadata.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ..errors import SparseLowerError
from .context import SparseTensor, Translation
from .spconv_layers import flag
from .translate import Operands, Reader, input_channels, input_grid, translate

COORDS = "coords"


def _arity(node: onnx.NodeProto, where: str, low: int, high: int, inputs: str) -> list[str]:
    if not low <= len(node.input) <= high or len(node.output) != 1:
        raise SparseLowerError(f"{node.op_type} takes inputs ({inputs}) and one output, got {len(node.input)} "
                               f"inputs and {len(node.output)} outputs", where, "export the node as libspconv does")
    return list(node.input) + [""] * (high - len(node.input))


class NvidiaFormat:
    key = "nvidia"
    title = "NVIDIA Lidar_AI_Solution (libspconv)"
    engine = "libspconv"
    signature = "SparseConvolution in the default domain"  # what `nothing_to_lower` lists
    domains: tuple[str, ...] = ()
    reads_coords_order = True  # ScatterDense's `format` names the coordinate columns
    rulebook_is_key = True
    one_tap_note = ""  # the file holds the module's weight memory, read as spconv runs it (no other reader is public)

    def translate(self, model: onnx.ModelProto, widened: list[str], leaky_relu_alpha: float | None) -> onnx.ModelProto:
        return translate(model, widened, self, leaky_relu_alpha)

    def is_conv(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "SparseConvolution" and node.domain == ""

    def is_scatter_dense(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "ScatterDense" and node.domain == ""

    def operands(self, node: onnx.NodeProto, where: str, t: Translation) -> Operands:
        if self.is_scatter_dense(node):
            return Operands(_arity(node, where, 1, 1, "features")[0])
        features, weight, bias = _arity(node, where, 2, 3, "features, W, B?")
        return Operands(features, weight, bias or None)

    def subm(self, present: dict, stride: tuple[int, ...], where: str, t: Translation) -> bool:
        return flag(where, "subm", present.get("subm", 0))  # libspconv reads a missing flag as 0

    def declare_inputs(self, t: Translation, readers: dict[str, Reader]) -> None:
        """The feature input stays; `coords` is added, its row count the same symbol as the features'."""
        if len(readers) > 1:
            raise SparseLowerError(f"{len(readers)} graph inputs ({', '.join(sorted(readers))}) are sparse "
                                   f"features, but the format has one set of run-time indices",
                                   fix="export one sparse input per model")
        for name, reader in readers.items():
            if t.taken(COORDS):
                raise SparseLowerError(f"the graph already has a tensor named '{COORDS}'", reader.where,
                                       f"rename it: the imported model's coordinates input is '{COORDS}'")
            grid = input_grid(reader, name)
            t.inputs.append(helper.make_tensor_value_info(COORDS, TensorProto.INT64, ["N", 1 + len(grid)]))
            t.add_sparse_input(name, COORDS, SparseTensor(COORDS, grid, input_channels(t, name), root=COORDS), "N")
