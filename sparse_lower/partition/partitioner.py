"""`partition(model, …) -> Partition`: assign, cut, export and run (README: Partitioning)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..costs import METHODS, cost_rows, layer_costs
from ..errors import SparseLowerError
from ..model_io import load
from ..report import render
from ..runtime import create_session
from . import export, picture
from .costs import macs, shapes_after_run, tensor_bytes, total
from ..onnx_conventions import STANDARD_DOMAINS
from .devices import Predicate, device_table, op_label
from .segments import NodeGraph, Segment, assign, cut
from .value_types import ValueTypes

DEFAULT_DEVICES = ("nna", "gpu", "cpu")
SHAPE_PROBE = "sparse_lower.partition/shape_of/"  # prefix of the extra outputs that report shapes at run time


class Partition:
    """A model cut into device segments that run in order.

    `segments` lists them in execution order; `reasons[node][device]` says why `device` refused `node`
    (for every device that did); `assignment[node]` is the device the node runs on. `Constant` nodes
    are in neither: each segment that reads one embeds a copy, as it embeds initializers.
    """

    def __init__(self, model: onnx.ModelProto, graph: NodeGraph, types: ValueTypes, segments: list[Segment],
                 reasons: dict[str, dict[str, str]], assignment: dict[str, str], devices: tuple[str, ...],
                 static_shapes: bool):
        self.model = model
        self.graph = graph
        self.types = types
        self.segments = segments
        self.reasons = reasons
        self.assignment = assignment
        self.devices = devices
        self.static_shapes = static_shapes
        self._models: dict[int, onnx.ModelProto] = {}
        self._sessions: dict[int, object] = {}
        self._session_kwargs: dict | None = None
        self._seen_shapes: dict[str, tuple[int, ...]] = {}  # from the last run
        self._seen_bytes: dict[str, int] = {}

    # -- export ------------------------------------------------------------------------------------

    def segment_model(self, index: int) -> onnx.ModelProto:
        """Segment `index` as a standalone ONNX model (built once)."""
        if index not in self._models:
            self._models[index] = export.segment_model(self.model, self.graph, self.types, self.segments[index])
        return self._models[index]

    def manifest(self) -> dict:
        return export.manifest(self.graph, self.types, self.segments, self.devices, self.static_shapes)

    def to_onnx(self, directory: str | os.PathLike) -> Path:
        """Write one model per segment (`00_gpu.onnx`, `01_nna.onnx`, …) and `manifest.json` into
        `directory`; returns the manifest's path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for segment in self.segments:
            onnx.save(self.segment_model(segment.index), directory / export.segment_file(segment))
        path = directory / "manifest.json"
        path.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        return path

    # -- run ---------------------------------------------------------------------------------------

    def _probes(self, segment: Segment) -> list[str]:
        """Values inside the segment that custom ops produce: ONNX shape inference cannot see through
        those, so a run reports their shapes (see costs.shapes_after_run)."""
        boundary = set(segment.inputs) | set(segment.outputs)
        return [name for node in map(self.graph.node, segment.nodes) if node.domain not in STANDARD_DOMAINS
                for name in node.output if name and name not in boundary]

    def _session(self, segment: Segment):
        """The segment's session: its model plus a `Shape` output per probed value (a few int64s
        instead of a copy of the tensor)."""
        if segment.index not in self._sessions:
            model = onnx.ModelProto()
            model.CopyFrom(self.segment_model(segment.index))
            for name in self._probes(segment):
                probe = SHAPE_PROBE + name
                model.graph.node.append(helper.make_node("Shape", [name], [probe]))
                model.graph.output.append(helper.make_tensor_value_info(probe, onnx.TensorProto.INT64, [None]))
            self._sessions[segment.index] = create_session(model, **self._session_kwargs)
        return self._sessions[segment.index]

    def run(self, feeds: Mapping[str, np.ndarray], **session_kwargs) -> dict[str, np.ndarray]:
        """Run the segments in order, each in its own onnxruntime session with the custom-op library
        (`session_kwargs` go to `sparse_lower.create_session`; sessions are kept for the next run with
        the same keywords). Returns the graph outputs by name: what the unpartitioned model returns."""
        missing = [name for name in self.graph.graph_inputs if name not in feeds]
        unknown = [name for name in feeds if name not in self.graph.graph_inputs]
        if missing or unknown:
            raise SparseLowerError(f"feeds do not match the graph inputs: missing {missing}, unknown {unknown}",
                                   fix=f"feed exactly {self.graph.graph_inputs}")
        if session_kwargs != self._session_kwargs:
            self._sessions.clear()
            self._session_kwargs = dict(session_kwargs)
        last_reader = {name: s.index for s in self.segments for name in s.inputs}
        keep = set(self.graph.graph_outputs)
        values = dict(feeds)
        values.update((t.name, numpy_helper.to_array(t)) for t in self.model.graph.initializer if t.name in keep)
        self._seen_shapes.clear()
        self._seen_bytes.clear()
        for segment in self.segments:
            probes = self._probes(segment)
            inputs = {name: values[name] for name in segment.inputs}
            results = self._session(segment).run(list(segment.outputs) + [SHAPE_PROBE + p for p in probes], inputs)
            outputs = dict(zip(segment.outputs, results))
            for name, value in {**inputs, **outputs}.items():
                self._seen_shapes[name] = value.shape
                self._seen_bytes[name] = value.nbytes
            probed = results[len(outputs):]
            self._seen_shapes.update((name, tuple(int(d) for d in shape)) for name, shape in zip(probes, probed))
            values.update(outputs)
            for name in segment.inputs:  # free what no later segment reads
                if last_reader[name] == segment.index and name not in keep:
                    del values[name]
        return {name: values[name] for name in self.graph.graph_outputs}

    # -- reports -----------------------------------------------------------------------------------

    def _bytes(self, name: str) -> int | None:
        static = tensor_bytes(self.types.static_shape(name), self.types.elem_type(name))
        return static if static is not None else self._seen_bytes.get(name)

    def segment_costs(self, segment: Segment) -> tuple[int | None, int | None, int | None]:
        """(MACs, bytes in, bytes out) of a segment: from static shapes, else from the shapes of the
        last run; None where neither gives one."""
        nodes = [self.graph.node(name) for name in segment.nodes]
        count = total(macs(node, self.types.static_shape) for node in nodes)
        if count is None and self._seen_shapes:
            seen = shapes_after_run(self.segment_model(segment.index), self._seen_shapes, self.types)
            count = total(macs(node, lambda name: self.types.static_shape(name) or seen.get(name)) for node in nodes)
        return (count, total(self._bytes(name) for name in segment.inputs),
                total(self._bytes(name) for name in segment.outputs))

    def summary(self, active: int | None = None) -> str:
        """A table: per segment its device, node count, op counts, MACs and bytes in and out. For a
        model lowered by sparse_lower, a second table gives each sparse layer's MACs per method
        (costs.py) at `active` sites, or at the model's `max_active` (its first level's) when it has one."""
        segments = self._segment_table()
        layers = layer_costs(self.model)
        capacity = json.loads(self._metadata.get("sparse_lower.options", "{}")).get("max_active")
        active = active or (capacity[0] if isinstance(capacity, list) else capacity)  # per level: the input's
        if not layers or not active:
            return segments
        return (f"{segments}\n\nsparse layers, MACs (millions) per method at {active:,} active sites:\n"
                + render(["sparse layer", "op", *METHODS], cost_rows(layers, active)))

    @property
    def _metadata(self) -> dict[str, str]:
        return {p.key: p.value for p in self.model.metadata_props}

    def _segment_table(self) -> str:

        def number(value: int | None) -> str:
            return "?" if value is None else f"{value:,}"

        rows = []
        for segment in self.segments:
            ops = Counter(op_label(self.graph.node(n)) for n in segment.nodes)
            cost = self.segment_costs(segment)
            rows.append([f"{segment.index:02d}", segment.device, len(segment.nodes),
                         ", ".join(f"{op} x{count}" for op, count in sorted(ops.items())), *map(number, cost)])
        return render(["segment", "device", "nodes", "ops", "MACs", "bytes in", "bytes out"], rows)

    def to_dot(self) -> str:
        """Graphviz DOT text: segments as clusters coloured by device, crossing tensors as labelled edges."""
        return picture.to_dot(self)

    def save_picture(self, path: str | os.PathLike) -> Path:
        """Draw the segment graph to a .png or .svg (needs matplotlib: the `picture` extra)."""
        return picture.save_picture(self, Path(path))


def partition(model: onnx.ModelProto | str | os.PathLike, devices: Sequence[str] = DEFAULT_DEVICES,
              support: Mapping[str, Predicate] | None = None, static_shapes: bool = True) -> Partition:
    """Assign every node of `model` to the first of `devices` that can run it and cut the graph into
    segments that run in order (segments.py says how).

    `support` maps device names to predicates (devices.py) that replace the built-in table of that
    device or add a device. `static_shapes=False` lets the nna take symbolic shapes.
    """
    model = load(model)
    devices = tuple(devices)
    predicates = {**device_table(static_shapes), **(support or {})}
    if not devices or len(set(devices)) != len(devices):
        raise SparseLowerError(f"devices {list(devices)} must be a non-empty list of distinct names")
    unknown = [device for device in devices if device not in predicates]
    if unknown:
        raise SparseLowerError(f"unknown devices {unknown}",
                               fix=f"use {', '.join(sorted(predicates))} or give their predicates in `support`")
    graph = NodeGraph(model)
    types = ValueTypes.of(model)
    by_index, reasons = assign(graph, types, devices, predicates)
    segments = cut(graph, by_index)
    assignment = {graph.names[i]: device for i, device in sorted(by_index.items())}
    return Partition(model, graph, types, segments, reasons, assignment, devices, static_shapes)
