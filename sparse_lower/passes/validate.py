"""ValidateSourceOps: refuse, before anything is rewritten, every source node the lowering or the
runtime could not execute correctly, naming the node and the fix.

What is checked statically: here, the graph's structure (every input produced, one producer per
tensor, no cycle, imported domains, IR version), op names, and attributes and their ONNX types (through
the schemas); by each node's lowering rule (its `check`), its connections, weight and bias shapes and
dtypes, and the declared dtypes/ranks/widths of features and coords wherever the model declares them.
What only the data can tell (coordinates out of the grid, duplicates) is checked at run time by the
custom ops.
"""

from __future__ import annotations

import networkx as nx
import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..lowering.rules import rule_for
from ..names import node_label
from ..onnx_conventions import CUSTOM_DOMAIN, SOURCE_DOMAIN
from ..schemas import SOURCE_OPS, attributes


def _check_node(node: gs.Node) -> None:
    """Ask the node's rule: its refusals live with it (lowering/rules/)."""
    rule = rule_for(node)
    if rule is None:
        raise SparseLowerError(f"unknown op '{SOURCE_DOMAIN}::{node.op}'", node.name,
                               f"use one of {', '.join(SOURCE_OPS)}")
    refusal = rule.check(node)
    if refusal is not None:
        raise refusal.error(node)


def check_structure(model: onnx.ModelProto) -> None:
    """Refuse the malformed graphs that graphsurgeon would crash on (a cycle) or merge silently (two
    producers of one tensor, a node output shadowing a graph input), and those that would fail only
    after lowering, under node names the user never wrote (an input that nothing produces, a domain
    the model does not import)."""
    graph = model.graph
    imported = {o.domain for o in model.opset_import} | {"", SOURCE_DOMAIN, CUSTOM_DOMAIN}
    given = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    labels = [node_label(node, index) for index, node in enumerate(graph.node)]
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
