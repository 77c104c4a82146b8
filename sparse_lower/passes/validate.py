"""ValidateSourceOps: refuse, before anything is rewritten, every source node the lowering or the
runtime could not execute correctly, naming the node and the fix.

What is checked statically: the graph's structure (every input produced, one producer per tensor, no
cycle, imported domains, IR version), op names and arity, attributes and their ONNX types (through the
schemas), weight and bias shapes and dtypes, and the declared dtypes/ranks/widths of features and coords
wherever the model declares them.
What only the data can tell (coordinates out of the grid, duplicates) is checked at run time by the
custom ops.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..lowering.graph import constant_value, node_proto, optional_input
from ..schemas import (CONV_OPS, CUSTOM_DOMAIN, SOURCE_DOMAIN, SOURCE_OPS, attributes, conv_geometry,
                       to_dense_attributes, weight_shape)

_ARITY = {  # (min inputs, max inputs, outputs)
    "SubmanifoldConv": (3, 4, 2),
    "SparseConv": (3, 4, 2),
    "SparseDeconv": (3, 5, 2),
    "ToSparse": (1, 1, 2),
    "ToDense": (2, 2, 1),
}
_REQUIRED_INPUTS = {  # the inputs that may not be the empty name (ONNX's "absent optional input")
    "SubmanifoldConv": ("features", "coords", "weights"),
    "SparseConv": ("features", "coords", "weights"),
    "SparseDeconv": ("features", "coords", "weights"),
    "ToSparse": ("X",),
    "ToDense": ("features", "coords"),
}
_FLOATS = (np.float32, np.float16)


def _declared_shape(tensor: gs.Tensor | None) -> list | None:
    """The static shape a tensor declares (constant value, graph input or value_info), if any."""
    if tensor is None:
        return None
    value = constant_value(tensor)
    if value is not None:
        return list(value.shape)
    return list(tensor.shape) if tensor.shape is not None else None


def _check_features(node, tensor, channels) -> None:
    if tensor.dtype is not None and tensor.dtype not in _FLOATS:
        raise SparseLowerError(f"features '{tensor.name}' are {np.dtype(tensor.dtype).name}",
                               node.name, "feed float32 (or float16) features")
    shape = _declared_shape(tensor)
    if shape is not None:
        if len(shape) != 2:
            raise SparseLowerError(f"features '{tensor.name}' have rank {len(shape)}", node.name,
                                   "feed features as [N, C]")
        if channels is not None and isinstance(shape[1], int) and shape[1] != channels:
            raise SparseLowerError(f"features '{tensor.name}' have {shape[1]} channels but the weights expect "
                                   f"{channels}", node.name, "make the weights' input channels match the features")


def _check_coords(node, tensor, ndim, role="coords") -> None:
    if tensor.dtype is not None and tensor.dtype != np.int64:
        raise SparseLowerError(f"{role} '{tensor.name}' are {np.dtype(tensor.dtype).name}", node.name,
                               f"feed int64 {role} [N, {1 + ndim}] (insert a Cast to int64)")
    shape = _declared_shape(tensor)
    if shape is not None:
        if len(shape) != 2:
            raise SparseLowerError(f"{role} '{tensor.name}' have rank {len(shape)}", node.name,
                                   f"feed {role} as [N, {1 + ndim}] (batch, then {ndim} spatial indices)")
        if isinstance(shape[1], int) and shape[1] != 1 + ndim:
            raise SparseLowerError(f"{role} '{tensor.name}' have {shape[1]} columns, expected {1 + ndim}",
                                   node.name, f"feed {role} as [N, {1 + ndim}] (batch, then {ndim} spatial indices)")


def _check_float_constant(node, tensor: gs.Tensor | None, role: str) -> None:
    """Integer weights would be converted to float as they are, silently dropping the scales a
    quantised layer needs."""
    value = constant_value(tensor)
    if value is not None and not np.issubdtype(value.dtype, np.floating):
        raise SparseLowerError(f"the {role} '{tensor.name}' are {value.dtype.name}", node.name,
                               f"store float32 {role} (dequantise integer {role} first)")


def _check_conv(node: gs.Node) -> None:
    geometry = conv_geometry(node_proto(node))
    weights_tensor = node.inputs[2]
    shape = _declared_shape(weights_tensor)
    if shape is None:  # neither a constant nor a declared shape: the output of some node
        raise SparseLowerError(f"the weights '{weights_tensor.name}' are computed at run time", node.name,
                               "store the weights as an initializer or a Constant node (the lowering re-lays "
                               "them out at compile time)")
    _check_float_constant(node, weights_tensor, "weights")
    if len(shape) != 2 + geometry.ndim or not all(isinstance(v, int) for v in shape):
        raise SparseLowerError(f"weights of shape {shape} for a {geometry.ndim}D conv", node.name,
                               f"give weights of rank {2 + geometry.ndim} in the ONNX "
                               f"{'ConvTranspose' if node.op == 'SparseDeconv' else 'Conv'} layout")
    deconv = node.op == "SparseDeconv"
    cin, cout = (shape[0], shape[1]) if deconv else (shape[1], shape[0])
    expected = list(weight_shape(geometry, cin, cout))
    if shape != expected:
        layout = f"({'Cin, Cout' if deconv else 'Cout, Cin'}, *kernel)"
        if shape[1:-1] == list(geometry.kernel_shape):  # spconv's KRSC [Cout, *kernel, Cin], as exported
            raise SparseLowerError(
                f"weights of shape {shape} are in spconv's layout [Cout, *kernel, Cin], not {layout}", node.name,
                f"transpose them: np.moveaxis(w, -1, {0 if deconv else 1}) gives "
                f"{[shape[-1], shape[0], *shape[1:-1]] if deconv else [shape[0], shape[-1], *shape[1:-1]]} "
                f"(sparse_lower.export does this for spconv modules)")
        raise SparseLowerError(f"weights of shape {shape} do not match kernel_shape "
                               f"{list(geometry.kernel_shape)}", node.name, f"give weights {expected} {layout}")
    bias = optional_input(node, 3)
    _check_float_constant(node, bias, "bias")
    bias_shape = _declared_shape(bias)
    if bias is not None and bias_shape is not None and bias_shape != [cout]:
        raise SparseLowerError(f"bias of shape {bias_shape}, expected [{cout}]", node.name,
                               f"give a bias of shape [{cout}] or none")
    _check_features(node, node.inputs[0], cin)
    _check_coords(node, node.inputs[1], geometry.ndim)
    targets = optional_input(node, 4)
    if targets is not None:
        _check_coords(node, targets, geometry.ndim, "target_coords")


def _check_node(node: gs.Node) -> None:
    if node.op not in SOURCE_OPS:
        raise SparseLowerError(f"unknown op '{SOURCE_DOMAIN}::{node.op}'", node.name,
                               f"use one of {', '.join(SOURCE_OPS)}")
    low, high, outputs = _ARITY[node.op]
    if not low <= len(node.inputs) <= high or len(node.outputs) != outputs:
        raise SparseLowerError(f"{node.op} takes {low}–{high} inputs and {outputs} outputs, got "
                               f"{len(node.inputs)} and {len(node.outputs)}", node.name, "see docs/source_ops.md")
    for index, role in enumerate(_REQUIRED_INPUTS[node.op]):
        if not node.inputs[index].name:
            raise SparseLowerError(f"the required input {index} ({role}) is empty", node.name,
                                   f"connect the {role} to input {index}")
    if node.op in CONV_OPS:
        _check_conv(node)
    elif node.op == "ToDense":
        boundary = to_dense_attributes(node_proto(node))
        _check_features(node, node.inputs[0], None)
        _check_coords(node, node.inputs[1], len(boundary.spatial_shape))
    else:
        shape = _declared_shape(node.inputs[0])
        if shape is not None and not 3 <= len(shape) <= 5:
            raise SparseLowerError(f"ToSparse input of rank {len(shape)}", node.name,
                                   "feed a dense [B, C, *S] tensor with 1 to 3 spatial dimensions")


def _label(node: onnx.NodeProto, index: int) -> str:
    """The name errors use for a node: its own, or its op and position where it has none."""
    return node.name or f"{node.op_type}#{index}"


def check_structure(model: onnx.ModelProto) -> None:
    """Refuse the malformed graphs that graphsurgeon would crash on (a cycle) or merge silently (two
    producers of one tensor, a node output shadowing a graph input), and those that would fail only
    after lowering, under node names the user never wrote (an input that nothing produces, a domain
    the model does not import)."""
    graph = model.graph
    imported = {o.domain for o in model.opset_import} | {"", SOURCE_DOMAIN, CUSTOM_DOMAIN}
    given = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    labels = [_label(node, index) for index, node in enumerate(graph.node)]
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        if node.domain not in imported:
            raise SparseLowerError(f"op '{node.domain}::{node.op_type}' is in a domain the model does not import",
                                   labels[index], f"add an opset import for '{node.domain}', or correct the domain "
                                                  f"(the source ops are in '{SOURCE_DOMAIN}')")
        for name in filter(None, node.output):
            if name in given:
                raise SparseLowerError(f"output '{name}' has the name of a graph input or initializer", labels[index],
                                       "rename the output: every tensor has exactly one producer")
            if name in producer:
                raise SparseLowerError(f"output '{name}' is also an output of node '{labels[producer[name]]}'",
                                       labels[index], "rename one of them: every tensor has exactly one producer")
            producer[name] = index
    for index, node in enumerate(graph.node):
        for name in filter(None, node.input):
            if name not in given and name not in producer:
                raise SparseLowerError(f"input '{name}' is produced by no node and is neither a graph input nor an "
                                       f"initializer", labels[index],
                                       f"add '{name}' as an initializer or a graph input, or connect the node that "
                                       f"computes it")
    for value in graph.output:
        if value.name not in given and value.name not in producer:
            raise SparseLowerError(f"graph output '{value.name}' is produced by no node",
                                   fix="remove it from the graph outputs or connect the node that computes it")
    cycle = _cycle(graph, producer)
    if cycle:
        raise SparseLowerError(f"the graph has a cycle: {' -> '.join(labels[i] for i in cycle + cycle[:1])}",
                               labels[cycle[0]], "break the cycle (a recurrence needs a Loop or Scan node)")


def _cycle(graph: onnx.GraphProto, producer: dict[str, int]) -> list[int]:
    """The node indices of one cycle of the graph, in data-flow order, or [] when it is acyclic."""
    flow = nx.DiGraph()
    flow.add_nodes_from(range(len(graph.node)))
    flow.add_edges_from((producer[name], index) for index, node in enumerate(graph.node)
                        for name in filter(None, node.input) if name in producer)
    try:
        return [edge[0] for edge in nx.find_cycle(flow)]
    except nx.NetworkXNoCycle:
        return []


def source_version(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain == SOURCE_DOMAIN), None)


class ValidateSourceOps:
    """requires: an ONNX model. ensures: every `sparse` node is one the lowering can take."""

    name = "validate"
    step = "checking the source model"

    def requires(self, model: onnx.ModelProto) -> None:
        if not 3 <= model.ir_version <= onnx.IR_VERSION:
            raise SparseLowerError(f"the model has IR version {model.ir_version}; onnx {onnx.__version__} reads IR "
                                   f"versions 3 to {onnx.IR_VERSION}",
                                   fix="stamp the IR version of the onnx release that wrote the model "
                                       "(onnx.helper.make_model does)")
        version = source_version(model)
        if version not in (None, 1):
            raise SparseLowerError(f"the model imports domain '{SOURCE_DOMAIN}' version {version}",
                                   fix="sparse_lower implements version 1 of the sparse ops")

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        check_structure(model)
        for node in model.graph.node:  # attribute types survive only in the protos, not in graphsurgeon
            if node.domain == SOURCE_DOMAIN and node.op_type in SOURCE_OPS:
                attributes(node)
        graph = gs.import_onnx(model)
        names = set()
        for node in graph.nodes:
            if node.name and node.name in names:
                raise SparseLowerError("two nodes share this name", node.name, "give every node a unique name")
            names.add(node.name)
            if node.domain == SOURCE_DOMAIN:
                _check_node(node)
        return model

    def ensures(self, model: onnx.ModelProto) -> None:
        """Validation changes nothing."""
