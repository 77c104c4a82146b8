"""`GraphWriter`: the one builder of new ONNX graphs in the package.

Everything that writes a model node by node uses it: the emitters of the reference networks in their
source-op and wild forms and `SparseModelBuilder` (sparse_lower/models/). It keeps the nodes and the initializers in the
order they are added, and the names taken, so that every value is defined once.
The ONNX conventions (IR version, opset) are onnx_conventions.py's; a writer that imitates another
exporter's file (models/formats.py) makes its model from `graph` with that exporter's conventions.

Graph edits of an existing model go through onnx-graphsurgeon instead (lowering/graph.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .names import UniqueNames
from .onnx_conventions import IR_VERSION


class GraphWriter:
    """Collects a graph's nodes, initializers, inputs and value infos; `graph` / `model` wrap them.

    Values are made unique here (a second layer called "conv" writes "conv_1"), so that a network may
    reuse a name without the writer producing an invalid graph; node names are the caller's (from
    `unique` where they must not repeat).
    """

    def __init__(self, inputs: Sequence[onnx.ValueInfoProto] = ()):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = list(inputs)
        self.value_info: list[onnx.ValueInfoProto] = []
        self._used = UniqueNames(value.name for value in self.inputs)
        self._renamed: dict[str, str] = {}

    def unique(self, base: str) -> str:
        return self._used.fresh(base)

    def input(self, name: str, elem_type: int, shape: Sequence) -> str:
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def constant(self, name: str, value: np.ndarray) -> str:
        """An initializer, under a unique name derived from `name` (returned)."""
        name = self.unique(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str, domain: str = "",
             **attrs) -> list[str]:
        """Append a node; `outputs` are made unique (returned); attributes whose value is None are left out."""
        outputs = [self.unique(o) for o in outputs]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, domain=domain, **attrs))
        return outputs

    def replace(self, old: str, new: str) -> None:
        """Every input and output named `old` named `new` instead."""
        for node in self.nodes:
            for field in (node.input, node.output):
                for index, name in enumerate(field):
                    if name == old:
                        field[index] = new

    def rename(self, old: str, new: str) -> str:
        """Give a node output a final name (graph outputs get readable names), made unique and returned.
        A graph input, or a value already renamed for another output, keeps its name and is passed on
        by an Identity ("<new>_identity")."""
        new = self.unique(new)
        source = self._renamed.get(old, old)
        if source != old or any(i.name == old for i in self.inputs):
            self.nodes.append(helper.make_node("Identity", [source], [new], name=self.unique(f"{new}_identity"),
                                               domain=""))
            return new
        self._renamed[old] = new
        self.replace(old, new)
        return new

    def graph(self, name: str, outputs: Sequence[onnx.ValueInfoProto]) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, self.inputs, list(outputs), self.initializers,
                                 value_info=self.value_info)

    def model(self, graph_name: str, outputs: Sequence[onnx.ValueInfoProto], opsets: dict[str, int],
              **fields) -> onnx.ModelProto:
        """The model with the package's IR version, the given opsets and model `fields` (producer_name, …)."""
        model = helper.make_model(self.graph(graph_name, outputs),
                                  opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()], **fields)
        model.ir_version = IR_VERSION
        return model
