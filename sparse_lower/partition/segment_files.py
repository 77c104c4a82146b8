"""Segments as standalone ONNX models, and the manifest that says how tensors flow between them.

Each segment model keeps the source's IR version, opset imports and local functions, embeds the
initializers and `Constant` nodes it reads, and declares typed inputs and outputs, so that any
runtime or accelerator compiler can take one segment alone.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ..errors import SparseLowerError
from ..onnx_conventions import CUSTOM_DOMAIN, STANDARD_DOMAINS
from .segments import NodeGraph, Segment
from .value_types import ValueTypes


def segment_file(segment: Segment) -> str:
    return f"{segment.index:02d}_{segment.device}.onnx"


def _typed(types: ValueTypes, name: str, segment: Segment) -> onnx.ValueInfoProto:
    """A segment input or output with its type: the checker wants the element type and the rank of
    every tensor a model exchanges."""
    type_proto = types.type(name)
    tensor = type_proto.tensor_type if type_proto is not None and type_proto.HasField("tensor_type") else None
    if type_proto is None or tensor is not None and not (tensor.elem_type and tensor.HasField("shape")):
        raise SparseLowerError(
            f"segment {segment.index} ({segment.device}) exchanges '{name}', whose {types.describe(name)} type is not "
            f"fully known to ONNX shape inference, the model's value_info or onnxruntime",
            fix=f"add a value_info entry with the element type and rank of '{name}' to the model")
    value = onnx.ValueInfoProto(name=name)
    value.type.CopyFrom(type_proto)
    return value


def segment_model(model: onnx.ModelProto, graph: NodeGraph, types: ValueTypes, segment: Segment) -> onnx.ModelProto:
    """The segment as a model that passes onnx.checker; node names are the partition's stable names."""
    members = [graph.index[name] for name in segment.nodes]
    nodes = []
    for i in graph.constants_read(members) + members:
        node = onnx.NodeProto()
        node.CopyFrom(graph.nodes[i])
        node.name = graph.names[i]
        nodes.append(node)
    read = {name for i in members for name in graph.reads[i]}
    produced = {name for node in nodes for name in node.output}
    source = model.graph
    onnx_graph = helper.make_graph(
        nodes, f"{source.name or 'model'}_{segment.index:02d}_{segment.device}",
        [_typed(types, name, segment) for name in segment.inputs],
        [_typed(types, name, segment) for name in segment.outputs],
        [t for t in source.initializer if t.name in read],
        value_info=[v for v in source.value_info if v.name in produced and v.name not in segment.outputs],
        sparse_initializer=[s for s in source.sparse_initializer if s.values.name in read])
    # Only the domains the segment uses: a toolchain given an accelerator segment should not meet the
    # custom-op domain its nodes were lowered away from (some refuse any domain they do not know).
    used = {node.domain for node in nodes} | {node.domain for f in model.functions for node in f.node}
    opsets = [o for o in model.opset_import if o.domain in STANDARD_DOMAINS or o.domain in used]
    result = helper.make_model(onnx_graph, opset_imports=opsets, ir_version=model.ir_version,
                               producer_name="sparse_lower.partition", functions=list(model.functions))
    onnx.checker.check_model(result)
    return result


def custom_ops(graph: NodeGraph, segment: Segment) -> list[str]:
    """The library's custom ops the segment runs (op types, sorted): what it needs the library for. A
    segment of none runs in any ONNX runtime, with no library registered."""
    return sorted({node.op_type for node in map(graph.node, segment.nodes) if node.domain == CUSTOM_DOMAIN})


def manifest(graph: NodeGraph, types: ValueTypes, segments: list[Segment], devices: tuple[str, ...],
             static_shapes: bool) -> dict:
    """How the segments connect: for every segment input the segment (or graph input) it comes from,
    for every segment output the segments that read it and whether it is a graph output; and whether
    each segment needs the custom-op library (`needs_library`, and the `custom_ops` it runs)."""
    made_by = {name: s.index for s in segments for name in s.outputs}
    read_by: dict[str, list[int]] = {}
    for s in segments:
        for name in s.inputs:
            read_by.setdefault(name, []).append(s.index)
    graph_outputs = set(graph.graph_outputs)

    def origin(name: str) -> int | str:
        return made_by.get(name, "input" if name in graph.graph_inputs else "initializer")

    def value(name: str, **flow) -> dict:
        return {"name": name, "type": types.describe(name), **flow}

    return {
        "devices": list(devices),
        "static_shapes": static_shapes,
        "inputs": [value(name) for name in graph.graph_inputs],
        "outputs": [value(name, **{"from": origin(name)}) for name in graph.graph_outputs],
        "segments": [{
            "index": s.index,
            "device": s.device,
            "file": segment_file(s),
            "nodes": list(s.nodes),
            "inputs": [value(name, **{"from": origin(name)}) for name in s.inputs],
            "outputs": [value(name, to=read_by.get(name, []), graph_output=name in graph_outputs)
                        for name in s.outputs],
            "needs_library": bool(custom_ops(graph, s)),
            "custom_ops": custom_ops(graph, s),
        } for s in segments],
    }
