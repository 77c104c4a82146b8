"""The walk shared by every foreign format: each source node, in order, becomes section-3 or standard
nodes, then the result is brought to the opset and IR version the rest of sparse_lower uses.

A format (nvidia.py, aimet.py) only says where things are in its nodes (`SourceFormat`): which nodes
are its convolutions and dense boundaries, in which input slots the features, indices, weights and
bias sit, and how its graph inputs become section-3 inputs. What the nodes mean is the same for both
(spconv's), and lives in spconv_layers.py and standard_ops.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import onnx
from onnx import version_converter

from ..errors import SparseLowerError
from .context import SparseTensor, Translation, label
from .spconv_layers import LEAKY_RELU_ALPHA, Rulebooks, checked_bias, parse_layer, relaid_weight, section3_node
from .standard_ops import parse_scatter_dense, scatter_dense, standard_node

IR_VERSION = 10  # onnxruntime 1.31 reads IR <= 13, but not every tool in the flow does
MIN_OPSET = 17  # the imported model uses opset-13+ forms (Reshape with a shape input, ...)
STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Operands:
    """Where a format's node keeps its tensors (empty optional inputs as None)."""

    features: str
    weight: str | None = None
    bias: str | None = None
    indices: str | None = None


@dataclass(frozen=True)
class Reader:
    """The first conv or ScatterDense reading a graph input as its features, and what it declares."""

    where: str
    operands: Operands
    spatial_shape: tuple[int, ...]
    channels: int | None


class SourceFormat(Protocol):
    key: str  # "nvidia", "aimet"
    title: str  # for messages
    domains: tuple[str, ...]  # the opset domains the format adds (dropped from the result)

    def is_conv(self, node: onnx.NodeProto) -> bool: ...

    def is_scatter_dense(self, node: onnx.NodeProto) -> bool: ...

    def operands(self, node: onnx.NodeProto, where: str) -> Operands:
        """The operands of a conv or ScatterDense node (arity checked)."""

    def indices_output(self, node: onnx.NodeProto, where: str) -> str | None:
        """The output carrying the conv's output indices, where the format has one."""

    def declare_inputs(self, t: Translation, readers: dict[str, Reader]) -> None:
        """Turn the graph inputs into section-3 inputs and register the sparse ones in `t`."""


def feature_readers(model: onnx.ModelProto, fmt: SourceFormat) -> dict[str, Reader]:
    """For each graph input read as features by a conv or ScatterDense, its first such reader."""
    inputs = {v.name for v in model.graph.input} - {t.name for t in model.graph.initializer}
    readers: dict[str, Reader] = {}
    for index, node in enumerate(model.graph.node):
        where = label(node, index)
        if fmt.is_conv(node):
            operands, layer = fmt.operands(node, where), parse_layer(node, where)
            grid, channels = layer.input_spatial_shape, layer.in_channels
        elif fmt.is_scatter_dense(node):
            operands = fmt.operands(node, where)
            grid, channels = parse_scatter_dense(node, where).input_spatial_shape, None
        else:
            continue
        if operands.features in inputs:
            readers.setdefault(operands.features, Reader(where, operands, grid, channels))
    return readers


def input_channels(t: Translation, name: str, reader: Reader) -> int | None:
    """The channels of a sparse graph input: as its shape declares them, else as its first reader does."""
    dims = next(v for v in t.inputs if v.name == name).type.tensor_type.shape.dim
    return dims[1].dim_value if len(dims) == 2 and dims[1].HasField("dim_value") else reader.channels


def translate(model: onnx.ModelProto, fmt: SourceFormat) -> onnx.ModelProto:
    """The section-3 form of a float32 model of `fmt` (see the package docstring for the contract)."""
    t = Translation(model)
    fmt.declare_inputs(t, feature_readers(model, fmt))
    rulebooks = Rulebooks()
    opset = source_opset(model)
    for index, node in enumerate(model.graph.node):
        where = label(node, index)
        t.require_available(node, where)
        if fmt.is_conv(node):
            _conv(t, fmt, rulebooks, node, where)
        elif fmt.is_scatter_dense(node):
            operands = fmt.operands(node, where)
            if operands.indices is not None:
                t.check_indices(operands.indices, t.sparse_input(operands.features, where), where)
            scatter_dense(t, operands.features, node.output[0], node, where)
        elif node.domain in STANDARD_DOMAINS:
            standard_node(t, node, where, opset)
        else:
            raise SparseLowerError(f"unknown op '{node.domain}::{node.op_type}' in a {fmt.title} model", where,
                                   "replace it with standard ONNX ops")
    return to_target_versions(t.finish(fmt.domains, opset))


def _conv(t: Translation, fmt: SourceFormat, rulebooks: Rulebooks, node: onnx.NodeProto, where: str) -> None:
    operands, layer = fmt.operands(node, where), parse_layer(node, where)
    x = t.sparse_input(operands.features, where)
    if operands.indices is not None:
        t.check_indices(operands.indices, x, where)
    _check_input(layer, x, where)
    inputs = [operands.features, x.coords,
              t.add_constant(f"{where}.W", relaid_weight(layer, t.constant(operands.weight, where, "weight")))]
    if operands.bias is not None:
        inputs.append(t.add_constant(f"{where}.B", checked_bias(layer, t.constant(operands.bias, where, "bias"))))
    forward = None
    if layer.kind == "inverse":
        forward = rulebooks.forward_of(layer, x.coords)
        inputs += [""] * (4 - len(inputs)) + [forward.in_coords]
    output = node.output[0]
    features = t.fresh(f"{output}_linear") if layer.activation else output
    new_coords = t.fresh(f"{where}.coords")
    conv, extent = section3_node(layer, inputs, [features, new_coords], t.node_name(where), forward)
    t.append(conv)
    coords = x.coords if layer.kind == "subm" else forward.in_coords if forward else new_coords
    rulebooks.register(layer, x.coords, coords)
    if layer.activation:
        alpha = {"alpha": LEAKY_RELU_ALPHA} if layer.activation == "LeakyRelu" else {}
        t.emit(layer.activation, [features], [output], f"{where}.activation", **alpha)
    t.sparse[output] = SparseTensor(coords, extent, layer.out_channels, x.root)
    indices = fmt.indices_output(node, where)
    if indices:
        t.coords_alias[indices] = coords
        t.emit("Identity", [coords], [indices], f"{where}.indices")


def _check_input(layer, x: SparseTensor, where: str) -> None:
    if layer.input_spatial_shape != x.spatial_shape:
        raise SparseLowerError(f"input_spatial_shape={list(layer.input_spatial_shape)} contradicts the grid "
                               f"{list(x.spatial_shape)} of its input", where, "correct input_spatial_shape")
    if x.channels is not None and layer.in_channels != x.channels:
        raise SparseLowerError(f"in_channels={layer.in_channels} but its input has {x.channels} channels", where,
                               "correct in_channels (and the weight)")


def source_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), MIN_OPSET)


def to_target_versions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert the standard ops to opset >= 17 (the formats export at 11) and stamp IR 10."""
    version = source_opset(model)
    if version < MIN_OPSET:
        try:
            model = version_converter.convert_version(model, MIN_OPSET)
        except Exception as error:  # the converter raises bare RuntimeErrors / ConvertErrors
            raise SparseLowerError(f"converting the standard ops from opset {version} to {MIN_OPSET} failed: "
                                   f"{error}", fix=f"export the model at opset {MIN_OPSET}") from error
    model.ir_version = IR_VERSION
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise SparseLowerError(f"the imported model is not valid ONNX: {error}",
                               fix="report this model: the importer should have refused it earlier") from error
    return model
