"""ONNX bookkeeping shared by the ONNX emitters: unique names, nodes, initializers, the final model."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..names import UniqueNames
from ..onnx_conventions import IR_VERSION


class GraphWriter:
    """Collects a graph's nodes, initializers and inputs; `model` wraps them with the given opsets.

    Names are made unique here (a second layer called "conv" becomes "conv_1"), so that a network may
    reuse a name without the emitter producing an invalid graph.
    """

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._used = UniqueNames()
        self._renamed: dict[str, str] = {}

    def unique(self, base: str) -> str:
        return self._used.fresh(base)

    def input(self, name: str, elem_type: int, shape: Sequence) -> str:
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def constant(self, name: str, value: np.ndarray) -> str:
        name = self.unique(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str, domain: str = "",
             **attrs) -> list[str]:
        """Append a node; `outputs` are made unique; attributes whose value is None are left out."""
        outputs = [self.unique(o) for o in outputs]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, domain=domain, **attrs))
        return outputs

    def rename(self, old: str, new: str) -> str:
        """Give a node output a final name (graph outputs get readable names). A graph input, or a value
        already renamed for another output, keeps its name and is passed on by an Identity."""
        new = self.unique(new)
        source = self._renamed.get(old, old)
        if source != old or any(i.name == old for i in self.inputs):
            self.nodes.append(helper.make_node("Identity", [source], [new], name=new))
            return new
        self._renamed[old] = new
        for node in self.nodes:
            for field in (node.input, node.output):
                for index, value in enumerate(field):
                    if value == old:
                        field[index] = new
        return new

    def model(self, graph_name: str, outputs: Sequence[onnx.ValueInfoProto], opsets: dict[str, int]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, list(outputs), self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
        model.ir_version = IR_VERSION
        return model
