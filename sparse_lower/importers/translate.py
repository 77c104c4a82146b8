"""The walk shared by every foreign format: each source node, in order, becomes source-op or standard
nodes, then the result is brought to the opset and IR version the rest of sparse_lower uses.

A format (nvidia.py, aimet.py) only says where things are in its nodes (`SourceFormat`): which nodes
are its convolutions and dense boundaries, in which input slots the features, indices, weights and
bias sit, how its exporter writes the submanifold flag, and how its graph inputs become source-op
inputs. What the nodes mean is the same for both (spconv's), and lives in spconv_layers.py and
standard_ops.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx
from onnx import version_converter

from ..errors import SparseLowerError
from ..names import node_label
from ..onnx_conventions import IR_VERSION, OPSET
from ..spconv_rules import runs_as_matmul
from .context import SparseTensor, Translation
from .spconv_layers import (Rulebooks, checked_bias, declared_grid, parse_layer, relaid_weight,
                            source_node)
from .standard_ops import parse_scatter_dense, scatter_dense, standard_node



@dataclass(frozen=True)
class Operands:
    """Where a format's node keeps its tensors (empty optional inputs as None)."""

    features: str
    weight: str | None = None
    bias: str | None = None
    indices: str | None = None


@dataclass(frozen=True)
class Reader:
    """The first conv or ScatterDense reading a graph input as its features, and the grid it declares
    for it (None where it declares none)."""

    where: str
    operands: Operands
    spatial_shape: tuple[int, ...] | None


class SourceFormat(Protocol):
    key: str  # "nvidia", "aimet" (Autoware has its own walk: autoware.py)
    title: str  # for messages
    engine: str  # the runtime the format is written for, for messages
    signature: str  # the ops that make a model this format, for messages
    domains: tuple[str, ...]  # the opset domains the format adds (dropped from the result)
    reads_coords_order: bool  # whether ScatterDense's `format` names the coordinates' axes
    rulebook_is_key: bool  # whether a conv's `rulebook` is spconv's indice_key
    one_tap_note: str  # said of a conv spconv runs as a matrix product, where the engine reads it otherwise

    def is_conv(self, node: onnx.NodeProto) -> bool: ...

    def is_scatter_dense(self, node: onnx.NodeProto) -> bool: ...

    def operands(self, node: onnx.NodeProto, where: str, t: Translation) -> Operands:
        """The operands of a conv or ScatterDense node (arity checked)."""

    def subm(self, present: dict, stride: tuple[int, ...], where: str, t: Translation) -> bool:
        """The submanifold flag of a conv whose attributes are `present`, as its exporter means it."""

    def declare_inputs(self, t: Translation, readers: dict[str, Reader]) -> None:
        """Turn the graph inputs into source-op inputs and register the sparse ones in `t`."""


def feature_readers(model: onnx.ModelProto, fmt: SourceFormat, t: Translation) -> dict[str, Reader]:
    """For each graph input read as features by a conv or ScatterDense, its first such reader."""
    inputs = {v.name for v in t.inputs}
    readers: dict[str, Reader] = {}
    for index, node in enumerate(model.graph.node):
        where = node_label(node, index)
        if fmt.is_conv(node):
            operands, grid = fmt.operands(node, where, t), declared_grid(node, where)
        elif fmt.is_scatter_dense(node):
            operands, grid = fmt.operands(node, where, t), parse_scatter_dense(node, where, t).input_spatial_shape
        else:
            continue
        if operands.features in inputs:
            readers.setdefault(operands.features, Reader(where, operands, grid))
    return readers


def input_grid(reader: Reader, name: str) -> tuple[int, ...]:
    """The grid of a sparse graph input: the one its first reader declares. No engine derives it (NVIDIA's
    takes it at run time, AIMET's from the traced indices), so a file without it cannot be imported."""
    if reader.spatial_shape is None:
        raise SparseLowerError(f"it reads the network input '{name}' but declares no input_spatial_shape: the "
                               f"grid of the input is unknown", reader.where,
                               "write input_spatial_shape (the voxel grid, in the order of the coordinates) on "
                               "the first layer")
    return reader.spatial_shape


def input_channels(t: Translation, name: str) -> int | None:
    """The channels of a sparse graph input as its shape declares them (None where it does not)."""
    dims = next(v for v in t.inputs if v.name == name).type.tensor_type.shape.dim
    return dims[1].dim_value if len(dims) == 2 and dims[1].HasField("dim_value") else None


def translate(model: onnx.ModelProto, widened: list[str], fmt: SourceFormat,
              leaky_relu_alpha: float | None) -> onnx.ModelProto:
    """The source-op form of a float32 model of `fmt` (see the package docstring for the contract);
    `widened` names the graph inputs and outputs that were float16 in the source; `leaky_relu_alpha` is
    the slope of a LeakyReLU activation (the files do not record it; None: torch's default, noted)."""
    t = Translation(model, fmt.key, fmt.title, widened, leaky_relu_alpha)
    fmt.declare_inputs(t, feature_readers(model, fmt, t))
    rulebooks = Rulebooks()
    opset = source_opset(model)
    for index, node in enumerate(model.graph.node):
        where = node_label(node, index)
        t.require_available(node, where)
        if fmt.is_conv(node):
            _conv(t, fmt, rulebooks, node, where)
        elif fmt.is_scatter_dense(node):
            operands = fmt.operands(node, where, t)
            order = scatter_dense(t, operands.features, node.output[0], node, where)
            if fmt.reads_coords_order:
                t.name_coords_axes(t.sparse[operands.features].root, order)
        elif node.domain == "":
            standard_node(t, node, where, opset)
        else:
            raise SparseLowerError(f"unknown op '{node.domain}::{node.op_type}' in a {fmt.title} model", where,
                                   "replace it with standard ONNX ops")
    model = to_target_versions(t.finish(fmt.domains, opset))
    t.check_standard_ops(model)
    return model


def _conv(t: Translation, fmt: SourceFormat, rulebooks: Rulebooks, node: onnx.NodeProto, where: str) -> None:
    operands = fmt.operands(node, where, t)
    x = t.sparse_input(operands.features, where)
    if operands.indices is not None:
        t.check_indices(operands.indices, x, where)
    weight = _float_constant(t, operands.weight, where, "weight")
    layer = parse_layer(node, where, weight.shape, x.spatial_shape,
                        lambda present, stride, at: fmt.subm(present, stride, at, t), t.note, fmt.engine,
                        fmt.rulebook_is_key)
    if x.channels is not None and layer.in_channels != x.channels:
        raise SparseLowerError(f"its weight {list(weight.shape)} takes {layer.in_channels} input channels but its "
                               f"input '{operands.features}' has {x.channels}", where,
                               "give the weight as spconv 2.x KRSC [Cout, *kernel_size, Cin] with Cin the input's "
                               "channels")
    if layer.quantization:
        t.quantization[where] = layer.quantization
    if fmt.one_tap_note and runs_as_matmul(layer.kind, layer.kernel_size, layer.stride):
        t.note(where, fmt.one_tap_note)
    inputs = [operands.features, x.coords, t.add_constant(f"{where}.W", relaid_weight(layer, weight))]
    if operands.bias is not None:
        bias = checked_bias(layer, _float_constant(t, operands.bias, where, "bias"))
        inputs.append(t.add_constant(f"{where}.B", bias))
    forward = None
    if layer.kind == "inverse":
        forward = rulebooks.forward_of(layer, x.coords)
        inputs += [""] * (4 - len(inputs)) + [forward.in_coords]
    output = node.output[0]
    features = t.fresh(f"{output}_linear") if layer.activation else output
    new_coords = t.fresh(f"{where}.coords")
    conv, extent = source_node(layer, inputs, [features, new_coords], t.node_name(where), t.note, forward)
    t.append(conv)
    coords = x.coords if layer.kind == "subm" else forward.in_coords if forward else new_coords
    rulebooks.register(layer, x.coords, coords)
    if layer.activation:
        alpha = {"alpha": t.leaky_relu_slope(where, fmt.engine)} if layer.activation == "LeakyRelu" else {}
        t.emit(layer.activation, [features], [output], f"{where}.activation", **alpha)
    t.sparse[output] = SparseTensor(coords, extent, layer.out_channels, x.root)


def _float_constant(t: Translation, name: str | None, where: str, role: str) -> np.ndarray:
    """A weight or bias: a float constant (integer values would need the quantisation scales the formats
    keep elsewhere)."""
    value = t.constant(name, where, role)
    if not np.issubdtype(value.dtype, np.floating):
        raise SparseLowerError(f"the {role} '{name}' is {value.dtype.name}, not float", where,
                               f"store the {role} as float16 or float32 (the float model's values)")
    return value


def source_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain == ""), OPSET)


def to_target_versions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert the standard ops to opset >= 17 (the formats export at 11) and stamp IR 10."""
    version = source_opset(model)
    if version < OPSET:
        try:
            model = version_converter.convert_version(model, OPSET)
        except Exception as error:  # the converter raises bare RuntimeErrors / ConvertErrors
            raise SparseLowerError(f"converting the standard ops from opset {version} to {OPSET} failed: "
                                   f"{error}", fix=f"export the model at opset {OPSET}") from error
    model.ir_version = IR_VERSION
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise SparseLowerError(f"the imported model is not valid ONNX: {error}",
                               fix="report this model: the importer should have refused it earlier") from error
    return model
