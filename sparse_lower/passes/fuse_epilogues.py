"""FuseEpilogues: the `Relu` and the residual `Add` (+ `Relu`) that follow an `IndexedConv` become part
of it (its optional input R and its attribute activation="relu").

Why: each of those element-wise ops reads and writes every output row once more, after the conv has
let them leave the cache; inside the conv they run on a block of rows while it is still in cache
(docs/custom_ops.md). The sums are the same, in the same order, so the fused model's outputs are
bitwise those of the unfused one.

A conv output is fused only where nothing else reads it (the value then disappears from the graph) and
it is not a graph output, so the other operand of an `Add` cannot be computed from it. That operand is
taken as a residual only when it is a float run-time tensor that is not statically one row or one
column (a broadcast, which R may not be): the residual of a sparse block is the block's input rows,
on the conv's output coords. IndexedConv checks at run time that R has the output's shape [M, Cout],
so a graph that adds rows of other coords gets an error naming the conv rather than a broadcast.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..lowering.graph import deep_graph, detach, model_like
from ..onnx_conventions import CUSTOM_DOMAIN, is_standard

RESIDUAL_INPUT = 5  # IndexedConv's inputs: X, idx, W, B, coords, R


def _sole_reader(graph: gs.Graph, tensor: gs.Tensor, op: str) -> gs.Node | None:
    """The one node reading `tensor`, when it is a default-domain `op` and `tensor` is no graph output."""
    if len(tensor.outputs) != 1 or tensor in graph.outputs:
        return None
    reader = tensor.outputs[0]
    return reader if reader.op == op and is_standard(reader.domain) else None


def _residual(add: gs.Node, output: gs.Tensor, cout: int) -> gs.Variable | None:
    """The other operand of `add` when it can be the conv's R: see the module docstring."""
    (other,) = [t for t in add.inputs if t is not output] or [None]
    if not isinstance(other, gs.Variable) or (other.inputs and other.inputs[0].op == "Constant"):
        return None
    if other.dtype is not None and np.dtype(other.dtype) != np.float32:
        return None
    shape = other.shape
    if shape is not None and (len(shape) != 2 or shape[0] == 1 or (isinstance(shape[1], int) and shape[1] != cout)):
        return None
    return other


def _take_output(conv: gs.Node, reader: gs.Node) -> None:
    """`conv` now writes what `reader` wrote; `reader` is left unconnected."""
    (result,) = reader.outputs
    result.dtype = result.dtype or conv.outputs[0].dtype
    detach(reader)
    conv.outputs = [result]


def fuse(graph: gs.Graph, conv: gs.Node) -> bool:
    """Fuse what follows `conv` into it; whether anything was."""
    weights = conv.inputs[2]
    cout = weights.shape[2] if weights.shape is not None and len(weights.shape) == 3 else None
    fused = False
    add = _sole_reader(graph, conv.outputs[0], "Add") if len(conv.inputs) <= RESIDUAL_INPUT else None
    residual = _residual(add, conv.outputs[0], cout) if add is not None else None
    if residual is not None:
        inputs = list(conv.inputs)
        inputs += [gs.Variable.empty() for _ in range(RESIDUAL_INPUT - len(inputs))]
        conv.inputs = inputs + [residual]
        _take_output(conv, add)
        fused = True
    relu = _sole_reader(graph, conv.outputs[0], "Relu")
    if relu is not None:
        conv.attrs["activation"] = "relu"
        _take_output(conv, relu)
        fused = True
    return fused


class FuseEpilogues:
    """requires: nothing (only IndexedConv nodes are touched). ensures: no IndexedConv without an
    activation has its output read by a `Relu` alone."""

    name = "fuse-epilogues"
    step = "fusing the Relu and residual Add after each IndexedConv"

    def requires(self, model: onnx.ModelProto) -> None:
        """Any model."""

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        graph = gs.import_onnx(model)
        convs = [n for n in graph.nodes if n.op == "IndexedConv" and n.domain == CUSTOM_DOMAIN
                 and "activation" not in n.attrs]
        if not any([fuse(graph, conv) for conv in convs]):
            return model
        with deep_graph(graph):
            graph.cleanup().toposort()
        return model_like(graph, model)

    def ensures(self, model: onnx.ModelProto) -> None:
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        outputs = {o.name for o in model.graph.output}
        for node in model.graph.node:
            activated = any(a.name == "activation" for a in node.attribute)
            if node.op_type == "IndexedConv" and node.domain == CUSTOM_DOMAIN and not activated:
                found = readers.get(node.output[0], [])
                if len(found) == 1 and is_standard(found[0].domain) and found[0].op_type == "Relu" \
                        and node.output[0] not in outputs:
                    raise SparseLowerError("a Relu after the conv was left unfused", node.name)
