"""Small graph-edit helpers on top of onnx-graphsurgeon, shared by every lowering rule."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..onnx_conventions import IR_VERSION


@contextmanager
def deep_graph(graph: gs.Graph):
    """Room for onnx-graphsurgeon's `cleanup` and `toposort`, which recurse once per level of the graph
    (two Python frames a level): a lowered backbone with a row capacity is over a thousand levels deep,
    past Python's default limit of 1000 frames."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(graph.nodes) + 1000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of an initializer or of a Constant node's output; None for run-time tensors."""
    if tensor is None:
        return None
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    if len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        return np.asarray(value.values) if isinstance(value, gs.Constant) else None
    return None


def through_casts(tensor: gs.Tensor, found) -> gs.Tensor:
    """The first tensor, walking back from `tensor` through Cast and Identity nodes (as importers leave
    them between a graph input and a sparse layer), for which `found(tensor)` holds; else the last one."""
    while not found(tensor) and len(tensor.inputs) == 1 and tensor.inputs[0].op in ("Cast", "Identity"):
        tensor = tensor.inputs[0].inputs[0]
    return tensor


def optional_input(node: gs.Node, index: int) -> gs.Tensor | None:
    """Input `index` of the node, or None where it is absent or the empty name."""
    if index < len(node.inputs) and node.inputs[index].name:
        return node.inputs[index]
    return None


def replace_uses(graph: gs.Graph, old: gs.Tensor, new: gs.Tensor) -> None:
    """Make every consumer of `old` read `new`; a graph output `old` becomes an Identity of `new`.

    The Identity keeps the graph output's name: the lowering never renames what the user reads.
    """
    for consumer in list(old.outputs):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer.inputs[index] = new
    if old in graph.outputs:
        old.inputs.clear()
        graph.nodes.append(gs.Node("Identity", name=f"{old.name}_alias", inputs=[new], outputs=[old]))


def declare(tensor: gs.Tensor, dtype, shape: list) -> None:
    """Give a tensor the type the lowering knows it has, where the model left it undeclared (a graph
    input or output declared without a shape would otherwise make the lowered model invalid ONNX).

    A symbolic dimension the lowering knows (features [N, "C"] of a conv with Cin = 3) becomes that
    number, so that onnxruntime refuses a feed of another width by the input's name, before a MatMul or
    Reshape deep inside the lowered graph fails on it."""
    if tensor.dtype is None:
        tensor.dtype = dtype
    if tensor.shape is None:
        tensor.shape = shape
    elif len(tensor.shape) == len(shape):
        tensor.shape = [known if isinstance(known, int) and not isinstance(dim, int) else dim
                        for dim, known in zip(tensor.shape, shape)]


def detach(node: gs.Node) -> None:
    """Disconnect a rewritten node so that cleanup drops it."""
    node.inputs.clear()
    node.outputs.clear()


def node_proto(node: gs.Node) -> onnx.NodeProto:
    """The onnx NodeProto of a graphsurgeon node's identity and attributes (for schema parsing)."""
    return onnx.helper.make_node(node.op, [], [], name=node.name, domain=node.domain, **node.attrs)


def model_like(graph: gs.Graph, like: onnx.ModelProto, drop_domains=(), add_domains=()) -> onnx.ModelProto:
    """`graph` as a model carrying `like`'s IR version, metadata and opset imports, with the
    opset imports of `drop_domains` removed and `add_domains` ((domain, version) pairs) added.

    The IR version is kept rather than re-stamped, and capped at 10: onnx stamps newer ones than
    onnxruntime reads (1.21, the oldest runtime supported, reads up to 10). Graph outputs the model
    declared without a shape, or with an empty one (as torch.onnx writes an output of unknown rank),
    get the one shape inference finds.
    """
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = min(like.ir_version, IR_VERSION)
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(model, field, getattr(like, field))
    del model.metadata_props[:]
    model.metadata_props.extend(like.metadata_props)
    imports = {o.domain: o.version for o in like.opset_import if o.domain not in drop_domains}
    imports.update(dict(add_domains))
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in sorted(imports.items()))
    for output in model.graph.output:
        if not output.type.tensor_type.shape.dim:  # unknown, or empty: inference says which
            output.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(model).graph.output
    for output, found in zip(model.graph.output, inferred):
        if not output.type.tensor_type.HasField("shape"):
            output.type.CopyFrom(found.type)
    return model
