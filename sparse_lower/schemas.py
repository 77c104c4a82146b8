"""Schemas of the source ops (docs/source_ops.md): their attributes, defaults, rules and output extents.

This module is the one place that knows the source ops' attributes, their defaults, the rules they
must obey and the output extents they imply. The NumPy reference and the lowering both read
attributes through it, so an attribute is interpreted identically everywhere; neither shares any
computation with the other beyond that.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import onnx
from onnx import helper

from .errors import SparseLowerError
from .onnx_conventions import SOURCE_DOMAIN

CONV_OPS = ("SubmanifoldConv", "SparseConv", "SparseDeconv")
BOUNDARY_OPS = ("ToSparse", "ToDense")
# The ops of fully sparse detectors: a pooling on a convolution's geometry, and the merging of rows that
# share a site. Neither has weights; each makes a new set of sites.
MERGE_OPS = ("SparseMaxPool", "Coalesce")
SOURCE_OPS = CONV_OPS + BOUNDARY_OPS + MERGE_OPS
REDUCTIONS = ("sum", "max")
# The output sites of a strided SparseConv or SparseMaxPool: every site some input reaches through some tap
# (spconv's), or one per distinct `floor(i / s)` (MinkowskiEngine's, TorchSparse's and WarpConvNet's).
OUTPUT_SITES = ("reached", "floor")

_CONV_ATTRS = {"kernel_shape", "strides", "pads", "dilations", "spatial_shape", "group"}
_KNOWN_ATTRS = {
    "SubmanifoldConv": _CONV_ATTRS,
    "SparseConv": _CONV_ATTRS | {"output_sites"},
    "SparseDeconv": _CONV_ATTRS | {"output_padding"},
    "ToSparse": set(),
    "ToDense": {"spatial_shape", "batch_size"},
    "SparseMaxPool": (_CONV_ATTRS - {"group"}) | {"submanifold", "output_sites"},
    "Coalesce": {"spatial_shape", "reduction"},
}


# Every source-op attribute is an int or a list of ints, but Coalesce's `reduction` and the strided ops'
# `output_sites` (strings). The ONNX
# type is checked, not only the value: a FLOATS kernel_shape [3.5, 3.0] would otherwise be truncated to
# [3, 3], a STRING "3,3" read as its bytes, and an empty list or a TENSOR would crash the graph editing later.
_INT_ATTRS = {"group", "batch_size", "submanifold"}
_STRING_ATTRS = {"reduction", "output_sites"}


def attributes(node: onnx.NodeProto) -> dict:
    """The node's attributes as Python values, refusing names the op does not define and values that
    are not of the ONNX attribute type the op defines (INT, or a non-empty INTS)."""
    known = _KNOWN_ATTRS[node.op_type]
    values = {}
    for attr in node.attribute:
        if attr.name not in known:
            raise SparseLowerError(
                f"{node.op_type} has no attribute '{attr.name}'",
                node.name,
                f"remove it; {node.op_type} takes {sorted(known) or 'no attributes'}",
            )
        single = attr.name in _INT_ATTRS | _STRING_ATTRS
        expected = onnx.AttributeProto.STRING if attr.name in _STRING_ATTRS else \
            onnx.AttributeProto.INT if single else onnx.AttributeProto.INTS
        kind = onnx.AttributeProto.AttributeType.Name
        if attr.type != expected:
            written = {onnx.AttributeProto.STRING: "a string", onnx.AttributeProto.INT: "an int"}.get(expected,
                                                                                                    "a list of ints")
            raise SparseLowerError(f"attribute '{attr.name}' is of type {kind(attr.type)}, expected {kind(expected)}",
                                   node.name, f"write {attr.name} as {written}")
        if expected == onnx.AttributeProto.STRING:
            values[attr.name] = attr.s.decode("utf-8", "replace")
            continue
        if not single and not attr.ints:
            raise SparseLowerError(f"attribute '{attr.name}' is an empty list", node.name,
                                   f"give {attr.name} one value per spatial dimension, or leave it out")
        values[attr.name] = helper.get_attribute_value(attr)
    return values


def _ints(node, values, name, length, default):
    value = values.get(name, default)
    if value is None:
        raise SparseLowerError(f"attribute '{name}' is required", node.name, f"set {name} (length {length})")
    try:
        value = tuple(int(v) for v in value)
    except TypeError:
        raise SparseLowerError(f"attribute '{name}' must be a list of ints", node.name, f"give {length} ints")
    if len(value) != length:
        raise SparseLowerError(
            f"attribute '{name}' has {len(value)} values, expected {length}", node.name, f"give {length} ints"
        )
    return value


@dataclass(frozen=True)
class ConvGeometry:
    """The attributes of one sparse convolution, validated, with the extents they imply."""

    op_type: str
    kernel_shape: tuple
    strides: tuple
    pads: tuple
    dilations: tuple
    spatial_shape: tuple
    output_padding: tuple
    submanifold: bool = False  # a SparseMaxPool on its input sites, centred like a SubmanifoldConv
    # The floor rule (output_sites="floor"): one output per distinct floor(i / s), read through the taps
    # i = o·s − pb + k·d; `pads` then holds the ends d·(K − 1) − pb, which make S_out = ceil(S / s).
    floor: bool = False

    @property
    def centred(self) -> bool:
        """Whether the outputs are the input sites, each window centred on its own."""
        return self.op_type == "SubmanifoldConv" or self.submanifold

    @property
    def ndim(self) -> int:
        return len(self.kernel_shape)

    @property
    def volume(self) -> int:
        return prod(self.kernel_shape)

    @property
    def output_shape(self) -> tuple:
        """The output grid extent per dimension (docs/source_ops.md)."""
        d = range(self.ndim)
        S, K, s, p, dl = self.spatial_shape, self.kernel_shape, self.strides, self.pads, self.dilations
        n = self.ndim
        if self.centred:
            return S
        if self.op_type in ("SparseConv", "SparseMaxPool"):
            return tuple((S[i] + p[i] + p[n + i] - dl[i] * (K[i] - 1) - 1) // s[i] + 1 for i in d)
        return tuple(
            s[i] * (S[i] - 1) + self.output_padding[i] + dl[i] * (K[i] - 1) + 1 - p[i] - p[n + i] for i in d
        )


def conv_geometry(node: onnx.NodeProto) -> ConvGeometry:
    """Parse and check the attributes of a SubmanifoldConv, SparseConv, SparseDeconv or SparseMaxPool node
    (a pooling window has a strided convolution's geometry and output sites)."""
    values = attributes(node)
    if "kernel_shape" not in values:
        raise SparseLowerError("attribute 'kernel_shape' is required", node.name, "set kernel_shape (length D)")
    kernel = _ints(node, values, "kernel_shape", len(values["kernel_shape"]), None)
    n = len(kernel)
    if not 1 <= n <= 3:
        raise SparseLowerError(f"{n} spatial dimensions are not supported", node.name, "use 1, 2 or 3 dimensions")
    geometry = ConvGeometry(
        op_type=node.op_type,
        kernel_shape=kernel,
        strides=_ints(node, values, "strides", n, (1,) * n),
        pads=_ints(node, values, "pads", 2 * n, (0,) * (2 * n)),
        dilations=_ints(node, values, "dilations", n, (1,) * n),
        spatial_shape=_ints(node, values, "spatial_shape", n, None),
        output_padding=_ints(node, values, "output_padding", n, (0,) * n),
        submanifold=bool(values.get("submanifold", 0)),
    )
    if values.get("submanifold", 0) not in (0, 1):
        raise SparseLowerError(f"submanifold={values['submanifold']} is not 0 or 1", node.name,
                               "set submanifold=1 to pool on the input sites, or leave it out")
    if _output_sites(node, values, geometry) == "floor":
        geometry = _floor_geometry(node, geometry)
    _check_geometry(node, geometry, values.get("group", 1))
    return geometry


def _output_sites(node, values: dict, geometry: ConvGeometry) -> str:
    sites = values.get("output_sites", "reached")
    if sites not in OUTPUT_SITES:
        raise SparseLowerError(f"output_sites '{sites}' is not defined", node.name,
                               f"use one of {', '.join(OUTPUT_SITES)}")
    if sites == "floor" and geometry.submanifold:
        raise SparseLowerError("output_sites='floor' is a rule of strided outputs, not of a submanifold pooling",
                               node.name, "leave out output_sites or submanifold")
    return sites


def _floor_geometry(node, g: ConvGeometry) -> ConvGeometry:
    """The floor rule's geometry: the given begin pads, the ends that make S_out = ceil(S / s) (what the
    ends held is ignored, as a SubmanifoldConv ignores its pads). A begin pad past d·(K − 1) would leave
    an output with no tap at its own input `o·s`, and is refused."""
    n = g.ndim
    reach = [d * (k - 1) for k, d in zip(g.kernel_shape, g.dilations)]
    if any(pb > r for pb, r in zip(g.pads[:n], reach)):
        raise SparseLowerError(
            f"pads begins {list(g.pads[:n])} exceed d·(K − 1) = {reach} under output_sites='floor'", node.name,
            "use the engine's offsets: pads (K − 1)/2·d for an odd kernel, 0 for an even one")
    if g.op_type == "SparseMaxPool" and not all(
            all((r + pb) % d == 0 and r + pb <= reach_d for r in range(s))
            for s, pb, d, reach_d in zip(g.strides, g.pads[:n], g.dilations, reach)):
        raise SparseLowerError(
            "under output_sites='floor' a pooling window must hold the s sites of its own output, "
            f"which kernel_shape={list(g.kernel_shape)}, strides={list(g.strides)}, pads begins {list(g.pads[:n])} "
            f"and dilations={list(g.dilations)} do not", node.name,
            "use a kernel at least as large as the stride, with dilation 1 (or a SparseConv)")
    ends = tuple(r - pb for pb, r in zip(g.pads[:n], reach))
    return ConvGeometry(g.op_type, g.kernel_shape, g.strides, g.pads[:n] + ends, g.dilations, g.spatial_shape,
                        g.output_padding, g.submanifold, floor=True)


MAX_ATTRIBUTE = 1 << 30  # the custom-op library's bound on every geometry value (index/geometry.cc)


def _check_geometry(node, g: ConvGeometry, group) -> None:
    name = node.name
    if group != 1:
        raise SparseLowerError(f"group={group} is not supported", name, "use group=1 (split the layer per group)")
    for attr, values, low in (("kernel_shape", g.kernel_shape, 1), ("strides", g.strides, 1),
                              ("dilations", g.dilations, 1), ("spatial_shape", g.spatial_shape, 1),
                              ("pads", g.pads, 0), ("output_padding", g.output_padding, 0)):
        if any(v < low for v in values):
            raise SparseLowerError(f"{attr}={list(values)} has a value below {low}", name, f"use values >= {low}")
        if any(v >= MAX_ATTRIBUTE for v in values):
            raise SparseLowerError(f"{attr}={list(values)} has a value of 2^30 or more", name,
                                   "use values below 2^30 (the custom ops compute coordinates in int64 from them)")
    if g.centred:
        conv = g.op_type == "SubmanifoldConv"
        what = "SubmanifoldConv" if conv else "a submanifold SparseMaxPool"
        if any(k % 2 == 0 for k in g.kernel_shape):
            raise SparseLowerError(
                f"{what} needs odd kernel sizes, got kernel_shape={list(g.kernel_shape)}", name,
                f"use an odd kernel (a submanifold {'conv' if conv else 'pooling'} is centred on each active site)")
        if any(s != 1 for s in g.strides):
            raise SparseLowerError(
                f"{what} needs strides of 1, got strides={list(g.strides)}", name,
                "use SparseConv for a strided convolution" if g.op_type == "SubmanifoldConv" else
                "leave out submanifold for a strided pooling")
    if g.op_type == "SparseDeconv":
        if any(op >= max(s, d) for op, s, d in zip(g.output_padding, g.strides, g.dilations)):
            raise SparseLowerError(
                f"output_padding={list(g.output_padding)} must be smaller than the stride or the dilation",
                name, "reduce output_padding (ONNX ConvTranspose rule)")
    elif any(v != 0 for v in g.output_padding):
        raise SparseLowerError("output_padding is only defined for SparseDeconv", name, "remove output_padding")
    out = g.output_shape
    if any(v < 1 for v in out):
        raise SparseLowerError(
            f"the output extent {list(out)} has a dimension below 1 (input extent {list(g.spatial_shape)})",
            name, "reduce the kernel, pads or dilation, or enlarge spatial_shape")
    _check_sites(node, "spatial_shape", g.spatial_shape)
    _check_sites(node, "output extent", out)


_MAX_SITES = 2**63 - 1


def _check_sites(node, role: str, extent) -> None:
    """The custom ops number the sites of a grid in int64; a larger grid is refused here, at compile
    time, rather than when onnxruntime first builds the kernels."""
    if prod(extent) > _MAX_SITES:
        raise SparseLowerError(f"the {role} {list(extent)} has {prod(extent)} sites, more than int64 can number",
                               node.name, "use a grid of at most 2**63 - 1 sites")


@dataclass(frozen=True)
class Merge:
    """The attributes of Coalesce."""

    spatial_shape: tuple
    reduction: str


def _grid_attribute(node: onnx.NodeProto, values: dict) -> tuple:
    """The required `spatial_shape` of an op without a kernel: 1 to 3 extents >= 1, at most 2**63 − 1 sites."""
    if "spatial_shape" not in values:
        raise SparseLowerError("attribute 'spatial_shape' is required", node.name, "set spatial_shape (length D)")
    shape = _ints(node, values, "spatial_shape", len(values["spatial_shape"]), None)
    if not 1 <= len(shape) <= 3 or any(v < 1 for v in shape):
        raise SparseLowerError(f"spatial_shape={list(shape)} is invalid", node.name, "give 1 to 3 extents >= 1")
    _check_sites(node, "spatial_shape", shape)
    return shape


def coalesce_attributes(node: onnx.NodeProto) -> Merge:
    values = attributes(node)
    shape = _grid_attribute(node, values)
    if any(v >= MAX_ATTRIBUTE for v in shape):  # the custom op's coordinates, as for a conv's geometry
        raise SparseLowerError(f"spatial_shape={list(shape)} has a value of 2^30 or more", node.name,
                               "use values below 2^30")
    reduction = values.get("reduction", "sum")
    if reduction not in REDUCTIONS:
        raise SparseLowerError(f"reduction '{reduction}' is not defined", node.name,
                               f"use one of {', '.join(REDUCTIONS)}")
    return Merge(shape, reduction)


@dataclass(frozen=True)
class DenseBoundary:
    """The attributes of ToDense."""

    spatial_shape: tuple
    batch_size: int


def to_dense_attributes(node: onnx.NodeProto) -> DenseBoundary:
    values = attributes(node)
    shape = _grid_attribute(node, values)
    batch = values.get("batch_size")
    if not isinstance(batch, int) or batch < 1:
        raise SparseLowerError("attribute 'batch_size' (int >= 1) is required", node.name, "set batch_size")
    return DenseBoundary(shape, batch)


def weight_shape(geometry: ConvGeometry, cin: int, cout: int) -> tuple:
    """The weight shape a conv of these channels needs (ONNX Conv / ConvTranspose layout)."""
    if geometry.op_type == "SparseDeconv":
        return (cin, cout, *geometry.kernel_shape)
    return (cout, cin, *geometry.kernel_shape)


def conv_channels(op_type: str, shape) -> tuple[int, int]:
    """(Cin, Cout) of a conv's weight shape, in the layout of `weight_shape`."""
    return (shape[0], shape[1]) if op_type == "SparseDeconv" else (shape[1], shape[0])


def _submanifold(node: onnx.NodeProto) -> bool:
    return any(a.name == "submanifold" and a.i for a in node.attribute)


def coords_levels(graph: onnx.GraphProto) -> dict[str, int]:
    """The level of every coords tensor the sparse ops read or produce, where not 0: the model's inputs are
    level 0, a SparseConv's or SparseMaxPool's outputs one more than its inputs (whatever its strides: a
    new set of sites), a SparseDeconv's those of its targets, or one less without targets. Coords computed
    by standard ops (a Concat, a column dropped, a scaling) are at the deepest level they are computed
    from, but a Coalesce's input rows are a set of their own, one level deeper, and its output one more.
    Each level has its own number of active sites: the nna lowering can give each its own row capacity
    (`max_active` per level)."""
    levels: dict[str, int] = {}
    for node in graph.node:
        if node.domain != SOURCE_DOMAIN:
            derived = max((levels[name] for name in node.input if name in levels), default=0)
            levels.update({name: derived for name in node.output if derived})
            continue
        if node.op_type not in CONV_OPS + MERGE_OPS:
            continue
        level = levels.get(node.input[1], 0)
        if node.op_type == "Coalesce":
            level += 1
            levels[node.input[1]] = level
            level += 1
        elif node.op_type == "SparseConv" or (node.op_type == "SparseMaxPool" and not _submanifold(node)):
            level += 1
        elif node.op_type == "SparseDeconv":
            targets = node.input[4] if len(node.input) > 4 else ""
            level = levels.get(targets, 0) if targets else max(level - 1, 0)
        if level:
            levels[node.output[1]] = level
    return levels
