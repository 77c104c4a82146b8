"""What the standard ops of a foreign graph compute before run time, found by running them: which graph
input a format's coordinates come from, and the value of a weight computed from constants.

Autoware's graphs build the int32 indices of their first kernel-map op from the `coors` input inside
the graph (AWML flips (z, y, x) to (x, y, z) and prepends a zero batch column; autoware-ml prepends the
zeros and gathers (y, x, z)). Rather than recognise each spelling, the subgraph that computes the
indices is run (onnx's reference evaluator) on a probe whose every integer is distinct, and each
indices column is matched to the input column it equals.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

_INTEGERS = (onnx.TensorProto.INT32, onnx.TensorProto.INT64)
_PROBE_ROWS = 3


def _ancestors(graph: onnx.GraphProto, name: str) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes `name` is computed by (in graph order) and the tensors they read from outside."""
    producer = {out: node for node in graph.node for out in node.output}
    needed, wanted, nodes = set(), [name], []
    while wanted:
        tensor = wanted.pop()
        node = producer.get(tensor)
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        wanted.extend(i for i in node.input if i)
    nodes = [node for node in graph.node if id(node) in needed]
    produced = {out for node in nodes for out in node.output}
    return nodes, {i for node in nodes for i in node.input if i and i not in produced}


def _probe(value: onnx.ValueInfoProto) -> np.ndarray | None:
    """A probe for a graph input: distinct integers for an integer matrix, zeros otherwise."""
    tensor_type = value.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else _PROBE_ROWS for d in tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    if tensor_type.elem_type in _INTEGERS and len(shape) == 2:
        return (1 + np.arange(int(np.prod(shape)))).reshape(shape).astype(dtype)
    return np.zeros(shape, dtype)


def folded_constant(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of `name` where standard ops compute it from constants alone (initializers and Constant
    nodes): a weight or bias that an exporter or a tool passed through Identity, Cast, Reshape,
    Transpose, DequantizeLinear…, as torch.onnx does with equal initializers it stores once. None where
    it depends on a graph input, on a node of another domain, or the evaluator cannot run it."""
    graph = model.graph
    nodes, outside = _ancestors(graph, name)
    initializers = {t.name: t for t in graph.initializer}
    if not nodes or not outside <= set(initializers) or any(n.domain not in ("", "ai.onnx") for n in nodes):
        return None
    sub = onnx.helper.make_graph(nodes, "constant", [],
                                 [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)],
                                 [initializers[n] for n in sorted(outside)])
    try:
        (value,) = ReferenceEvaluator(onnx.helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})
    except Exception:  # anything the evaluator cannot run is no constant this import can vouch for
        return None
    return np.asarray(value)


def coordinate_columns(model: onnx.ModelProto, indices: str) -> tuple[str, list[int]] | None:
    """(the graph input the `indices` [N, 1 + D] are computed from, and for each of its columns the
    spatial axis it becomes, -1 for a batch column), or None when the indices are not a reordering of
    one integer input's columns beside a zero batch column."""
    graph = model.graph
    inputs = {v.name: v for v in graph.input}
    if indices in inputs:  # read as they come: batch, then the spatial axes in order
        dims = inputs[indices].type.tensor_type.shape.dim
        width = dims[1].dim_value if len(dims) == 2 and dims[1].HasField("dim_value") else 0
        return (indices, [-1, *range(width - 1)]) if width >= 2 else None
    nodes, outside = _ancestors(graph, indices)
    initializers = {t.name: t for t in graph.initializer if t.name in outside}
    if not nodes or not outside - set(initializers) <= set(inputs):
        return None
    feeds = {name: _probe(inputs[name]) for name in outside - set(initializers)}
    sub = onnx.helper.make_graph(nodes, "probe", [inputs[n] for n in feeds],
                                 [onnx.helper.make_tensor_value_info(indices, onnx.TensorProto.UNDEFINED, None)],
                                 list(initializers.values()))
    try:
        (result,) = ReferenceEvaluator(onnx.helper.make_model(sub, opset_imports=model.opset_import)).run(None, feeds)
    except Exception:  # anything the evaluator cannot run: the columns stay undescribed
        return None
    sources = [(name, value) for name, value in feeds.items() if value.dtype.kind == "i" and value.ndim == 2]
    if result.ndim != 2 or len(sources) != 1 or result.shape[0] != _PROBE_ROWS:
        return None
    name, value = sources[0]
    mapping = [-1] * value.shape[1]
    for column in range(1, result.shape[1]):
        matches = [c for c in range(value.shape[1]) if np.array_equal(result[:, column], value[:, c])]
        if len(matches) != 1:
            return None
        mapping[matches[0]] = column - 1
    batch_is_a_column = any(np.array_equal(result[:, 0], value[:, c]) for c in range(value.shape[1]))
    if not np.all(result[:, 0] == 0) and not batch_is_a_column:
        return None
    for c in range(value.shape[1]):
        if mapping[c] == -1 and not np.array_equal(result[:, 0], value[:, c]):
            return None
    return name, mapping
