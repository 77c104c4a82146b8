"""Qualcomm AIMET's spconv export (aimet_torch `_base/nn/modules/_spconv.py`), read by QNN's converter.

What AIMET's exporter writes (torch.onnx, opsets ("", 16) and ("spconv", 1)):

* `SparseTensorWrapper(indices, features)` is traced as the identity: the graph inputs are the int32
  `indices [N, 4]` (batch, then the spatial axes) and the float32 `features [N, C]`;
* the first `CustomSparseConv3DLayer` becomes `spconv::SparseConvolution(indices, features, W, B)`;
  every later one `spconv::SparseConvolution(x, W, B)`, x the previous layer's output, which the
  exporter declares dense NCDHW (during tracing PyTorch runs a dense Conv3d in the layer's place);
  the bias is always there (zeros for a layer built without one); weights are KRSC;
* each layer wraps a regular `spconv.SparseConv3d`; attributes whose value is 0, False or empty are
  not written, so `subm=0`, `transposed=0` and `inverse=0` never appear, while lists always are;
  `rulebook` is "subm0" or "subm1" from the subm flag, not an indice key; the first layer's
  `input_spatial_shape` is the per-column maximum + 1 of the traced indices;
* `spconv::ScatterDense(x)` (format "xyz", the identity in PyTorch) closes the chain.

The import reads the chain as the sparse network it wraps: SparseConv3d after SparseConv3d on the
sparse rows, then spconv's `.dense()`. A missing `subm` is AIMET's 0, a regular conv, and `rulebook`
("subm0"/"subm1") confirms it; QNN's converter reads a missing `subm` as 1, which for a conv of stride
1 is a submanifold conv (another network), so that case is noted. A strided conv cannot be
submanifold, so there the writer's reading is the only one. A conv of one tap (stride 1) is read as
the wrapped spconv module runs it, its weight memory as the matrix [Cin, Cout]; QNN's converter
multiplies by the weight as declared, so that case is noted too. AIMET's own eager forward densifies
between layers (a bias lands on every site of the grid); the import follows the sparse network, which
QNN runs. The indices input keeps its name and becomes int64 (a caller holding int32 indices casts them
once, outside the model).
"""

from __future__ import annotations

import copy
import re

import onnx
from onnx import TensorProto

from ..errors import SparseLowerError
from .context import SparseTensor, Translation
from .spconv_layers import flag
from .translate import Operands, Reader, input_channels, input_grid, translate

DOMAIN = "spconv"
_RULEBOOK_SUBM = re.compile(r"subm([01])")
_FLOATS = (TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


class AimetFormat:
    key = "aimet"
    title = "Qualcomm AIMET/QNN (spconv domain)"
    engine = "QNN"
    signature = "spconv::SparseConvolution"  # what `nothing_to_lower` lists
    domains = (DOMAIN,)
    reads_coords_order = False  # AIMET writes format "xyz" whatever the axes are
    rulebook_is_key = False  # AIMET writes "subm<flag>" there
    one_tap_note = ("a one-tap conv: read as the spconv module AIMET wraps runs it (its weight memory as the "
                    "matrix [Cin, Cout]); QNN's converter multiplies by the weight as declared [Cout, 1, 1, 1, Cin], "
                    "which computes another layer unless that matrix is symmetric")

    def translate(self, model: onnx.ModelProto, widened: list[str], leaky_relu_alpha: float | None) -> onnx.ModelProto:
        return translate(self._input_casts_dropped(model), widened, self, leaky_relu_alpha)

    def _input_casts_dropped(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """`model` without the Casts between a graph input and the first layer's indices or features slot.

        A user's forward that calls `indices.int()` or `features.float()` before AIMET's wrapper traces
        them as Casts, and the first layer then reads no graph input. The import reads indices as int64
        and features as float32 whatever they were, so those Casts say nothing: the layer reads the graph
        input itself, which is declared int64 / float32 like every imported input. A Cast that anything
        else reads stays (and the layer is refused, naming it)."""
        graph_inputs = {value.name for value in model.graph.input}
        casts = {node.output[0]: node for node in model.graph.node
                 if node.op_type == "Cast" and node.domain == "" and node.input[0] in graph_inputs}
        readers = {name: [(node, slot) for node in model.graph.node for slot, used in enumerate(node.input)
                          if used == name] for name in casts}
        outputs = {value.name for value in model.graph.output}
        constants = {tensor.name for tensor in model.graph.initializer}
        dropped = {name for name, uses in readers.items() if uses and name not in outputs and all(
            self.is_conv(node) and slot < 2 and len(node.input) >= 3 and node.input[1] not in constants
            for node, slot in uses)}
        if not dropped:
            return model
        model = copy.deepcopy(model)
        kept = [node for node in model.graph.node if not (node.op_type == "Cast" and node.output[0] in dropped)]
        for node in kept:
            node.input[:] = [casts[name].input[0] if name in dropped else name for name in node.input]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        for value in model.graph.input:
            if value.name in {casts[name].input[0] for name in dropped}:
                kind = value.type.tensor_type.elem_type
                value.type.tensor_type.elem_type = TensorProto.FLOAT if kind in _FLOATS else kind
        return model

    def is_conv(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "SparseConvolution" and node.domain == DOMAIN

    def is_scatter_dense(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "ScatterDense" and node.domain == DOMAIN

    def operands(self, node: onnx.NodeProto, where: str, t: Translation) -> Operands:
        inputs = list(node.input)
        if self.is_scatter_dense(node):
            if len(inputs) != 1 or len(node.output) != 1:
                raise SparseLowerError(f"ScatterDense takes (x) and one output, got {len(inputs)} inputs and "
                                       f"{len(node.output)} outputs", where, "export the node as AIMET does")
            return Operands(inputs[0])
        if not 2 <= len(inputs) <= 4 or len(node.output) != 1:
            raise SparseLowerError(f"SparseConvolution takes (indices, features, W, B) or (x, W, B) and one output, "
                                   f"got {len(inputs)} inputs and {len(node.output)} outputs", where,
                                   "export the node as AIMET does")
        if len(inputs) == 4 or (len(inputs) == 3 and not t.is_constant(inputs[1])):
            if inputs[1] not in {value.name for value in t.inputs}:
                raise SparseLowerError(f"it takes indices '{inputs[0]}' with features '{inputs[1]}' that are not a "
                                       f"graph input: AIMET writes (indices, features, W, B) only on the layer that "
                                       f"reads the network's input, and (x, W, B) on every later one", where,
                                       "export the model with AIMET's layers, each later layer taking the previous "
                                       "layer's output alone")
            return Operands(inputs[1], inputs[2], inputs[3] if len(inputs) == 4 and inputs[3] else None, inputs[0])
        return Operands(inputs[0], inputs[1], inputs[2] if len(inputs) == 3 and inputs[2] else None)

    def subm(self, present: dict, stride: tuple[int, ...], where: str, t: Translation) -> bool:
        """AIMET leaves subm=0 out and writes `rulebook` "subm<flag>"; QNN reads a missing subm as 1."""
        rulebook = _RULEBOOK_SUBM.fullmatch(str(present.get("rulebook", "")))
        said = bool(int(rulebook.group(1))) if rulebook else None
        if "subm" in present:
            subm = flag(where, "subm", present["subm"])
            if said is not None and said != subm:
                raise SparseLowerError(f"subm={int(subm)} contradicts rulebook='{present['rulebook']}', which AIMET "
                                       f"writes from the same flag", where, "export the layer again")
            return subm
        if said:
            raise SparseLowerError("rulebook='subm1' says the layer is submanifold, but subm is not written, which "
                                   "AIMET's exporter does only for subm=0", where, "write subm=1, or export again")
        if all(s == 1 for s in stride):
            t.note(where, "subm is not written: read as AIMET writes it, 0 (a regular SparseConv3d, which "
                          "AIMET's layer wraps); QNN's converter reads a missing subm as 1 and would run a "
                          "submanifold conv here")
        return False

    def declare_inputs(self, t: Translation, readers: dict[str, Reader]) -> None:
        graph_inputs = {v.name: position for position, v in enumerate(t.inputs)}
        rows = "N" if len(readers) == 1 else None
        for name, reader in readers.items():
            indices = reader.operands.indices
            if indices is None:
                raise SparseLowerError(f"the graph input '{name}' is read without indices: AIMET's dense-input form "
                                       f"(a dense NCDHW input, every site of which is active) is a dense Conv3d, "
                                       f"not a sparse layer", reader.where,
                                       "trace the model with SparseTensorWrapper(indices, features)")
            if indices not in graph_inputs:
                raise SparseLowerError(f"the features '{name}' are a graph input but their indices "
                                       f"{f'{indices!r} are' if indices else 'are'} not", reader.where,
                                       "give the indices of the sparse input as a graph input")
            grid = input_grid(reader, name)
            _make_int64_coords(t.inputs[graph_inputs[indices]], len(grid), reader.where)
            x = SparseTensor(indices, grid, input_channels(t, name), root=indices)
            t.add_sparse_input(name, indices, x, rows or f"N_{name}")


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
