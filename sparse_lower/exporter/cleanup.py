"""What `sparse_lower.export` does to the graph torch.onnx wrote (exporter/trace.py): the forms
around the source ops that the trace leaves and the lowering should not see. In order:

1. the engine calls' results that the trace returned after the module's own outputs are no outputs
   (nothing but the trace reads them); Constant nodes become initializers, and each source op is named after its module
   (spconv_calls.NAME_ATTRIBUTE);
2. `Coalesce`: VoxelNeXt's merge of the rows that share a site, `u, inv = torch.unique(c, dim=0,
   return_inverse=True)`, `y = f.new_zeros(...)`, `y.index_add_(0, inv, f)`, is written by torch.onnx as
   `Unique` and a `ScatterElements` (reduction "add") of f into zeros by inv. Where `u` becomes the
   indices of a SparseConvTensor, whose declared grid bounds the sites (the `Grid` mark), the pair is
   `Coalesce(f, c, reduction="sum")`: y its features, u its coords (sorted, as torch.unique's). Where it
   does not, the standard ops stay (onnxruntime computes them);
3. the `Grid` marks are removed, and a `Unique` of int32 values (spconv's indices) reads them as int64,
   which onnxruntime's Unique takes (it has no int32 kernel);
4. Cast pairs that cancel: coordinates are int64 in the graph and int32 in spconv, so a value cast to
   int32 and back (`coords.int()` into a source op, a source op's coords to `.long()`) is read as it was;
5. a `BatchNormalization` that alone reads a conv's features is folded into the conv's weight and bias
   (along the output-channel axis: 0 for SubmanifoldConv / SparseConv, 1 for SparseDeconv); any other
   batch norm stays;
6. the graph outputs get their names (trace.py's), unused nodes go, the rest is sorted.

Pre: the model torch.onnx wrote with spconv_calls's symbolics. Post: only standard and source ops.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from ..names import UniqueNames
from ..onnx_conventions import SOURCE_DOMAIN
from .traced_calls import EXPORT_DOMAIN, NAME_ATTRIBUTE

_DECONV = "SparseDeconv"
_CONVS = ("SubmanifoldConv", "SparseConv", _DECONV)


def cleaned(model: onnx.ModelProto, output_names: list[str]) -> onnx.ModelProto:
    """The exported `model` with the steps of the module docstring applied."""
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(model))  # the element types Cast and Unique need
    graph.outputs = graph.outputs[:len(output_names)]  # the engine calls' results kept for the trace go
    _constants_to_initializers(graph)
    _name_source_ops(graph)
    bounds = _grid_bounds(graph)
    _coalesce(graph, bounds)
    _remove_grid_marks(graph)
    _unique_on_int64(graph)
    _cancel_cast_pairs(graph)
    _fold_batch_norms(graph)
    _name_outputs(graph, output_names)
    graph.cleanup().toposort()
    result = gs.export_onnx(graph, do_type_check=False)
    kept = [op for op in result.opset_import if op.domain != EXPORT_DOMAIN]
    del result.opset_import[:]
    result.opset_import.extend(kept)
    return result


def _producer(tensor):
    return tensor.inputs[0] if tensor.inputs else None


def _is_source(node, op_types=None) -> bool:
    return node is not None and node.domain == SOURCE_DOMAIN and (op_types is None or node.op in op_types)


def _constants_to_initializers(graph: gs.Graph) -> None:
    for node in graph.nodes:
        if node.op == "Constant" and "value" in node.attrs:
            values = node.attrs["value"].values
            output = node.outputs[0]
            node.outputs.clear()
            output.to_constant(np.asarray(values))


def _name_source_ops(graph: gs.Graph) -> None:
    names = UniqueNames()
    for node in graph.nodes:
        if node.domain == SOURCE_DOMAIN and NAME_ATTRIBUTE in node.attrs:
            node.name = names.fresh(node.attrs.pop(NAME_ATTRIBUTE))


def _grid_bounds(graph: gs.Graph) -> dict[str, list[int]]:
    """Tensor name -> the grid declared for it by a Grid mark downstream (through Casts)."""
    bounds = {}
    for node in graph.nodes:
        if node.domain == EXPORT_DOMAIN and node.op == "Grid":
            producer, index = _upstream(node.inputs[0], ("Cast",))
            if producer is not None:  # the tensor before the Casts: an output of its producer
                bounds[producer.outputs[index].name] = list(node.attrs["spatial_shape"])
    return bounds


def _upstream(tensor, op_types: tuple[str, ...]):
    """The producer of `tensor` past any of `op_types`, with the output index it came from."""
    node = _producer(tensor)
    while node is not None and node.op in op_types:
        tensor = node.inputs[0]
        node = _producer(tensor)
    return node, (node.outputs.index(tensor) if node is not None else None)


def _is_zeros(tensor) -> bool:
    node = _producer(tensor)
    if node is None or node.op != "ConstantOfShape":
        return False
    value = node.attrs.get("value")
    return value is None or not np.any(value.values)


def _coalesce(graph: gs.Graph, bounds: dict) -> None:
    for scatter in [n for n in graph.nodes if n.op == "ScatterElements"]:
        if (scatter.attrs.get("reduction") != "add" or scatter.attrs.get("axis", 0) != 0
                or not _is_zeros(scatter.inputs[0])):
            continue
        unique, index = _upstream(scatter.inputs[1], ("Expand", "Unsqueeze", "Cast"))
        if unique is None or unique.op != "Unique" or index != 2 or unique.attrs.get("axis") != 0:
            continue
        sites = unique.outputs[0]
        bound = bounds.get(sites.name)
        if bound is None:
            continue
        coords = unique.inputs[0]
        if coords.dtype != np.int64:
            coords = _cast(graph, coords, onnx.TensorProto.INT64)
        merged = scatter.outputs[0]
        scatter.outputs.clear()
        merged_coords = gs.Variable(_fresh(graph, f"{merged.name}.coords"), np.int64)
        graph.nodes.append(gs.Node("Coalesce", name=f"Coalesce_{merged.name}", domain=SOURCE_DOMAIN,
                                   attrs={"spatial_shape": bound, "reduction": "sum"},
                                   inputs=[scatter.inputs[2], coords], outputs=[merged, merged_coords]))
        unique.outputs[0] = gs.Variable(_fresh(graph, f"{sites.name}.unread"))
        dtype = helper.np_dtype_to_tensor_dtype(np.dtype(sites.dtype)) if sites.dtype is not None else 6
        graph.nodes.append(gs.Node("Cast", attrs={"to": dtype}, inputs=[merged_coords], outputs=[sites]))


def _fresh(graph: gs.Graph, base: str) -> str:
    return UniqueNames(graph.tensors()).fresh(base)


def _cast(graph: gs.Graph, tensor, to: int):
    out = gs.Variable(_fresh(graph, f"{tensor.name}.cast{to}"), helper.tensor_dtype_to_np_dtype(to))
    graph.nodes.append(gs.Node("Cast", attrs={"to": to}, inputs=[tensor], outputs=[out]))
    return out


def _replace_uses(graph: gs.Graph, old, new) -> None:
    """Every reader of `old` reads `new`; a graph output `old` becomes `new` (renamed in _name_outputs)."""
    for node in list(old.outputs):
        for position, tensor in enumerate(node.inputs):
            if tensor is old:
                node.inputs[position] = new
    graph.outputs = [new if t is old else t for t in graph.outputs]


def _remove_grid_marks(graph: gs.Graph) -> None:
    for node in [n for n in graph.nodes if n.domain == EXPORT_DOMAIN]:
        _replace_uses(graph, node.outputs[0], node.inputs[0])
        node.outputs.clear()


def _unique_on_int64(graph: gs.Graph) -> None:
    for node in [n for n in graph.nodes if n.op == "Unique" and n.inputs[0].dtype == np.int32]:
        node.inputs[0] = _cast(graph, node.inputs[0], onnx.TensorProto.INT64)
        values = node.outputs[0]
        node.outputs[0] = gs.Variable(_fresh(graph, f"{values.name}.int64"), np.int64)
        graph.nodes.append(gs.Node("Cast", attrs={"to": onnx.TensorProto.INT32}, inputs=[node.outputs[0]],
                                   outputs=[values]))


def _is_int64(tensor) -> bool:
    node = _producer(tensor)
    return (tensor.dtype == np.int64 or (node is not None and node.op == "Cast" and node.attrs["to"] == 7)
            or (_is_source(node) and node.outputs.index(tensor) == 1))


def _cancel_cast_pairs(graph: gs.Graph) -> None:
    for node in graph.nodes:
        if node.op != "Cast" or node.attrs["to"] != onnx.TensorProto.INT64 or not node.outputs:
            continue
        inner = _producer(node.inputs[0])
        if inner is not None and inner.op == "Cast" and inner.attrs["to"] == onnx.TensorProto.INT32 \
                and _is_int64(inner.inputs[0]):
            _replace_uses(graph, node.outputs[0], inner.inputs[0])
        elif _is_int64(node.inputs[0]):
            _replace_uses(graph, node.outputs[0], node.inputs[0])


def _fold_batch_norms(graph: gs.Graph) -> None:
    for norm in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        conv = _producer(norm.inputs[0])
        if not _is_source(conv, _CONVS) or len(norm.inputs[0].outputs) != 1 or norm.inputs[0] in graph.outputs:
            continue
        if not all(isinstance(t, gs.Constant) for t in [*conv.inputs[2:4], *norm.inputs[1:5]]):
            continue
        weight, bias = (_own_constant(conv, position) for position in (2, 3))
        gamma, beta, mean, var = (t.values.astype(np.float64) for t in norm.inputs[1:5])
        scale = gamma / np.sqrt(var + norm.attrs.get("epsilon", 1e-5))
        axis = 1 if conv.op == _DECONV else 0
        shape = [1] * weight.values.ndim
        shape[axis] = -1
        weight.values = (weight.values * scale.reshape(shape)).astype(np.float32)
        bias.values = ((bias.values - mean) * scale + beta).astype(np.float32)
        _replace_uses(graph, norm.outputs[0], norm.inputs[0])
        norm.outputs.clear()


def _own_constant(node, position: int) -> gs.Constant:
    """The constant input `position` of `node`, copied where another node reads it too (torch.onnx pools
    equal constants, such as the zero biases of two convs)."""
    constant = node.inputs[position]
    if len(constant.outputs) > 1:
        constant = node.inputs[position] = gs.Constant(f"{node.name}.{position}", np.array(constant.values))
    return constant


def _name_outputs(graph: gs.Graph, names: list[str]) -> None:
    """The graph outputs named `names`, in order; an Identity where a tensor is an input or another output."""
    inputs = set(id(t) for t in graph.inputs)
    seen = set()
    for position, (tensor, name) in enumerate(zip(list(graph.outputs), names)):
        if id(tensor) in inputs or id(tensor) in seen or isinstance(tensor, gs.Constant):
            copy = gs.Variable(name, tensor.dtype, tensor.shape)
            graph.nodes.append(gs.Node("Identity", inputs=[tensor], outputs=[copy]))
            tensor = graph.outputs[position] = copy
        tensor.name = name
        seen.add(id(tensor))
