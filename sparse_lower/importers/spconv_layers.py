"""One spconv `SparseConvolution` node (NVIDIA, AIMET) → one source-op node.

Both formats serialise an spconv module with the same attribute names, so this module is where the
importers read them and map them onto the source ops (the behaviours the writers of spconv modules
reproduce too, the weight layouts, the 1×1 path and the inverse geometry, are in spconv_rules.py):

* `subm=1` → `SubmanifoldConv`: spconv's submanifold conv is centred and ignores `padding`, so no
  pads are written;
* `transposed=1` → `SparseDeconv`: spconv's output extent `(S−1)·s − 2p + K + output_padding` ignores
  the dilation, while its taps use it, so a dilated transposed conv has no source-op equivalent and is
  refused;
* `inverse=1` → `SparseDeconv` with `target_coords`: spconv's SparseInverseConv runs the rulebook of
  the forward conv registered under the same `rulebook` key backwards, with the same tap index. Its
  own stride, padding and dilation are not used (the module does not even take them); the forward
  conv's are, and its outputs are the forward conv's input coords on the forward conv's input grid;
* otherwise → `SparseConv` with symmetric pads.

Weights are spconv 2.x KRSC `[Cout, *K, Cin]`; the source ops want `[Cout, Cin, *K]` for convs and
`[Cin, Cout, *K]` for deconvs (the transposed tap matrix, same tap index).

What the layer is comes from what the engines read, not from the descriptive attributes their
exporters add. NVIDIA's libspconv (`parser/onnx-parser.cpp`) reads the weight, bias, kernel_size,
stride, padding, dilation, subm, inverse, activation, rulebook, output_bound and the int8 attributes,
and ignores ndim, the spatial shapes, the channel counts, transposed, output_padding, groups and the
feature shapes; it takes the input grid at run time and derives every later grid from the layers. So
here too: the channels and the number of dimensions come from the weight, each layer's input grid
from the layer before it (the first conv's `input_spatial_shape` is the network's input grid), and a
descriptive attribute that contradicts them is stale: it is reported (`SparseLowerWarning`, and the
imported model's metadata) and not used. `transposed`, which libspconv ignores, still makes a
transposed conv here: that is what the exported spconv module computes, and it is reported too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from ..errors import SparseLowerError
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import conv_geometry
from ..spconv_rules import inverse_output_padding, runs_as_matmul, source_weight, weight_from_matmul_memory

Note = Callable[[str, str], None]  # (node label, message): what the translation reports and records

_ACTIVATIONS = {"None": None, "ReLU": "Relu", "Sigmoid": "Sigmoid", "LeakyReLU": "LeakyRelu"}
PRECISIONS = ("int8", "fp16", "fp32", "float16", "float32")
# The INT8 (PTQ/QAT) export's attributes: the engine's quantisation scales. The import computes in
# float32 from the given weights and keeps these in the model's metadata.
QUANTIZATION = ("input_dynamic_range", "weight_dynamic_ranges", "precision", "output_precision")
_DEFAULTS = {"stride": 1, "dilation": 1, "padding": 0, "output_padding": 0, "subm": 0, "transposed": 0,
             "inverse": 0, "groups": 1, "rulebook": "", "activation": "None"}
# Descriptive attributes: what the exporter saw while tracing. Checked against what the graph implies,
# reported when stale, never used.
_DESCRIPTIVE = ("ndim", "input_spatial_shape", "output_spatial_shape", "in_channels", "out_channels",
                "input_shape", "output_shape", "spatial_shape", "batch_size", "output_bound")
_ENGINE_ONLY = ("fixed_launch_points",)  # libspconv launch tuning
_KNOWN = ("kernel_size", *_DEFAULTS, *_DESCRIPTIVE, *QUANTIZATION, *_ENGINE_ONLY)
_PER_DIM = ("kernel_size", "stride", "dilation", "padding", "output_padding")
_LISTS = (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS)
_PLAIN = (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING, *_LISTS)
# The least value of each per-dimension attribute.
_LEAST = {"kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}


@dataclass(frozen=True)
class SpconvLayer:
    """The validated meaning of one SparseConvolution node."""

    label: str
    kind: str  # "subm", "conv", "deconv" or "inverse"
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    input_spatial_shape: tuple[int, ...]  # the grid of its input, from the layer before
    declared_output_spatial_shape: tuple[int, ...] | None  # compared with the computed extent
    rulebook: str | None
    activation: str | None  # the ONNX op type
    quantization: dict = field(default_factory=dict)  # the int8 attributes the node carries

    @property
    def ndim(self) -> int:
        return len(self.kernel_size)


def attribute_values(node: onnx.NodeProto, where: str) -> dict:
    """The node's attributes as Python ints, floats, strs or lists (strings decoded); a tensor or graph
    attribute is refused (it would otherwise reach the messages as a protobuf dump)."""
    values = {}
    for attr in node.attribute:
        if attr.type not in _PLAIN:
            raise SparseLowerError(f"attribute '{attr.name}' is of type "
                                   f"{onnx.AttributeProto.AttributeType.Name(attr.type)}", where,
                                   f"write {attr.name} as the exporter does (an int, ints, a float or a string)")
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif attr.type in _LISTS:
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        values[attr.name] = value
    return values


def _int(where, name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SparseLowerError(f"attribute '{name}'={value!r} is not an int", where, f"write {name} as an int")
    return value


def flag(where, name, value) -> bool:
    if _int(where, name, value) not in (0, 1):
        raise SparseLowerError(f"attribute '{name}'={value} is not 0 or 1", where, f"write {name} as 0 or 1")
    return bool(value)


def per_dim(where, name, value, ndim) -> tuple[int, ...]:
    """spconv writes per-dimension lists; a single int (or a list of one) is broadcast like spconv does."""
    values = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise SparseLowerError(f"attribute '{name}'={value!r} is not a list of ints", where,
                               f"write {name} as {ndim} ints")
    if len(values) == 1:
        values = values * ndim
    if len(values) != ndim:
        raise SparseLowerError(f"attribute '{name}' has {len(values)} values but the layer is {ndim}-D", where,
                               f"write {ndim} values (one per spatial dimension)")
    return tuple(values)


def declared_grid(node: onnx.NodeProto, where: str) -> tuple[int, ...] | None:
    """The `input_spatial_shape` a conv declares, if any: the network's input grid when the conv reads
    the network's input (no engine derives it: libspconv takes it at run time)."""
    value = attribute_values(node, where).get("input_spatial_shape")
    if value is None:
        return None
    if isinstance(value, int) or not isinstance(value, list) or not 1 <= len(value) <= 3 \
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise SparseLowerError(f"attribute 'input_spatial_shape'={value!r} is not a grid", where,
                               "write the input grid as 1 to 3 extents >= 1")
    return tuple(value)


def _activation(where, value) -> str | None:
    """The ONNX op of spconv's fused activation (names matched case-insensitively)."""
    by_lower_name = {name.lower(): op for name, op in _ACTIVATIONS.items()}
    if not isinstance(value, str) or value.lower() not in by_lower_name:
        raise SparseLowerError(f"attribute 'activation'={value!r} is not understood", where,
                               f"use one of {', '.join(_ACTIVATIONS)} (or apply it as a separate node)")
    return by_lower_name[value.lower()]


def _kind(where, subm: bool, values, note: Note, engine: str) -> str:
    transposed = flag(where, "transposed", values["transposed"])
    inverse = flag(where, "inverse", values["inverse"])
    if subm and (transposed or inverse):
        raise SparseLowerError("subm=1 contradicts transposed/inverse=1", where,
                               "a submanifold conv is neither transposed nor inverse: clear one of them")
    if inverse:  # spconv's forward checks `inverse` before `transposed`
        return "inverse"
    if transposed:
        note(where, f"transposed=1: imported as spconv's SparseConvTranspose, which the exported module "
                    f"computes; {engine} ignores `transposed` and would run a regular sparse conv")
    return "subm" if subm else "deconv" if transposed else "conv"


def check_dynamic_range(where: str, name: str, value) -> None:
    """A calibrated amax of an INT8 export: finite numbers, > 0 for an input's (TensorRT's scale
    amax / 127 divides by it), ≥ 0 per weight channel (a pruned channel's zero weights give 0)."""
    numbers = value if isinstance(value, list) else [value]
    least = 0.0 if name.startswith("weight") else None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               and (v >= least if least is not None else v > 0) for v in numbers):
        kind = "finite numbers >= 0" if least is not None else "a finite number > 0: its scale amax / 127 divides"
        raise SparseLowerError(f"attribute '{name}'={value!r} is not a dynamic range ({kind})", where,
                               f"write {name} as the calibrated amax")


def quantization(where: str, values: dict) -> dict:
    """The INT8 export's attributes of a node, checked: the ranges are finite amax values (check_dynamic_range),
    the precisions one of PRECISIONS."""
    found = {}
    for name in QUANTIZATION:
        value = values.get(name)
        if value is None:
            continue
        if name.endswith("precision"):
            if not isinstance(value, str) or value.lower() not in PRECISIONS:
                raise SparseLowerError(f"attribute '{name}'={value!r} is not a precision", where,
                                       f"write one of {', '.join(PRECISIONS)}")
        else:
            check_dynamic_range(where, name, value)
        found[name] = value
    return found


SubmReader = Callable[[dict, tuple[int, ...], str], bool]  # (attributes present, stride, node label) -> subm


def parse_layer(node: onnx.NodeProto, where: str, weight_shape: tuple[int, ...], grid: tuple[int, ...],
                subm: SubmReader, note: Note, engine: str, rulebook_is_key: bool = True) -> SpconvLayer:
    """The meaning of a SparseConvolution node with weight of `weight_shape` on an input of `grid`.

    `subm` reads the submanifold flag the way the format's exporter writes it (AIMET's leaves a false
    flag out); `engine` names the runtime the format is written for, in the notes; `rulebook_is_key`
    says whether `rulebook` is spconv's indice_key (NVIDIA) or says something else (AIMET: the flag)."""
    present = attribute_values(node, where)
    for name in sorted(set(present) - set(_KNOWN)):
        note(where, f"attribute '{name}' is not one spconv's exporters write; ignored")
    if "kernel_size" not in present:
        raise SparseLowerError("attribute 'kernel_size' missing", where, "write the kernel size, one per dimension")
    if len(weight_shape) != 2 + len(grid):
        raise SparseLowerError(f"weight of shape {list(weight_shape)} on a {len(grid)}-D input", where,
                               f"give the weight as spconv 2.x KRSC [Cout, {', '.join('k' * len(grid))}, Cin]")
    ndim, cout, cin = len(grid), weight_shape[0], weight_shape[-1]
    values = {**_DEFAULTS, **present}
    dims = {name: per_dim(where, name, values[name], ndim) for name in _PER_DIM}
    for name, least in _LEAST.items():
        if min(dims[name]) < least:
            raise SparseLowerError(f"attribute '{name}'={list(dims[name])} has a value below {least}", where,
                                   f"use values >= {least}")
    if dims["kernel_size"] != tuple(weight_shape[1:-1]):
        raise SparseLowerError(f"kernel_size={list(dims['kernel_size'])} contradicts the weight's taps "
                               f"{list(weight_shape[1:-1])} (weight {list(weight_shape)})", where,
                               "give the weight as spconv 2.x KRSC [Cout, *kernel_size, Cin]")
    if not isinstance(values["rulebook"], str):
        raise SparseLowerError(f"attribute 'rulebook'={values['rulebook']!r} is not a string", where,
                               "write the spconv indice_key as a string")
    _report_stale(where, values, ndim, cin, cout, grid, note, engine)
    layer = SpconvLayer(
        label=where, kind=_kind(where, subm(present, dims["stride"], where), values, note, engine),
        in_channels=cin, out_channels=cout, kernel_size=dims["kernel_size"], stride=dims["stride"],
        padding=dims["padding"], dilation=dims["dilation"], output_padding=dims["output_padding"],
        input_spatial_shape=tuple(grid), declared_output_spatial_shape=_declared(values, "output_spatial_shape"),
        rulebook=(values["rulebook"] or None) if rulebook_is_key else None,
        activation=_activation(where, values["activation"]),
        quantization=quantization(where, values))
    if layer.kind == "deconv" and any(d != 1 for d in layer.dilation):
        raise SparseLowerError(
            f"a transposed conv with dilation={list(layer.dilation)}: spconv's output extent ignores the "
            f"dilation while its taps use it, which no transposed convolution reproduces", where,
            "use dilation 1 for transposed convs")
    return layer


def _declared(values: dict, name: str) -> tuple | None:
    value = values.get(name)
    return tuple(value) if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def _report_stale(where, values, ndim, cin, cout, grid, note: Note, engine: str) -> None:
    """Note every descriptive attribute that disagrees with the weight or the input's grid."""
    for name, value in (("ndim", ndim), ("in_channels", cin), ("out_channels", cout)):
        if values.get(name) not in (None, value):
            note(where, f"{name}={values[name]!r} is stale: the weight gives {value} ({engine} reads the weight too)")
    for name in ("input_spatial_shape", "spatial_shape"):
        if values.get(name) not in (None, list(grid)):
            note(where, f"{name}={values[name]!r} is stale: the layer before gives {list(grid)} ({engine} derives "
                        f"each grid from the layer before too)")
    if values.get("groups") not in (None, 1):
        note(where, f"groups={values['groups']!r} is ignored: spconv convs have one group, and {engine} ignores "
                    f"groups")


def relaid_weight(layer: SpconvLayer, weight: np.ndarray, spconv_1x1: bool = True) -> np.ndarray:
    """spconv's KRSC `[Cout, *K, Cin]` as the source ops' `[Cout, Cin, *K]` (convs) or `[Cin, Cout, *K]`
    (deconvs: the same tap index, its matrix transposed). `spconv_1x1`: the weight is a spconv module's,
    whose one-tap fast path reads its memory as [Cin, Cout] (NVIDIA, AIMET); an engine that multiplies
    by the KRSC weight as it is (Autoware's implicit GEMM) passes False."""
    weight = weight.astype(np.float32)
    if layer.kind == "inverse" and int(np.prod(layer.kernel_size)) == 1:
        raise SparseLowerError("an inverse conv of one tap: spconv runs it as a 1×1 conv on its input rows, not "
                               "on the forward conv's input coords", layer.label,
                               "use a kernel of more than one tap, or a 1×1 submanifold conv")
    if spconv_1x1 and runs_as_matmul(layer.kind, layer.kernel_size, layer.stride):
        weight = weight_from_matmul_memory(weight)  # read the memory as spconv does
    return source_weight(weight, transposed=layer.kind in ("deconv", "inverse"))


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


def source_node(layer: SpconvLayer, inputs: list[str], outputs: list[str], name: str, note: Note,
                  forward: ForwardConv | None = None) -> tuple[onnx.NodeProto, tuple[int, ...]]:
    """The source-op node of a layer and its output extent, validated by the schemas; a declared output
    extent that differs is noted as stale. For an inverse conv, `forward` gives the geometry and
    `inputs[4]` must be the forward conv's input coords: `output_padding` is chosen so that the output
    extent is the forward conv's input extent (the source ops' inverse deconvolution)."""
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
        output_padding = inverse_output_padding(f.input_spatial_shape, f.kernel_size, f.stride, f.padding, f.dilation)
        op_type, attrs = "SparseDeconv", dict(strides=list(f.stride), pads=list(f.padding) * 2,
                                              dilations=list(f.dilation), output_padding=output_padding)
    node = helper.make_node(op_type, inputs, outputs, name=name, domain=SOURCE_DOMAIN,
                            kernel_shape=list(layer.kernel_size), spatial_shape=list(layer.input_spatial_shape),
                            **attrs)
    geometry = conv_geometry(node)
    declared = layer.declared_output_spatial_shape
    if declared is not None and declared != tuple(geometry.output_shape):
        note(layer.label, f"output_spatial_shape={list(declared)} is stale: the layer's input grid "
                          f"{list(layer.input_spatial_shape)} and its kernel, stride, padding and dilation give "
                          f"{list(geometry.output_shape)}")
    return node, geometry.output_shape
