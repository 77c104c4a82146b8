"""The structure of an ONNX graph, checked before anything reads it: every input produced, one producer
per tensor, unique graph inputs, imported domains, no cycle, declared sizes a run can hold. Both the
import of a foreign file and the validation of a source-op model run it first, so that a malformed file
is refused naming its node, before a walk over the graph would crash on it (networkx's topological sort
on a cycle, the translation on a dangling input) or merge two producers silently.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx
import onnx

from .errors import SparseLowerError
from .names import node_label
from .onnx_conventions import CUSTOM_DOMAIN, MAX_TENSOR_ELEMENTS, SOURCE_DOMAIN


def check_structure(model: onnx.ModelProto) -> None:
    """Refuse the malformed graphs that graphsurgeon would crash on (a cycle) or merge silently (two
    producers of one tensor, a node output shadowing a graph input), and those that would fail only
    after lowering, under node names the user never wrote (an input that nothing produces, a domain
    the model does not import)."""
    graph = model.graph
    imported = {o.domain for o in model.opset_import} | {"", SOURCE_DOMAIN, CUSTOM_DOMAIN}
    for kind, values in (("graph input", graph.input), ("initializer", graph.initializer)):
        counts = Counter(value.name for value in values)
        repeated = sorted(name for name, count in counts.items() if count > 1)
        if repeated:
            raise SparseLowerError(f"the {kind} '{repeated[0]}' is declared {counts[repeated[0]]} times",
                                   fix=f"declare each {kind} once")
    for value in [*graph.input, *graph.output]:
        _check_declared_size(value)
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


def _check_declared_size(value: onnx.ValueInfoProto) -> None:
    """Refuse a graph input or output whose declared static extents alone (a symbolic one counted as 1)
    hold more than MAX_TENSOR_ELEMENTS: the example feeds and the checks made from the declaration would
    otherwise allocate it."""
    dims = value.type.tensor_type.shape.dim
    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
    elements = 1
    for size in shape:
        elements *= size if isinstance(size, int) else 1
    if elements > MAX_TENSOR_ELEMENTS:
        raise SparseLowerError(f"'{value.name}' is declared {shape}: {elements:,} elements or more, more than the "
                               f"{MAX_TENSOR_ELEMENTS:,} a model may take or give at once",
                               fix="declare the row count symbolic (a name instead of a number), or crop the grid")
