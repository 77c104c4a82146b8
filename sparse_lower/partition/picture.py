"""Pictures of a partition: Graphviz DOT text of the nodes in device-coloured segment clusters, and a
PNG/SVG of the segment graph drawn with matplotlib (a dependency of the package).

It draws from the node graph, the segments and the device order alone (what `Partition.to_dot` and
`Partition.save_picture` hand it), so it depends on nothing that depends on it.
The DOT text needs nothing installed to produce; render it with `dot -Tsvg` where Graphviz is at hand.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import networkx as nx

from ..errors import SparseLowerError
from .devices import op_label
from .segments import NodeGraph, Segment

DEVICE_COLOURS = {"nna": "#9ad29a", "gpu": "#8fb9e6", "cpu": "#f3c98f"}
OTHER_COLOURS = ("#d7a6e0", "#e6e28f", "#a6e0d9", "#e0a6a6")
PICTURE_SUFFIXES = (".png", ".svg")
BOW = 0.6  # how far (in lanes) an arrow that jumps over segments bows out
NEWLINE = "\n"  # f-string expressions take no backslash before Python 3.12


def device_colours(devices: tuple[str, ...]) -> dict[str, str]:
    """A fixed colour per built-in device; devices added through `support` take the next free one."""
    others = iter(OTHER_COLOURS * (1 + len(devices) // len(OTHER_COLOURS)))
    return {device: DEVICE_COLOURS.get(device) or next(others) for device in devices}


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a valid DOT quoted string


def to_dot(graph: NodeGraph, segments: list[Segment], devices: tuple[str, ...]) -> str:
    """Segments as clusters filled with their device's colour, nodes labelled by op and name, edges
    inside a segment thin, tensors that cross segments (and graph inputs/outputs) as labelled edges."""
    colours = device_colours(devices)
    owner = {graph.index[name]: s.index for s in segments for name in s.nodes}
    lines = ["digraph partition {", "  rankdir=LR;", '  node [shape=box, style="rounded,filled", fillcolor=white, '
             'fontname="Helvetica", fontsize=10];', '  edge [fontname="Helvetica", fontsize=9];']
    for s in segments:
        lines += [f"  subgraph cluster_{s.index} {{",
                  f"    label={_quote(f'{s.index:02d} {s.device} ({len(s.nodes)} nodes)')};",
                  f'    style=filled; fillcolor="{colours[s.device]}"; color="#555555";']
        lines += [f"    n{graph.index[name]} [label={_quote(op_label(graph.node(name)) + NEWLINE + name)}];"
                  for name in s.nodes]
        lines.append("  }")
    for name in graph.graph_inputs:
        lines.append(f"  {_quote('input:' + name)} [label={_quote(name)}, shape=ellipse];")
    for name in graph.graph_outputs:
        lines.append(f"  {_quote('output:' + name)} [label={_quote(name)}, shape=ellipse];")
    for consumer in owner:
        for name, producer in graph.data_reads(consumer):
            if producer is None:
                lines.append(f"  {_quote('input:' + name)} -> n{consumer};")
            elif owner[producer] == owner[consumer]:
                lines.append(f"  n{producer} -> n{consumer};")
            else:
                lines.append(f'  n{producer} -> n{consumer} [label={_quote(name)}, color="#c0392b", penwidth=2];')
    for name in graph.graph_outputs:
        producer = graph.producer_of(name)
        if producer in owner:
            lines.append(f"  n{producer} -> {_quote('output:' + name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def segment_graph(segments: list[Segment], graph_outputs: list[str]) -> nx.DiGraph:
    """Segments, plus one node for the graph inputs and one for the outputs; edges carry the names of
    the tensors that flow along them."""
    flow = nx.DiGraph()
    flow.add_node("inputs")
    flow.add_nodes_from(s.index for s in segments)
    flow.add_node("outputs")
    made_by = {name: s.index for s in segments for name in s.outputs}

    def connect(source, target, name: str) -> None:
        if not flow.has_edge(source, target):
            flow.add_edge(source, target, tensors=[])
        flow.edges[source, target]["tensors"].append(name)

    for s in segments:
        for name in s.inputs:
            connect(made_by.get(name, "inputs"), s.index, name)
    for name in graph_outputs:
        connect(made_by.get(name, "inputs"), "outputs", name)
    return flow


def _box_label(graph: NodeGraph, segment: Segment, shown: int = 3) -> str:
    ops = Counter(graph.node(n).op_type for n in segment.nodes).most_common()
    lines = [f"{segment.index:02d} {segment.device}", *(f"{op} x{count}" for op, count in ops[:shown])]
    return "\n".join(lines + ([f"(+{len(ops) - shown} op types)"] if len(ops) > shown else []))


def _edge_label(tensors: list[str], shown: int = 2) -> str:
    return "\n".join(tensors[:shown] + ([f"(+{len(tensors) - shown} more)"] if len(tensors) > shown else []))


def save_picture(graph: NodeGraph, segments: list[Segment], devices: tuple[str, ...], path: Path) -> Path:
    """Draw `segment_graph` as swimlanes: one lane per device, segments left to right in execution
    order, arrows labelled with the tensors that cross."""
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise SparseLowerError(f"cannot draw a picture as '{path.suffix}'", fix="give a .png or .svg path")
    from matplotlib.figure import Figure  # imported here: drawing is rare, and matplotlib is slow to import
    colours = device_colours(devices)
    lanes = [d for d in devices if any(s.device == d for s in segments)]
    middle = -(len(lanes) - 1) / 2
    last = len(segments) + 1
    position = {"inputs": (0, middle), "outputs": (last, middle)}
    position.update((s.index, (s.index + 1, -lanes.index(s.device))) for s in segments)
    figure = Figure(figsize=(3.0 * (last + 1), 1.6 * len(lanes) + 1.2))
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.set_xlim(-0.9, last + 0.6)
    axes.set_ylim(-len(lanes) + 0.5 - BOW, 0.5 + BOW)
    for lane, device in enumerate(lanes):
        axes.axhspan(-lane - 0.45, -lane + 0.45, color=colours[device], alpha=0.18, linewidth=0)
        axes.text(-0.85, -lane, device, ha="left", va="center", fontsize=11, fontweight="bold")
    labels = {"inputs": "graph inputs", "outputs": "graph outputs"}
    labels.update((s.index, _box_label(graph, s)) for s in segments)
    fills = {s.index: colours[s.device] for s in segments}
    boxes = {node: axes.text(x, y, labels[node], ha="center", va="center", fontsize=8, zorder=3,
                             bbox={"boxstyle": "round,pad=0.5", "facecolor": fills.get(node, "white"),
                                   "edgecolor": "#333333"})
             for node, (x, y) in position.items()}
    box = axes.get_position()  # inches per data unit: arc3 curvature is measured on the page
    x_scale = figure.get_figwidth() * box.width / (axes.get_xlim()[1] - axes.get_xlim()[0])
    y_scale = figure.get_figheight() * box.height / (axes.get_ylim()[1] - axes.get_ylim()[0])
    for source, target, tensors in segment_graph(segments, graph.graph_outputs).edges(data="tensors"):
        (x0, y0), (x1, y1) = position[source], position[target]
        # Jumps over a column bow by BOW lanes away from the other lanes, clearing the boxes between.
        bow = 0.0 if x1 - x0 <= 1 else (BOW if (y0 + y1) / 2 >= middle else -BOW)
        rad = -2 * bow * y_scale / ((x1 - x0) * x_scale)
        axes.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=2, annotation_clip=False, arrowprops={
            "arrowstyle": "-|>", "color": "#444444", "connectionstyle": f"arc3,rad={rad}",
            "patchA": boxes[source].get_bbox_patch(), "patchB": boxes[target].get_bbox_patch()})
        # The midpoint of the arc3 Bezier curve, back in data units.
        mx = (x0 + x1) / 2 + rad / 2 * (y1 - y0) * y_scale / x_scale
        axes.text(mx, (y0 + y1) / 2 + bow, _edge_label(tensors), ha="center", va="center", fontsize=6, zorder=4,
                  bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
    figure.savefig(path, bbox_inches="tight", dpi=150)
    return path
