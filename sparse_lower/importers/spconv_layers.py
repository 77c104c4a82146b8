"""One spconv `SparseConvolution` node (NVIDIA or AIMET attributes) → one section-3 node.

Both formats serialise an spconv 2.x module with the same attribute names, so this module is the one
place that knows spconv's semantics (DESIGN.md §6) and maps them onto DESIGN.md §3:

* `subm=1` → `SubmanifoldConv`: spconv's submanifold conv is centred and ignores `padding`, so no
  pads are written;
* `transposed=1` → `SparseDeconv`: spconv's output extent `(S−1)·s − 2p + K + output_padding` ignores
  the dilation, while its taps use it, so a dilated transposed conv has no section-3 equivalent and is
  refused;
* `inverse=1` → `SparseDeconv` with `target_coords`: spconv's SparseInverseConv runs the rulebook of
  the forward conv registered under the same `rulebook` key backwards, with the same tap index. Its
  own stride, padding and dilation are not used (the module does not even take them); the forward
  conv's are, and its outputs are the forward conv's input coords on the forward conv's input grid;
* otherwise → `SparseConv` with symmetric pads.

Weights are spconv 2.x KRSC `[Cout, *K, Cin]`; section 3 wants `[Cout, Cin, *K]` for convs and
`[Cin, Cout, *K]` for deconvs (the transposed tap matrix, same tap index).

Every declared attribute that section 3 can recompute (channels, kernel, output extent, feature
shapes) is checked against what the graph implies, so a contradictory file is refused rather than
silently computing something else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..errors import SparseLowerError
from ..schemas import SOURCE_DOMAIN, conv_geometry

_ACTIVATIONS = {"None": None, "ReLU": "Relu", "Sigmoid": "Sigmoid", "LeakyReLU": "LeakyRelu"}
LEAKY_RELU_ALPHA = 0.01  # torch.nn.LeakyReLU's default: spconv modules are torch modules
_FLOAT_PRECISIONS = ("fp16", "fp32", "float16", "float32")
# What defines the layer is required. The rest has spconv's defaults: AIMET's exporter drops every
# attribute whose value is falsy (subm=0, transposed=0, inverse=0), and only NVIDIA's writes the output
# extent and feature shapes, which are checked where present. `spatial_shape` and `batch_size` are
# AIMET's names for the input grid (checked) and the traced batch (unused).
_REQUIRED = ("ndim", "input_spatial_shape", "in_channels", "out_channels", "kernel_size")
_DEFAULTS = {"stride": 1, "dilation": 1, "padding": 0, "output_padding": 0, "subm": 0, "transposed": 0,
             "inverse": 0, "groups": 1, "rulebook": "", "activation": "None", "precision": "fp16",
             "output_precision": "fp16", "output_spatial_shape": None, "output_bound": None, "input_shape": None,
             "output_shape": None, "spatial_shape": None, "batch_size": None}
_PER_DIM = ("input_spatial_shape", "kernel_size", "stride", "dilation", "padding", "output_padding")
_LISTS = (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS)
_PLAIN = (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING, *_LISTS)
# The least value of each per-dimension attribute, checked in spconv's names before the weight is read
# (a zero kernel_size would otherwise be reported as a weight of the wrong shape).
_LEAST = {"input_spatial_shape": 1, "kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}


@dataclass(frozen=True)
class SpconvLayer:
    """The validated attributes of one SparseConvolution node."""

    label: str
    kind: str  # "subm", "conv", "deconv" or "inverse"
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    input_spatial_shape: tuple[int, ...]
    output_spatial_shape: tuple[int, ...] | None  # as declared (checked against the computed extent)
    rulebook: str | None
    activation: str | None  # the ONNX op type
    feature_shapes: tuple[tuple[int, ...] | None, tuple[int, ...] | None]

    @property
    def ndim(self) -> int:
        return len(self.kernel_size)


def _value(attr: onnx.AttributeProto):
    """An attribute as a Python int, float, str or list (strings decoded)."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (int, float, str)):
        return value
    return [v.decode() if isinstance(v, bytes) else v for v in value] if attr.type in _LISTS else value


def _int(where, name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SparseLowerError(f"attribute '{name}'={value!r} is not an int", where, f"write {name} as an int")
    return value


def _flag(where, name, value) -> bool:
    if _int(where, name, value) not in (0, 1):
        raise SparseLowerError(f"attribute '{name}'={value} is not 0 or 1", where, f"write {name} as 0 or 1")
    return bool(value)


def _per_dim(where, name, value, ndim) -> tuple[int, ...]:
    """spconv writes per-dimension lists; a single int (or a list of one) is broadcast like spconv does."""
    values = [value] if isinstance(value, int) else value
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise SparseLowerError(f"attribute '{name}'={value!r} is not a list of ints", where,
                               f"write {name} as {ndim} ints")
    if len(values) == 1:
        values = values * ndim
    if len(values) != ndim:
        raise SparseLowerError(f"attribute '{name}' has {len(values)} values but ndim={ndim}", where,
                               f"write {ndim} values (one per spatial dimension)")
    return tuple(values)


def _activation(where, value) -> str | None:
    """The ONNX op of spconv's fused activation (names matched case-insensitively)."""
    by_lower_name = {name.lower(): op for name, op in _ACTIVATIONS.items()}
    if not isinstance(value, str) or value.lower() not in by_lower_name:
        raise SparseLowerError(f"attribute 'activation'={value!r} is not understood", where,
                               f"use one of {', '.join(_ACTIVATIONS)} (or apply it as a separate node)")
    return by_lower_name[value.lower()]


def _kind(where, values) -> str:
    subm = _flag(where, "subm", values["subm"])
    transposed = _flag(where, "transposed", values["transposed"])
    inverse = _flag(where, "inverse", values["inverse"])
    if subm and (transposed or inverse):
        raise SparseLowerError("subm=1 contradicts transposed/inverse=1", where,
                               "a submanifold conv is neither transposed nor inverse: clear one of them")
    if inverse:  # spconv's forward checks `inverse` before `transposed`
        return "inverse"
    return "subm" if subm else "deconv" if transposed else "conv"


def _read(node: onnx.NodeProto, where: str) -> dict:
    """The node's attribute values over the defaults; unknown names and missing required ones refused."""
    values = dict(_DEFAULTS)
    for attr in node.attribute:
        if attr.name not in _DEFAULTS and attr.name not in _REQUIRED:
            raise SparseLowerError(f"SparseConvolution has no attribute '{attr.name}' that sparse_lower knows",
                                   where, f"remove it; known: {', '.join(sorted((*_REQUIRED, *_DEFAULTS)))}")
        if attr.type not in _PLAIN:  # a tensor or graph would otherwise reach the messages as a protobuf dump
            raise SparseLowerError(f"attribute '{attr.name}' is of type "
                                   f"{onnx.AttributeProto.AttributeType.Name(attr.type)}", where,
                                   f"write {attr.name} as spconv's exporter does (an int, ints or a string)")
        values[attr.name] = _value(attr)
    missing = [name for name in _REQUIRED if name not in {a.name for a in node.attribute}]
    if missing:
        raise SparseLowerError(f"attribute(s) {', '.join(missing)} missing", where,
                               "export the model with all the attributes spconv's exporter writes")
    return values


def _check_scalars(where: str, values: dict) -> None:
    """The attributes that only have to hold an accepted value."""
    groups = _int(where, "groups", values["groups"])
    if groups != 1:
        raise SparseLowerError(f"groups={groups} is not supported", where, "use groups=1 (split the layer per group)")
    for name in ("precision", "output_precision"):
        if not isinstance(values[name], str) or values[name].lower() not in _FLOAT_PRECISIONS:
            raise SparseLowerError(f"attribute '{name}'={values[name]!r}: only float layers are imported", where,
                                   "export the float model (int8 layers need quantisation scales that "
                                   "section 3 does not carry)")
    if not isinstance(values["rulebook"], str):
        raise SparseLowerError(f"attribute 'rulebook'={values['rulebook']!r} is not a string", where,
                               "write the spconv indice_key as a string")
    for name in ("output_bound", "batch_size"):  # a capacity for the engine's buffers, the traced batch: unused
        if values[name] is not None:
            _int(where, name, values[name])


def parse_layer(node: onnx.NodeProto, where: str) -> SpconvLayer:
    """The attributes of a SparseConvolution node, parsed and checked for consistency with each other."""
    values = _read(node, where)
    ndim = _int(where, "ndim", values["ndim"])
    if not 1 <= ndim <= 3:
        raise SparseLowerError(f"ndim={ndim} is not supported", where, "use 1, 2 or 3 spatial dimensions")
    _check_scalars(where, values)
    dims = {name: _per_dim(where, name, values[name], ndim) for name in _PER_DIM}
    for name, least in _LEAST.items():
        if min(dims[name]) < least:
            raise SparseLowerError(f"attribute '{name}'={list(dims[name])} has a value below {least}", where,
                                   f"use values >= {least}")
    optional = {name: None if values[name] is None else _per_dim(where, name, values[name], ndim)
                for name in ("output_spatial_shape", "spatial_shape")}
    if optional["spatial_shape"] not in (None, dims["input_spatial_shape"]):
        raise SparseLowerError(f"spatial_shape={list(optional['spatial_shape'])} contradicts input_spatial_shape="
                               f"{list(dims['input_spatial_shape'])}", where, "make them equal")
    layer = SpconvLayer(
        label=where, kind=_kind(where, values),
        in_channels=_int(where, "in_channels", values["in_channels"]),
        out_channels=_int(where, "out_channels", values["out_channels"]),
        kernel_size=dims["kernel_size"], stride=dims["stride"], padding=dims["padding"],
        dilation=dims["dilation"], output_padding=dims["output_padding"],
        input_spatial_shape=dims["input_spatial_shape"], output_spatial_shape=optional["output_spatial_shape"],
        rulebook=values["rulebook"] or None, activation=_activation(where, values["activation"]),
        feature_shapes=(_feature_shape(where, "input_shape", values["input_shape"]),
                        _feature_shape(where, "output_shape", values["output_shape"])))
    _check_channels(layer)
    return layer


def _feature_shape(where, name, value) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise SparseLowerError(f"attribute '{name}'={value!r} is not a feature shape [N, C]", where,
                               f"write {name} as [N, C]")
    return tuple(value)


def _check_channels(layer: SpconvLayer) -> None:
    for name, shape, channels, role in (("input_shape", layer.feature_shapes[0], layer.in_channels, "in"),
                                        ("output_shape", layer.feature_shapes[1], layer.out_channels, "out")):
        if shape is not None and shape[1] != channels:
            raise SparseLowerError(f"{name}={list(shape)} contradicts {role}_channels={channels}", layer.label,
                                   f"make {name}[1] equal {role}_channels")
    if layer.kind == "deconv" and any(d != 1 for d in layer.dilation):
        raise SparseLowerError(
            f"a transposed conv with dilation={list(layer.dilation)}: spconv's output extent ignores the "
            f"dilation while its taps use it, which no transposed convolution reproduces", layer.label,
            "use dilation 1 for transposed convs")


def relaid_weight(layer: SpconvLayer, weight: np.ndarray) -> np.ndarray:
    """spconv's KRSC `[Cout, *K, Cin]` as section 3's `[Cout, Cin, *K]` (convs) or `[Cin, Cout, *K]`
    (deconvs: the same tap index, its matrix transposed), after checking it against the attributes."""
    expected = (layer.out_channels, *layer.kernel_size, layer.in_channels)
    if weight.shape != expected:
        raise SparseLowerError(
            f"weight of shape {list(weight.shape)} contradicts out_channels={layer.out_channels}, "
            f"kernel_size={list(layer.kernel_size)}, in_channels={layer.in_channels}", layer.label,
            f"give the weight as spconv 2.x KRSC {list(expected)}")
    weight = weight.astype(np.float32)
    if layer.kind == "inverse" and int(np.prod(layer.kernel_size)) == 1:
        raise SparseLowerError("an inverse conv of one tap: spconv runs it as a 1×1 conv on its input rows, not "
                               "on the forward conv's input coords", layer.label,
                               "use a kernel of more than one tap, or a 1×1 submanifold conv")
    if _runs_as_matmul(layer):
        # spconv's 1×1 fast path computes features @ weight.view(Cin, Cout): the stored memory is the
        # matrix [Cin, Cout], whatever the declared [Cout, 1.., Cin] shape says. Read it as spconv does.
        matrix = weight.reshape(layer.in_channels, layer.out_channels)
        weight = np.ascontiguousarray(matrix.T).reshape(weight.shape)
    destination = 0 if layer.kind in ("deconv", "inverse") else 1
    return np.ascontiguousarray(np.moveaxis(weight, -1, destination))


def _runs_as_matmul(layer: SpconvLayer) -> bool:
    """spconv runs a conv of one tap (stride 1 unless submanifold) as a matrix product on its input rows."""
    return int(np.prod(layer.kernel_size)) == 1 and (layer.kind == "subm" or int(np.prod(layer.stride)) == 1)


def checked_bias(layer: SpconvLayer, bias: np.ndarray) -> np.ndarray:
    if bias.shape != (layer.out_channels,):
        raise SparseLowerError(f"bias of shape {list(bias.shape)}, expected [{layer.out_channels}]", layer.label,
                               f"give a bias of {layer.out_channels} values or none")
    return bias.astype(np.float32)


@dataclass(frozen=True)
class ForwardConv:
    """A conv registered under a rulebook key: what an inverse conv of that key needs from it."""

    layer: SpconvLayer
    in_coords: str
    out_coords: str

    def geometry(self) -> tuple:
        """What must agree for a reused rulebook to be right (a submanifold conv ignores stride, padding)."""
        layer = self.layer
        if layer.kind == "subm":
            return (layer.kind, layer.kernel_size, layer.dilation)
        return (layer.kind, layer.kernel_size, layer.stride, layer.padding, layer.dilation)


class Rulebooks:
    """spconv's `indice_key` registry: the first conv of a key builds the rulebook, later convs of the
    key reuse it (so they must be the same conv on the same coords), inverse convs run it backwards."""

    def __init__(self):
        self._convs: dict[str, ForwardConv] = {}

    def register(self, layer: SpconvLayer, in_coords: str, out_coords: str) -> None:
        if layer.rulebook is None or layer.kind == "inverse":
            return
        entry = ForwardConv(layer, in_coords, out_coords)
        first = self._convs.setdefault(layer.rulebook, entry)
        if first is not entry and (first.geometry() != entry.geometry() or first.in_coords != in_coords):
            raise SparseLowerError(
                f"rulebook '{layer.rulebook}' was built by '{first.layer.label}' for another geometry or other "
                f"coordinates; spconv would reuse that rulebook here and compute something else", layer.label,
                "give this layer its own rulebook (indice_key)")

    def forward_of(self, layer: SpconvLayer, in_coords: str) -> ForwardConv:
        """The strided conv an inverse conv undoes, checked against the inverse's own attributes."""
        if layer.rulebook is None:
            raise SparseLowerError("an inverse conv without a rulebook key", layer.label,
                                   "set rulebook to the indice_key of the conv it inverts")
        forward = self._convs.get(layer.rulebook)
        if forward is None:
            raise SparseLowerError(f"no conv before this inverse conv registered rulebook '{layer.rulebook}'",
                                   layer.label, "set rulebook to the indice_key of an earlier strided conv")
        if forward.layer.kind != "conv":
            raise SparseLowerError(
                f"rulebook '{layer.rulebook}' belongs to a {forward.layer.kind} layer ('{forward.layer.label}'); "
                f"spconv inverts only regular sparse convs", layer.label,
                "use the indice_key of a SparseConv (not subm, transposed or inverse)")
        if layer.kernel_size != forward.layer.kernel_size:
            raise SparseLowerError(
                f"kernel_size={list(layer.kernel_size)} differs from that of '{forward.layer.label}' "
                f"({list(forward.layer.kernel_size)}) whose rulebook it inverts", layer.label,
                "give the inverse conv the forward conv's kernel_size")
        for name, own, default in (("stride", layer.stride, 1), ("padding", layer.padding, 0),
                                   ("dilation", layer.dilation, 1)):
            theirs = getattr(forward.layer, name)
            if own != theirs and any(v != default for v in own):
                raise SparseLowerError(
                    f"{name}={list(own)} contradicts the forward conv '{forward.layer.label}' ({list(theirs)})",
                    layer.label, f"leave {name} at its default or write the forward conv's value")
        if in_coords != forward.out_coords:
            raise SparseLowerError(
                f"its input is not on the output coordinates of '{forward.layer.label}' whose rulebook "
                f"'{layer.rulebook}' it inverts", layer.label,
                "feed the inverse conv features on the forward conv's output coords")
        return forward


def section3_node(layer: SpconvLayer, inputs: list[str], outputs: list[str], name: str,
                  forward: ForwardConv | None = None) -> tuple[onnx.NodeProto, tuple[int, ...]]:
    """The section-3 node of a layer and its output extent, validated by the schemas and checked against
    the declared output extent. For an inverse conv, `forward` gives the geometry and `inputs[4]` must
    be the forward conv's input coords: `output_padding` is chosen so that the output extent is the
    forward conv's input extent (DESIGN.md §3)."""
    n = layer.ndim
    if layer.kind == "subm":
        op_type, attrs = "SubmanifoldConv", dict(dilations=list(layer.dilation))
    elif layer.kind == "conv":
        op_type, attrs = "SparseConv", dict(strides=list(layer.stride), pads=list(layer.padding) * 2,
                                            dilations=list(layer.dilation))
    elif layer.kind == "deconv":
        op_type, attrs = "SparseDeconv", dict(strides=list(layer.stride), pads=list(layer.padding) * 2,
                                              output_padding=list(layer.output_padding))
    else:
        f = forward.layer
        output_padding = [(f.input_spatial_shape[i] + 2 * f.padding[i] - f.dilation[i] * (f.kernel_size[i] - 1) - 1)
                          % f.stride[i] for i in range(n)]
        op_type, attrs = "SparseDeconv", dict(strides=list(f.stride), pads=list(f.padding) * 2,
                                              dilations=list(f.dilation), output_padding=output_padding)
    node = helper.make_node(op_type, inputs, outputs, name=name, domain=SOURCE_DOMAIN,
                            kernel_shape=list(layer.kernel_size), spatial_shape=list(layer.input_spatial_shape),
                            **attrs)
    geometry = conv_geometry(node)
    if layer.output_spatial_shape not in (None, geometry.output_shape):
        raise SparseLowerError(
            f"output_spatial_shape={list(layer.output_spatial_shape)} contradicts the output extent "
            f"{list(geometry.output_shape)} that a {layer.kind} layer with these attributes has", layer.label,
            "correct output_spatial_shape (or the stride, padding, kernel_size)")
    return node, geometry.output_shape
