"""Device assignment and segmentation of an ONNX graph on networkx.

The algorithm knows devices only through their predicates (devices.py). It works on the node DAG
(edges follow tensors, nodes keyed by their index in the model) and produces segments that are
contiguous runs of one deterministic, device-aware topological order, then merges same-device
segments wherever the segment graph stays acyclic. Because every segment is made of runs of one
topological order, tensors only ever flow from earlier segments to later ones, and running the
segments in order is running the model.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

import networkx as nx
import onnx

from ..errors import SparseLowerError
from ..onnx_conventions import STANDARD_DOMAINS
from .devices import Predicate
from .value_types import ValueTypes

log = logging.getLogger("sparse_lower.partition")


@dataclass(frozen=True)
class Segment:
    """A part of the graph that runs on one device as one model.

    `nodes` are node names in execution order; `inputs` are the tensors it reads from graph inputs or
    earlier segments (initializers and constants are embedded, not inputs); `outputs` are the tensors
    it produces that later segments or the graph outputs read.
    """

    index: int
    device: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _subgraph_reads(graph: onnx.GraphProto) -> list[str]:
    """Outer-scope values a subgraph (If / Loop / Scan body) reads: its node inputs that it does not
    define itself. They are inputs of the node that owns the subgraph as much as its explicit ones."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    reads = []
    for node in graph.node:
        for name in node_reads(node):
            if name not in defined and name not in reads:
                reads.append(name)
        defined.update(node.output)
    return reads


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every value a node reads, explicit inputs first, then those its subgraphs read implicitly."""
    reads = [name for name in node.input if name]
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
            reads.extend(name for name in _subgraph_reads(graph) if name not in reads)
    return reads


def stable_names(nodes: Sequence[onnx.NodeProto]) -> list[str]:
    """Unique node names: a node's own name where it has a unique one, else `{op_type}_{index}`
    (with a suffix should that be taken too). Same model, same names."""
    seen: dict[str, int] = {}
    for node in nodes:
        seen[node.name] = seen.get(node.name, 0) + 1
    taken = {name for name, count in seen.items() if name and count == 1}
    names = []
    for index, node in enumerate(nodes):
        name = node.name if node.name in taken else f"{node.op_type}_{index}"
        while name in taken and name != node.name:
            name += "_"
        taken.add(name)
        names.append(name)
    return names


def _is_replicated_constant(node: onnx.NodeProto, graph_outputs: set[str]) -> bool:
    """A `Constant` is copied into every segment that reads it, like an initializer, instead of being
    assigned: as a segment input it would turn a compile-time shape or weight into a run-time tensor."""
    return node.domain in STANDARD_DOMAINS and node.op_type == "Constant" and node.output[0] not in graph_outputs


class NodeGraph:
    """The nodes of a model as a networkx DAG, and where each value comes from."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.nodes = list(graph.node)
        self.names = stable_names(self.nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.reads = [node_reads(node) for node in self.nodes]
        self.initializers = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
        self.graph_inputs = [v.name for v in graph.input if v.name not in self.initializers]
        self.graph_outputs = [v.name for v in graph.output]
        outputs = set(self.graph_outputs)
        self.constants = {node.output[0]: index for index, node in enumerate(self.nodes)
                          if _is_replicated_constant(node, outputs)}
        self.producer = {name: index for index, node in enumerate(self.nodes) for name in node.output if name}
        self.dag = nx.DiGraph()
        replicated = set(self.constants.values())
        self.dag.add_nodes_from(i for i in range(len(self.nodes)) if i not in replicated)
        provided = set(self.graph_inputs) | self.initializers
        self.readers: dict[str, list[int]] = {}
        for consumer in self.dag.nodes:
            for name in self.reads[consumer]:
                if name in self.constants:
                    continue
                self.readers.setdefault(name, []).append(consumer)
                producer = self.producer.get(name)
                if producer is not None:
                    self.dag.add_edge(producer, consumer)
                elif name not in provided:
                    raise SparseLowerError(f"reads '{name}', which no node, graph input or initializer provides",
                                           node=self.names[consumer])
        if not nx.is_directed_acyclic_graph(self.dag):
            cycle = " -> ".join(self.names[u] for u, _ in nx.find_cycle(self.dag))
            raise SparseLowerError(f"the graph has a cycle: {cycle}")

    def node(self, name: str) -> onnx.NodeProto:
        return self.nodes[self.index[name]]

    def data_reads(self, index: int) -> list[tuple[str, int | None]]:
        """The values node `index` reads that flow between nodes, each with the node producing it (None
        for a graph input); initializers and replicated constants, embedded where read, left out."""
        return [(name, self.producer.get(name)) for name in self.reads[index]
                if name not in self.initializers and name not in self.constants]

    def producer_of(self, name: str) -> int | None:
        """The node that produces a value, None for a graph input or an initializer."""
        return self.producer.get(name)

    def constants_read(self, indices: Iterable[int]) -> list[int]:
        """The replicated `Constant` nodes that the given nodes read, in model order."""
        return sorted({self.constants[name] for i in indices for name in self.reads[i] if name in self.constants})


def assign(graph: NodeGraph, types: ValueTypes, devices: Sequence[str],
           predicates: dict[str, Predicate]) -> tuple[dict[int, str], dict[str, dict[str, str]]]:
    """The first device of `devices` whose predicate accepts each node, and every refusal's reason.

    Every predicate is asked about every node, so `reasons` also says why a node that landed on the
    gpu could not run on a device listed after it.
    """
    assignment: dict[int, str] = {}
    reasons: dict[str, dict[str, str]] = {}
    for index in graph.dag.nodes:
        node, name = graph.nodes[index], graph.names[index]
        refusals = {}
        for device in devices:
            reason = predicates[device](node, types)
            if reason is not None:
                refusals[device] = reason
        reasons[name] = refusals
        accepted = [device for device in devices if device not in refusals]
        if not accepted:
            listed = "; ".join(f"{device}: {reason}" for device, reason in refusals.items())
            raise SparseLowerError(f"no device can run this {node.op_type} node ({listed})", node=name)
        assignment[index] = accepted[0]
        if accepted[0] != devices[0]:
            preferred = devices[:devices.index(accepted[0])]
            log.info("node '%s' (%s) runs on %s: %s", name, node.op_type, accepted[0],
                     "; ".join(f"{device} refused: {refusals[device]}" for device in preferred))
    return assignment, reasons


def _device_aware_order(dag: nx.DiGraph, assignment: dict[int, str]) -> list[list[int]]:
    """Kahn's topological sort that stays on one device as long as it can.

    Among the ready nodes it takes one on the current run's device (lowest index first); when there
    is none, it opens a run for the device of the lowest-index ready node. Returns the runs.
    """
    pending = {node: dag.in_degree(node) for node in dag.nodes}
    ready: dict[str, list[int]] = {}
    for node in sorted(n for n, degree in pending.items() if degree == 0):
        heapq.heappush(ready.setdefault(assignment[node], []), node)
    runs: list[list[int]] = []
    device = None
    while any(ready.values()):
        if not ready.get(device):
            device = min((heap[0], d) for d, heap in ready.items() if heap)[1]
            runs.append([])
        node = heapq.heappop(ready[device])
        runs[-1].append(node)
        for successor in sorted(dag.successors(node)):
            pending[successor] -= 1
            if pending[successor] == 0:
                heapq.heappush(ready.setdefault(assignment[successor], []), successor)
    return runs


def _merge_creates_cycle(graph: nx.DiGraph, a: int, b: int) -> bool:
    """Contracting a and b closes a cycle exactly when a path joins them through a third segment."""
    return any(s != b and nx.has_path(graph, s, b) for s in graph.successors(a)) or \
        any(s != a and nx.has_path(graph, s, a) for s in graph.successors(b))


def _segment_graph(dag: nx.DiGraph, runs: list[list[int]], assignment: dict[int, str]) -> nx.DiGraph:
    """Runs as graph nodes (attributes: device, members), an edge where a tensor crosses between them."""
    owner = {node: r for r, run in enumerate(runs) for node in run}
    graph = nx.DiGraph()
    for r, run in enumerate(runs):
        graph.add_node(r, device=assignment[run[0]], members=list(run))
    graph.add_edges_from((owner[u], owner[v]) for u, v in dag.edges if owner[u] != owner[v])
    return graph


def _merge_same_device(graph: nx.DiGraph, position: dict[int, int]) -> None:
    """Merge same-device segments, earliest pairs first, while the segment graph stays acyclic."""
    def first(s: int) -> int:
        return position[graph.nodes[s]["members"][0]]  # members stay sorted by position

    merged = True
    while merged:
        merged = False
        for a, b in combinations(sorted(graph.nodes, key=first), 2):
            if graph.nodes[a]["device"] == graph.nodes[b]["device"] and not _merge_creates_cycle(graph, a, b):
                members = sorted(graph.nodes[a]["members"] + graph.nodes[b]["members"], key=position.__getitem__)
                nx.contracted_nodes(graph, a, b, self_loops=False, copy=False)
                graph.nodes[a]["members"] = members
                graph.nodes[a].pop("contraction", None)
                merged = True
                break


def cut(graph: NodeGraph, assignment: dict[int, str]) -> list[Segment]:
    """Cut the assigned graph into segments (see the module docstring); deterministic."""
    runs = _device_aware_order(graph.dag, assignment)
    position = {node: p for p, node in enumerate(n for run in runs for n in run)}
    segments = _segment_graph(graph.dag, runs, assignment)
    _merge_same_device(segments, position)
    if not nx.is_directed_acyclic_graph(segments):
        raise AssertionError("partitioner bug: the segment graph has a cycle")
    order = list(nx.lexicographical_topological_sort(
        segments, key=lambda s: position[segments.nodes[s]["members"][0]]))
    graph_outputs = set(graph.graph_outputs)
    result = []
    for index, s in enumerate(order):
        members = segments.nodes[s]["members"]
        inside = set(members)
        produced = {name for i in members for name in graph.nodes[i].output if name}
        inputs = dict.fromkeys(name for i in members for name, _ in graph.data_reads(i) if name not in produced)
        outputs = dict.fromkeys(name for i in members for name in graph.nodes[i].output if name and (
            name in graph_outputs or any(r not in inside for r in graph.readers.get(name, ()))))
        result.append(Segment(index, segments.nodes[s]["device"], tuple(graph.names[i] for i in members),
                              tuple(inputs), tuple(outputs)))
    return result
