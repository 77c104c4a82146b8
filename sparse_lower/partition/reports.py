"""Reports on a partition's segments: what each costs (multiply-accumulates of its nodes, bytes crossing
in and out) and the table `Partition.summary` prints.

They read the node graph, the type oracle, the segments and what the last run saw, which the
`Partition` hands in (so this module depends on nothing that depends on it); costs come from
node_costs.py, from static shapes where known, else from the shapes of the last run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import onnx

from ..report import render
from .devices import op_label
from .node_costs import Seen, macs, shapes_after_run, tensor_bytes, total
from .segments import NodeGraph, Segment
from .value_types import ValueTypes

Costs = tuple["int | None", "int | None", "int | None"]  # MACs, bytes in, bytes out
SegmentModel = Callable[[int], onnx.ModelProto]  # a segment's index -> its standalone model


def _bytes(types: ValueTypes, seen: Seen, name: str) -> int | None:
    static = tensor_bytes(types.static_shape(name), types.elem_type(name))
    return static if static is not None else seen.nbytes.get(name)


def segment_costs(graph: NodeGraph, types: ValueTypes, segment: Segment, seen: Seen,
                  segment_model: SegmentModel) -> Costs:
    """(MACs, bytes in, bytes out) of a segment: from static shapes, else from the shapes `seen` in
    the last run; None where neither gives one."""
    nodes = [graph.node(name) for name in segment.nodes]
    count = total(macs(node, types.static_shape) for node in nodes)
    if count is None and seen.shapes:
        known = shapes_after_run(segment_model(segment.index), seen.shapes, types)
        count = total(macs(node, lambda name: types.static_shape(name) or known.get(name)) for node in nodes)
    return (count, total(_bytes(types, seen, name) for name in segment.inputs),
            total(_bytes(types, seen, name) for name in segment.outputs))


def segment_table(graph: NodeGraph, types: ValueTypes, segments: list[Segment], seen: Seen,
                  segment_model: SegmentModel, ops_shown: int | None = None) -> str:
    """Per segment: index, device, node count, op counts (the `ops_shown` most frequent op types and how
    many more there are; None: every one), then `segment_costs` ("?" where unknown)."""

    def number(value: int | None) -> str:
        return "?" if value is None else f"{value:,}"

    rows = []
    for segment in segments:
        ops = Counter(op_label(graph.node(n)) for n in segment.nodes)
        cost = segment_costs(graph, types, segment, seen, segment_model)
        shown = sorted(ops.items()) if ops_shown is None else sorted(ops.items(), key=lambda item: (-item[1], item[0]))[:ops_shown]
        more = len(ops) - len(shown)
        listed = ", ".join(f"{op} x{count}" for op, count in shown) + (f", +{more} op types" if more else "")
        rows.append([f"{segment.index:02d}", segment.device, len(segment.nodes), listed, *map(number, cost)])
    return render(["segment", "device", "nodes", "ops", "MACs", "bytes in", "bytes out"], rows)
