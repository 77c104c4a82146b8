"""Everything in a foreign graph that is not a sparse convolution: the dense boundary (`ScatterDense`),
the ops written with non-standard attributes, and the standard ops, dense or on sparse features.

* `ScatterDense` → `ToDense`, whose output is spconv's `.dense()`: `[B, C, *S]` with the spatial axes
  in the coordinates' order (the order of `input_spatial_shape`). `format` does not transpose anything:
  it names that order ("zyx" for CenterPoint and BEVFusion's default export, "xyz" for BEVFusion's
  `--origin` export, whose following `Transpose` then reorders the axes; AIMET always writes "xyz").
  A Reshape follows where the declared `output_shape` folds axes together. An `output_shape` that
  neither matches nor folds the dense shape is a contradiction and is refused. The INT8 export's
  `input_dynamic_range` is kept in the metadata; `output_layout` "NCHW32"/"NHWzC" (TensorRT's
  vectorised layouts) is noted: the imported model's output is the logical NCHW tensor.
* NVIDIA's `Reshape` with a `dims` attribute and no shape input → `Reshape` with a shape initializer;
  `Transpose` with `dims` → `Transpose` with `perm`; `QuantAdd` (and `Add` with the INT8 export's
  range attributes) → `Add`, the ranges kept in the metadata.
* Standard ops on sparse features: only element-wise ones (activations, BatchNormalization, Add/Mul/...
  with a per-channel constant or another sparse tensor on the same coords, channel Concat). They act on
  the rows and keep the coords; anything else would mix rows whose meaning depends on the coords.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import SparseLowerError
from ..onnx_conventions import SOURCE_DOMAIN
from .context import SparseTensor, Translation
from .spconv_layers import PRECISIONS, attribute_values, check_dynamic_range, quantization

_UNARY = {"Abs", "BatchNormalization", "Cast", "Ceil", "Celu", "Clip", "Elu", "Erf", "Exp", "Floor", "Gelu",
          "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Mish", "Neg", "Reciprocal", "Relu",
          "Round", "Selu", "Sigmoid", "Sign", "Softplus", "Softsign", "Sqrt", "Tanh", "ThresholdedRelu"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum"}
# The INT8 export's attributes on an element-wise Add (libspconv's push_add reads them).
_ADD_QUANTIZATION = ("input0_dynamic_range", "input1_dynamic_range", "precision", "output_precision")
_LAYOUTS = ("NCHW", "NCHW32", "NHWzC")


# -- ScatterDense ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScatterDense:
    """The validated attributes of a ScatterDense node."""

    input_spatial_shape: tuple[int, ...]
    coords_order: str  # `format`: the letters of the coordinates' spatial columns ("zyx", "xyz")
    output_shape: tuple[int, ...]


def parse_scatter_dense(node: onnx.NodeProto, where: str, t: Translation) -> ScatterDense:
    values = attribute_values(node, where)
    unknown = set(values) - {"input_spatial_shape", "format", "output_shape", "input_dynamic_range", "output_layout"}
    for name in sorted(unknown):
        t.note(where, f"ScatterDense attribute '{name}' is not one the exporters write; ignored")
    for name in ("input_spatial_shape", "output_shape"):
        value = values.get(name)
        if not isinstance(value, list) or not value or not all(isinstance(v, int) for v in value):
            raise SparseLowerError(f"attribute '{name}' is missing or not a list of ints", where,
                                   f"write {name} as a list of ints")
    grid, shape = tuple(values["input_spatial_shape"]), tuple(values["output_shape"])
    if not 1 <= len(grid) <= 3 or min(grid) < 1:
        raise SparseLowerError(f"input_spatial_shape={list(grid)} is invalid", where, "give 1 to 3 extents >= 1")
    layout = values.get("format", "zyx")
    if not isinstance(layout, str) or layout.lower() not in ("xyz", "zyx"):
        raise SparseLowerError(f"attribute 'format'={layout!r} is not understood", where,
                               "use 'zyx' or 'xyz' (the order of the coordinates' spatial columns)")
    if min(shape) < 1:
        raise SparseLowerError(f"output_shape={list(shape)} is not static", where,
                               "write the dense shape with a static batch size")
    return ScatterDense(grid, layout.lower(), shape)


def _engine_attributes(t: Translation, node: onnx.NodeProto, where: str, values: dict) -> None:
    """Record ScatterDense's INT8 attributes; note a vectorised output layout."""
    found = quantization(where, {k: v for k, v in values.items() if k == "input_dynamic_range"})
    if found:
        t.quantization[where] = found
    layout = values.get("output_layout", "NCHW")
    if layout not in _LAYOUTS:
        raise SparseLowerError(f"attribute 'output_layout'={layout!r} is not understood", where,
                               f"use one of {', '.join(_LAYOUTS)}")
    if layout != "NCHW":
        t.note(where, f"output_layout={layout}: TensorRT's vectorised layout of the same tensor; the imported "
                      f"model outputs it as plain NCHW")


def scatter_dense(t: Translation, features: str, output: str, node: onnx.NodeProto, where: str) -> str:
    """Emit ToDense (+ Reshape) producing `output` with the source's declared shape; return the format's
    coordinate order."""
    attrs = parse_scatter_dense(node, where, t)
    _engine_attributes(t, node, where, attribute_values(node, where))
    x = t.sparse_input(features, where)
    if attrs.input_spatial_shape != x.spatial_shape:
        raise SparseLowerError(f"input_spatial_shape={list(attrs.input_spatial_shape)} contradicts the grid "
                               f"{list(x.spatial_shape)} of its input", where, "correct input_spatial_shape")
    batch, channels = attrs.output_shape[0], x.channels
    if channels is None:
        raise SparseLowerError(f"the channels of '{features}' are unknown", where,
                               "declare the feature input's shape as [N, C]")
    dense = (batch, channels, *x.spatial_shape)
    to_dense = dict(domain=SOURCE_DOMAIN, spatial_shape=list(x.spatial_shape), batch_size=batch)
    if attrs.output_shape == dense:
        t.emit("ToDense", [features, x.coords], [output], where, **to_dense)
        return attrs.coords_order
    if len(attrs.output_shape) == len(dense) or prod(attrs.output_shape) != prod(dense):
        raise SparseLowerError(f"output_shape={list(attrs.output_shape)} is neither the dense shape {list(dense)} "
                               f"(batch, channels, then the grid in the coordinates' order) nor a folding of it",
                               where, "correct output_shape")
    unfolded = t.fresh(f"{output}_todense")
    t.emit("ToDense", [features, x.coords], [unfolded], where, **to_dense)
    shape = t.add_constant(f"{output}_shape", np.asarray(attrs.output_shape, np.int64))
    t.emit("Reshape", [unfolded, shape], [output], f"{where}.reshape")
    return attrs.coords_order


# -- standard ops -------------------------------------------------------------------------------------

def _standardized(t: Translation, node: onnx.NodeProto, where: str) -> onnx.NodeProto:
    """The node with NVIDIA's non-standard forms made standard: `dims` of Reshape/Transpose, `QuantAdd`
    and the INT8 export's range attributes on Add (kept in the metadata)."""
    if node.op_type in ("Add", "QuantAdd") and (node.op_type == "QuantAdd" or any(
            a.name in _ADD_QUANTIZATION for a in node.attribute)):
        return _plain_add(t, node, where)
    dims = next((a for a in node.attribute if a.name == "dims"), None)
    if dims is None or node.op_type not in ("Reshape", "Transpose"):
        return node
    others = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "dims"}
    value = list(dims.ints)
    if node.op_type == "Reshape":
        if len(node.input) > 1:
            raise SparseLowerError("Reshape has both a shape input and a 'dims' attribute", where,
                                   "keep one of them")
        shape = t.add_constant(f"{node.output[0]}_shape", np.asarray(value, np.int64))
        return helper.make_node("Reshape", [node.input[0], shape], list(node.output), name=node.name, **others)
    if "perm" in others and list(others["perm"]) != value:
        raise SparseLowerError(f"Transpose has perm={others['perm']} and dims={value}", where, "keep one of them")
    others["perm"] = value
    return helper.make_node("Transpose", list(node.input), list(node.output), name=node.name, **others)


def _plain_add(t: Translation, node: onnx.NodeProto, where: str) -> onnx.NodeProto:
    """libspconv's (Quant)Add with its int8 ranges → a standard Add; the ranges go to the metadata."""
    values = attribute_values(node, where)
    unknown = sorted(set(values) - set(_ADD_QUANTIZATION))
    if unknown:
        raise SparseLowerError(f"{node.op_type} has no attribute {', '.join(unknown)}", where,
                               f"remove it; {node.op_type} takes {', '.join(_ADD_QUANTIZATION)}")
    for name in ("precision", "output_precision"):
        if name in values and (not isinstance(values[name], str) or values[name].lower() not in PRECISIONS):
            raise SparseLowerError(f"attribute '{name}'={values[name]!r} is not a precision", where,
                                   f"write one of {', '.join(PRECISIONS)}")
    for name in ("input0_dynamic_range", "input1_dynamic_range"):
        if name in values:
            check_dynamic_range(where, name, values[name])
    if values:
        t.quantization[where] = values
    if len(node.input) != 2:
        raise SparseLowerError(f"{node.op_type} takes two inputs, got {len(node.input)}", where,
                               "add two tensors per node")
    return helper.make_node("Add", list(node.input), list(node.output), name=node.name)


def check_schema(node: onnx.NodeProto, where: str, opset: int) -> None:
    if not onnx.defs.has(node.op_type):
        raise SparseLowerError(f"unknown op '{node.op_type}'", where,
                               "replace it with standard ONNX ops (or a sparse_lower source op)")
    try:
        schema = onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        raise SparseLowerError(f"'{node.op_type}' does not exist at opset {opset}", where,
                               "export the model at a newer opset") from None
    unknown = [a.name for a in node.attribute if a.name not in schema.attributes]
    if unknown:
        raise SparseLowerError(f"{node.op_type} has no attribute {', '.join(unknown)}", where,
                               f"remove it; {node.op_type} takes {', '.join(sorted(schema.attributes)) or 'none'}")


def _sparse_result(t: Translation, node: onnx.NodeProto, where: str) -> SparseTensor:
    """The sparse tensor an op on sparse features produces (same coords), or a refusal."""
    sparse = [t.sparse[name] for name in node.input if name in t.sparse]
    if node.op_type in _UNARY:
        if node.input[0] not in t.sparse or len(sparse) > 1:
            raise SparseLowerError(f"{node.op_type} takes the sparse features only as its first input", where,
                                   "feed its other inputs with constants")
        return sparse[0]
    if node.op_type in _BINARY or node.op_type == "Concat":
        if len({x.coords for x in sparse}) > 1:
            raise SparseLowerError(f"{node.op_type} of sparse tensors on different coordinates "
                                   f"({', '.join(sorted({x.coords for x in sparse}))})", where,
                                   "combine only tensors on the same coords (e.g. a residual around "
                                   "submanifold convs, or a conv and the inverse of its rulebook)")
        if node.op_type == "Concat":
            return _channel_concat(node, where, sparse)
        for name in node.input:
            if name not in t.sparse:
                _check_per_channel(t, name, node, where, sparse[0].channels)
        return sparse[0]
    name = next(name for name in node.input if name in t.sparse)
    raise SparseLowerError(f"{node.op_type} cannot take the sparse features '{name}': their rows only mean "
                           f"something with their coords", where,
                           "apply element-wise ops only, or densify first (ScatterDense)")


def _check_per_channel(t: Translation, name: str, node, where: str, channels: int | None) -> None:
    value = t.constants.get(name)
    if value is None:
        raise SparseLowerError(f"{node.op_type} mixes sparse features with '{name}', which is neither sparse "
                               f"nor a constant", where, "use a constant (a per-channel value) or sparse features")
    shape = value.shape
    if len(shape) > 2 or (len(shape) == 2 and shape[0] != 1) or (
            shape and shape[-1] not in (1, channels) and channels is not None):
        raise SparseLowerError(f"the constant '{name}' of shape {list(shape)} is not per-channel", where,
                               f"give a scalar, [{channels}] or [1, {channels}] constant")


def _channel_concat(node, where, sparse: list[SparseTensor]) -> SparseTensor:
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    if len(sparse) != len(node.input) or axis not in (1, -1):
        raise SparseLowerError("Concat of sparse features must join sparse tensors along the channels", where,
                               "concatenate sparse features on axis 1 only")
    channels = [x.channels for x in sparse]
    total = None if None in channels else sum(channels)
    return SparseTensor(sparse[0].coords, sparse[0].spatial_shape, total, sparse[0].root)


def standard_node(t: Translation, node: onnx.NodeProto, where: str, opset: int) -> None:
    """Copy a default-domain node (made standard), tracking sparse features through element-wise ops."""
    node = _standardized(t, node, where)
    check_schema(node, where, opset)
    sparse = _sparse_result(t, node, where) if any(name in t.sparse for name in node.input) else None
    copy = helper.make_node(node.op_type, list(node.input), list(node.output), name=t.node_name(where))
    copy.attribute.extend(node.attribute)
    t.append(copy)
    if sparse is not None:
        t.sparse[node.output[0]] = sparse
    if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name != "sparse_value":
        value = helper.get_attribute_value(node.attribute[0])
        t.constants[node.output[0]] = (numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto)
                                       else np.asarray(value))
