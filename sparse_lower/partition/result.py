"""`Partition`, what the partitioner returns: the segments in execution order, each exportable as its
own ONNX model (segment_files.py) with the manifest that connects them, and runnable in order in onnxruntime.
Its summary and pictures are made by reports.py and picture.py from what it holds; a per-layer table
the caller knows (the lowering's MACs per method, from sparse_lower.partition) comes in as `layer_table`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import SparseLowerError
from ..model_io import output_folder
from ..onnx_conventions import STANDARD_DOMAINS
from ..runtime import RUNTIME_ERRORS, runtime_refusal, session_for
from ..verify import given_inputs
from . import picture, reports, segment_files
from .node_costs import Seen
from .segments import NodeGraph, Segment
from .value_types import ValueTypes

SHAPE_PROBE = "sparse_lower.partition/shape_of/"  # prefix of the extra outputs that report shapes at run time
LayerTable = Callable[[int | None], "str | None"]  # active sites (None: its default) -> a table to append, or None


class Partition:
    """A model cut into device segments that run in order.

    `segments` lists them in execution order; `reasons[node][device]` says why `device` refused `node`
    (for every device that did); `assignment[node]` is the device the node runs on. `Constant` nodes
    are in neither: each segment that reads one embeds a copy, as it embeds initializers. `seen` holds
    the shapes and bytes the last run saw (empty before any), which the summary falls back on.
    """

    def __init__(self, model: onnx.ModelProto, graph: NodeGraph, types: ValueTypes, segments: list[Segment],
                 reasons: dict[str, dict[str, str]], assignment: dict[str, str], devices: tuple[str, ...],
                 static_shapes: bool, layer_table: LayerTable | None = None):
        self.model = model
        self.graph = graph
        self.types = types
        self.segments = segments
        self.reasons = reasons
        self.assignment = assignment
        self.devices = devices
        self.static_shapes = static_shapes
        self.layer_table = layer_table
        self.seen = Seen()
        self._models: dict[int, onnx.ModelProto] = {}
        self._sessions: dict[int, object] = {}
        self._session_kwargs: dict | None = None

    # -- export ------------------------------------------------------------------------------------

    def segment_model(self, index: int) -> onnx.ModelProto:
        """Segment `index` as a standalone ONNX model (built once)."""
        if index not in self._models:
            self._models[index] = segment_files.segment_model(self.model, self.graph, self.types, self.segments[index])
        return self._models[index]

    def manifest(self) -> dict:
        return segment_files.manifest(self.graph, self.types, self.segments, self.devices, self.static_shapes)

    def to_onnx(self, directory: str | os.PathLike) -> Path:
        """Write one model per segment (`00_gpu.onnx`, `01_nna.onnx`, …) and `manifest.json` into
        `directory`; returns the manifest's path."""
        directory = output_folder(directory, "the partition's folder")
        for segment in self.segments:
            onnx.save(self.segment_model(segment.index), directory / segment_files.segment_file(segment))
        path = directory / "manifest.json"
        path.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        return path

    # -- run ---------------------------------------------------------------------------------------

    def _probes(self, segment: Segment) -> list[str]:
        """Values inside the segment that custom ops produce: ONNX shape inference cannot see through
        those, so a run reports their shapes (see node_costs.shapes_after_run)."""
        boundary = set(segment.inputs) | set(segment.outputs)
        return [name for node in map(self.graph.node, segment.nodes) if node.domain not in STANDARD_DOMAINS
                for name in node.output if name and name not in boundary]

    def _session(self, segment: Segment):
        """The segment's session: its model plus a `Shape` output per probed value (a few int64s
        instead of a copy of the tensor); with the library where the segment runs custom ops, a plain
        onnxruntime session otherwise."""
        if segment.index not in self._sessions:
            model = onnx.ModelProto()
            model.CopyFrom(self.segment_model(segment.index))
            for name in self._probes(segment):
                probe = SHAPE_PROBE + name
                model.graph.node.append(helper.make_node("Shape", [name], [probe]))
                model.graph.output.append(helper.make_tensor_value_info(probe, onnx.TensorProto.INT64, [None]))
            self._sessions[segment.index] = session_for(model, **self._session_kwargs)
        return self._sessions[segment.index]

    def run(self, feeds: Mapping[str, np.ndarray], **session_kwargs) -> dict[str, np.ndarray]:
        """Run the segments in order, each in its own onnxruntime session, with the custom-op library where
        it runs custom ops (`session_kwargs` go to `sparse_lower.create_session`, or to a plain session;
        sessions are kept for the next run with the same keywords). Returns the graph outputs by name:
        what the unpartitioned model returns."""
        missing = [name for name in self.graph.graph_inputs if name not in feeds]
        unknown = [name for name in feeds if name not in self.graph.graph_inputs]
        if missing or unknown:
            raise SparseLowerError(f"feeds do not match the graph inputs: missing {missing}, unknown {unknown}",
                                   fix=f"feed exactly {self.graph.graph_inputs}")
        feeds = given_inputs(self.model, dict(feeds), "the feeds")  # float16 features, int32 coords: as the CLI casts
        if session_kwargs != self._session_kwargs:
            self._sessions.clear()
            self._session_kwargs = dict(session_kwargs)
        last_reader = {name: s.index for s in self.segments for name in s.inputs}
        keep = set(self.graph.graph_outputs)
        values = dict(feeds)
        values.update((t.name, numpy_helper.to_array(t)) for t in self.model.graph.initializer if t.name in keep)
        self.seen = seen = Seen()
        for segment in self.segments:
            probes = self._probes(segment)
            inputs = {name: values[name] for name in segment.inputs}
            try:
                results = self._session(segment).run(list(segment.outputs) + [SHAPE_PROBE + p for p in probes], inputs)
            except RUNTIME_ERRORS as error:  # a frame over a capacity, off its grid: the op's words, its fix
                refusal = runtime_refusal(error)
                raise (refusal if isinstance(refusal, SparseLowerError) else
                       SparseLowerError(f"segment {segment.index}: {refusal}")) from error
            outputs = dict(zip(segment.outputs, results))
            for name, value in {**inputs, **outputs}.items():
                seen.shapes[name] = value.shape
                seen.nbytes[name] = value.nbytes
            probed = results[len(outputs):]
            seen.shapes.update((name, tuple(int(d) for d in shape)) for name, shape in zip(probes, probed))
            values.update(outputs)
            for name in segment.inputs:  # free what no later segment reads
                if last_reader[name] == segment.index and name not in keep:
                    del values[name]
        return {name: values[name] for name in self.graph.graph_outputs}

    # -- reports (reports.py, picture.py) -------------------------------------------------------------

    def segment_costs(self, segment: Segment) -> reports.Costs:
        """(MACs, bytes in, bytes out) of a segment: from static shapes, else from the shapes of the
        last run; None where neither gives one."""
        return reports.segment_costs(self.graph, self.types, segment, self.seen, self.segment_model)

    def summary(self, active: int | None = None, ops: int | None = None) -> str:
        """A table: per segment its device, node count, op counts (`ops`: only that many op types, the most
        frequent; None: all), MACs and bytes in and out; then the `layer_table` the partition was given,
        at `active` sites (None: the table's default), if it gives one. sparse_lower.partition gives each
        sparse layer's MACs per lowering method."""
        segments = reports.segment_table(self.graph, self.types, self.segments, self.seen, self.segment_model, ops)
        layers = self.layer_table(active) if self.layer_table else None
        return segments if layers is None else f"{segments}\n\n{layers}"

    def to_dot(self) -> str:
        """Graphviz DOT text: segments as clusters coloured by device, crossing tensors as labelled edges."""
        return picture.to_dot(self.graph, self.segments, self.devices)

    def save_picture(self, path: str | os.PathLike) -> Path:
        """Draw the segment graph to a .png or .svg (drawn with matplotlib, a dependency of the package)."""
        return picture.save_picture(self.graph, self.segments, self.devices, Path(path))
