"""The state of one import: what every tensor of the source graph has become, and the graph being built.

A foreign format passes sparse tensors around as features only (NVIDIA) or as features plus an indices
tensor (AIMET); the source ops need each sparse tensor's coords explicitly. So the translation records, for
every features tensor that is sparse, the coords tensor its rows belong to (`SparseTensor`): a conv
makes new coords, a submanifold conv and element-wise ops keep them, and operations that combine two
sparse tensors can check that their rows line up.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import SparseLowerError, SparseLowerWarning
from ..names import UniqueNames
from ..onnx_conventions import IMPORT_KEY, SOURCE_DOMAIN
from ..spconv_rules import LEAKY_RELU_ALPHA
from .probe import folded_constant


@dataclass(frozen=True)
class SparseTensor:
    """The coords and grid of a sparse features tensor (the features are the tensor it is keyed by), and
    the coords of the graph input its rows descend from."""

    coords: str
    spatial_shape: tuple[int, ...]
    channels: int | None
    root: str

    @property
    def ndim(self) -> int:
        return len(self.spatial_shape)


class Translation:
    """The graph being built from a source graph, node by node, in the source's (topological) order,
    and what the import has to say about it (`note`, `quantization`, `coords`), which `finish`
    writes into the imported model's metadata."""

    def __init__(self, source: onnx.ModelProto, key: str, title: str, widened: list[str],
                 leaky_relu_alpha: float | None = None):
        graph = source.graph
        self.source = source
        self.key, self.title, self.widened = key, title, widened
        self.leaky_relu_alpha = leaky_relu_alpha  # the caller's slope for a LeakyReLU the file leaves open
        self.notes: list[str] = []
        self.assumed: dict[str, list[str]] = {}  # a value the file does not record, as read -> the nodes read so
        self.quantization: dict[str, dict] = {}  # node -> its int8 attributes (INT8 exports)
        self.coords: dict[str, dict] = {}  # a graph input of coordinates -> its columns and their extents
        self._int64: dict[str, str] = {}  # int32 coordinates -> their int64 Cast
        # Old exporters also list initializers as inputs; the weights are re-laid out under new names.
        self.inputs = [v for v in graph.input if v.name not in {t.name for t in graph.initializer}]
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.sparse: dict[str, SparseTensor] = {}
        # Rows a source op writes that are not registered as a SparseTensor (Autoware's): their coords and
        # width, for the check of the standard ops around them (check_standard_ops).
        self.rows: dict[str, tuple[str, int]] = {}
        self.coords_alias: dict[str, str] = {}  # a source indices tensor -> the coords it stands for
        self.available = {v.name for v in graph.input} | set(self.initializers) | {""}
        self._tensor_names = UniqueNames([*self.available, *(o for n in graph.node for o in n.output)])
        self._node_names = {n.name for n in graph.node if n.name}
        self._node_names_used: set[str] = set()

    # -- names ---------------------------------------------------------------------------------------

    def taken(self, name: str) -> bool:
        """Whether a tensor of the source or of the graph being built has this name."""
        return name in self._tensor_names

    def fresh(self, stem: str) -> str:
        """A tensor name not used anywhere in the source or the graph being built."""
        return self._tensor_names.fresh(stem)

    def node_name(self, stem: str) -> str:
        """A node name unique in the graph being built (lowering passes refuse duplicates)."""
        name, counter = stem, 1
        while name in self._node_names_used or (name != stem and name in self._node_names):
            name, counter = f"{stem}_{counter}", counter + 1
        self._node_names_used.add(name)
        return name

    # -- what the import reports ------------------------------------------------------------------------

    def note(self, where: str, message: str) -> None:
        """Something imported differently from what the source declares (a stale attribute, an ambiguity
        between a format's writer and reader): warned now, and kept in the model's metadata."""
        text = f"node '{where}': {message}" if where else message
        self.notes.append(text)
        warnings.warn(text, SparseLowerWarning, stacklevel=2)

    def leaky_relu_slope(self, where: str, engine: str) -> float:
        """The slope of a LeakyReLU whose file does not record it: the caller's, else torch's default
        (noted, since the exporter dropped the module's own and the engine uses its own)."""
        if self.leaky_relu_alpha is not None:
            return self.leaky_relu_alpha
        self.assumed.setdefault(f"LeakyReLU slope {LEAKY_RELU_ALPHA}", []).append(where)
        self.note(where, f"activation='LeakyReLU' does not say its slope: read as {LEAKY_RELU_ALPHA} (torch's "
                         f"LeakyReLU default); the exporter drops the module's act_alpha and {engine} uses its "
                         f"own. If the network used another, give it: import_model(..., leaky_relu_alpha=…) or "
                         f"`convert --leaky-relu-alpha`")
        return LEAKY_RELU_ALPHA

    def describe_coords(self, name: str, columns: list[str], extents: list[int | None]) -> None:
        """Say what a graph input of coordinates holds, column by column: "batch" or a spatial axis
        ("d<i>": axis i of the first layer's grid, or the letter a format names it by), and the extent of
        each spatial column (None for the batch). `sparse-lower convert` draws its random inputs from it."""
        self.coords[name] = {"columns": columns, "extents": extents}

    def name_coords_axes(self, coords: str, order: str) -> None:
        """Name the spatial columns of a coords input by the letters a format declares (e.g. "zyx")."""
        columns = self.coords[coords]["columns"]
        if len(order) == len(columns) - 1:
            columns[1:] = list(order)

    def int64_coords(self, indices: str, where: str) -> str:
        """The source ops' int64 coordinates of an int32 indices tensor of the source (one Cast per tensor)."""
        if indices not in self._int64:
            self._int64[indices] = self.fresh(f"{indices}_int64")
            self.emit("Cast", [indices], [self._int64[indices]], f"{where}.coords", to=TensorProto.INT64)
        return self._int64[indices]

    # -- reading the source ---------------------------------------------------------------------------

    def require_available(self, node: onnx.NodeProto, where: str) -> None:
        for name in node.input:
            if name not in self.available:
                raise SparseLowerError(f"reads '{name}' before any node produces it", where,
                                       "sort the graph topologically (every input produced before it is read)")

    def is_constant(self, name: str) -> bool:
        """Whether `name` is known before run time: an initializer, or what standard ops compute from
        constants alone (folded once: exporters and tools put Identity, Constant, Cast, Reshape or
        Transpose nodes around weights)."""
        if name not in self.constants:
            value = folded_constant(self.source, name)
            if value is None:
                return False
            self.constants[name] = value
        return True

    def constant(self, name: str, where: str, role: str) -> np.ndarray:
        """A weight or bias (see is_constant)."""
        if not self.is_constant(name):
            raise SparseLowerError(f"the {role} '{name}' is not a constant (it is computed at run time)", where,
                                   f"store the {role} as an initializer, or compute it from constants only")
        return self.constants[name]

    def sparse_input(self, name: str, where: str, role: str = "features") -> SparseTensor:
        if self.is_constant(name):  # e.g. aimet_torch's dense form SparseConvolution(dense, W, B)
            raise SparseLowerError(f"the {role} '{name}' are a constant: the node's inputs are not in the order "
                                   f"its format writes them", where,
                                   "export the sparse form of the layer (features from the sparse input or a "
                                   "sparse layer)")
        if name not in self.sparse:
            raise SparseLowerError(f"the {role} '{name}' are not a sparse tensor", where,
                                   "feed the output of a sparse layer (or the sparse graph input)")
        return self.sparse[name]

    def check_indices(self, indices: str, x: SparseTensor, where: str) -> None:
        """An explicit indices input (AIMET) must be the coords the features sit on, or the network's input
        indices their rows descend from (an exporter may pass those to every layer, leaving the layer's
        own coords implied, as NVIDIA's engine does); any other tensor contradicts the graph."""
        if self.coords_alias.get(indices, indices) not in (x.coords, x.root):
            raise SparseLowerError(f"the indices '{indices}' are neither the coordinates of its features "
                                   f"('{x.coords}') nor the network's input indices ('{x.root}')", where,
                                   "pass the indices produced together with these features")

    # -- building -------------------------------------------------------------------------------------

    def append(self, node: onnx.NodeProto) -> None:
        """Add a node whose name came from `node_name`; its outputs become readable."""
        self.nodes.append(node)
        self.available.update(node.output)

    def emit(self, op_type: str, inputs: list[str], outputs: list[str], name: str, domain: str = "",
             **attrs) -> onnx.NodeProto:
        node = helper.make_node(op_type, inputs, outputs, name=self.node_name(name), domain=domain, **attrs)
        self.append(node)
        return node

    def add_constant(self, stem: str, value: np.ndarray) -> str:
        name = self.fresh(stem)
        self.initializers[name] = numpy_helper.from_array(value, name)
        self.constants[name] = value
        return name

    def add_sparse_input(self, features: str, coords: str, x: SparseTensor, rows: str) -> None:
        """Register a graph input pair. Their row count becomes the symbol `rows`: exporters declare the
        row count of the frame they traced, and every other frame has another."""
        self.sparse[features] = x
        self.describe_coords(coords, ["batch", *(f"d{axis}" for axis in range(x.ndim))], [None, *x.spatial_shape])
        self.available.update((features, coords))
        self._tensor_names.add(coords)
        for value in self.inputs:
            if value.name in (features, coords) and value.type.tensor_type.shape.dim:
                value.type.tensor_type.shape.dim[0].Clear()
                value.type.tensor_type.shape.dim[0].dim_param = rows

    def finish(self, source_domains: tuple[str, ...], default_opset: int) -> onnx.ModelProto:
        """The translated model: the source's opset for the standard ops (`default_opset` where it declares
        none), `sparse` v1, and every sparse graph output accompanied by its coords (their rows are
        meaningless without them). An INT8 export is said once: a user who converts one may expect int8
        arithmetic, and gets the float network it was calibrated on."""
        if self.quantization:
            self.note("", f"an INT8 export ({len(self.quantization)} nodes carry ranges): computed in float32 from "
                          f"the stored weights; the ranges are kept, unused, in the metadata '{IMPORT_KEY}' "
                          f"under 'quantization'")
        outputs = list(self.source.graph.output)
        for value in outputs:  # onnx.checker requires a shape on every graph output
            if not value.type.tensor_type.HasField("shape"):
                raise SparseLowerError(f"graph output '{value.name}' declares no shape",
                                       fix="declare its shape ([N, C] for sparse features; unknown dims may be "
                                           "symbolic)")
        for value in self.source.graph.output:
            if value.name in self.sparse:
                x = self.sparse[value.name]
                rows = f"{value.name}_rows"
                value.CopyFrom(helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type,
                                                             [rows, x.channels]))
                name = self.fresh(f"{value.name}_coords")
                self.emit("Identity", [x.coords], [name], f"{value.name}_coords")
                outputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, [rows, 1 + x.ndim]))
        nodes = _live(self.nodes, {o.name for o in outputs})
        used = {i for n in nodes for i in n.input} | {o.name for o in outputs}
        graph = helper.make_graph(nodes, self.source.graph.name or "imported", self.inputs, outputs,
                                  [t for name, t in self.initializers.items() if name in used])
        opsets = [o for o in self.source.opset_import if o.domain not in (*source_domains, SOURCE_DOMAIN)]
        if not any(o.domain == "" for o in opsets):
            opsets.append(helper.make_opsetid("", default_opset))
        opsets.append(helper.make_opsetid(SOURCE_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.producer_name = self.source.producer_name
        model.producer_version = self.source.producer_version
        model.doc_string = self.source.doc_string
        helper.set_model_props(model, {**{p.key: p.value for p in self.source.metadata_props},
                                       IMPORT_KEY: json.dumps(self.report())})
        return model

    def check_standard_ops(self, model: onnx.ModelProto) -> None:
        """The standard ops kept as the file has them must agree on the types and shapes of their inputs:
        inferred strictly with every source op's output rows declared ([rows of its coords, width]), so that
        a bias of the wrong width or type on a conv's rows is refused here, naming its node, rather than by
        onnxruntime after lowering. What this infers for the source ops' inputs that standard ops compute
        (Autoware's int64 Cast of its indices) is declared in `model`, where the lowering's checks of the
        source ops read it (coords of the wrong width or rank, features of the wrong channels)."""
        rows = {**{name: (x.coords, x.channels) for name, x in self.sparse.items()}, **self.rows}
        # onnx infers nothing after an op it has no schema for: the source ops are cut out, their outputs
        # made inputs of the probe, declared as what they are
        probe = onnx.ModelProto.FromString(model.SerializeToString())
        graph = probe.graph
        # exporters' own guesses about the tensors around custom ops are no evidence (onnxruntime ignores them)
        del graph.value_info[:]
        for output in graph.output:
            output.type.tensor_type.ClearField("shape")
        cut = [node for node in graph.node if node.domain == SOURCE_DOMAIN]
        kept = [node for node in graph.node if node.domain != SOURCE_DOMAIN]
        del graph.node[:]
        graph.node.extend(kept)
        for node in cut:
            for index, name in enumerate(node.output):
                # a conv's or ToSparse's second output is its int64 coords; every other output is float
                coords = index == 1 and node.op_type != "ToDense"
                source, width = rows.get(name, (None, None))
                shape = [f"{source}_rows", width] if width is not None else None
                graph.input.append(helper.make_tensor_value_info(
                    name, TensorProto.INT64 if coords else TensorProto.FLOAT, shape))
        try:
            inferred = onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True)
        except onnx.shape_inference.InferenceError as error:
            # onnx's message: "[ShapeInferenceError] (op_type:Add, node name: add0): B has inconsistent type ..."
            found = re.search(r"\(op_type:[^,]*, node name: ([^)]*)\): (.*)", str(error))
            node, message = found.groups() if found else (None, str(error).strip().splitlines()[-1])
            raise SparseLowerError(f"its inputs disagree in type or shape: {message.strip()}", node,
                                   "give the node inputs of the types and shapes the network computes (as the "
                                   "exporter wrote it)") from error
        computed = {name for node in cut for name in node.input} & {o for node in kept for o in node.output}
        declared = {v.name for v in model.graph.value_info}
        model.graph.value_info.extend(v for v in inferred.graph.value_info
                                      if v.name in computed - declared and v.type.tensor_type.elem_type)

    def report(self) -> dict:
        """What the import did, for the imported model's metadata."""
        report = {"format": self.key, "title": self.title, "float16_to_float32": self.widened,
                  "coords": self.coords, "notes": self.notes, "assumed": self.assumed}
        if self.quantization:
            report["quantization"] = {"computed_as": "float32 from the stored weights; the ranges below are "
                                                     "the source's int8 calibration, kept here unused",
                                      "nodes": self.quantization}
        return report


def _live(nodes: list[onnx.NodeProto], wanted: set[str]) -> list[onnx.NodeProto]:
    """The nodes some graph output depends on, in order. The translation emits a few tensors that may
    go unread (AIMET's indices outputs, the coords of the last conv); what nothing reads is dropped,
    along with the weights only it used."""
    wanted = set(wanted)
    live = []
    for node in reversed(nodes):
        if any(name in wanted for name in node.output):
            live.append(node)
            wanted.update(node.input)
    return live[::-1]
