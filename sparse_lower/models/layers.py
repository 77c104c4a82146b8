"""What a conv call means, worked out once for every emitter: spconv's geometry rules and indice keys.

An emitter receives spconv-style calls (emitter.py). Before it writes anything in its own form it asks a
`ConvPlanner` for the `ConvLayer` the call describes: the per-dimension geometry, the output extent
spconv gives it and, for an inverse conv, the forward conv it undoes. The planner refuses, with a
message naming the layer, the calls spconv would reject or silently mis-handle (a dilated transposed
conv, an inverse conv with no forward conv under its key, a residual add of misaligned rows), so every
form of a network is built from the same, valid layer list.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spconv_rules import inverse_output_padding
from .emitter import Dense, Sparse, per_dim, spconv_output_shape

KINDS = ("subm", "conv", "deconv", "inverse")
ACTIVATIONS = (None, "ReLU", "LeakyReLU", "Sigmoid")


@dataclass(frozen=True)
class Values:
    """The handle the ONNX emitters keep in `Sparse.handle`.

    `rows` names the row set: a submanifold conv, an activation and an add keep it, a strided conv
    starts a new one, an inverse conv returns to its forward conv's input rows. Two tensors can be
    added only when their rows match (same coords, same order), which is what spconv assumes too.
    `coords` is the coordinates (AIMET: indices) value, None in formats whose graphs carry none.
    """

    features: str
    coords: str | None
    rows: str


@dataclass(frozen=True)
class ConvLayer:
    """One conv call, validated. For "inverse" the geometry (stride, padding, dilation) is the forward
    conv's and `forward` is that conv's input; `output_shape` is the forward conv's input extent."""

    name: str
    kind: str
    in_channels: int
    out_channels: int
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    output_padding: tuple
    input_shape: tuple
    output_shape: tuple
    indice_key: str | None
    activation: str | None
    forward: Sparse | None = None

    @property
    def ndim(self) -> int:
        return len(self.kernel)

    @property
    def transposed(self) -> bool:
        """Whether the weight maps output rows to input rows (ConvTranspose layout in the source ops)."""
        return self.kind in ("deconv", "inverse")

    @property
    def inverse_output_padding(self) -> tuple:
        """The output_padding that makes a SparseDeconv with the forward geometry end at the forward
        input extent (docs/source_ops.md): (S_in + 2p − d·(K − 1) − 1) mod s per dimension."""
        return tuple(inverse_output_padding(self.output_shape, self.kernel, self.stride, self.padding, self.dilation))


class ConvPlanner:
    """Validates conv calls and pairs inverse convs with their forward conv by `indice_key`.

    Keys follow spconv: submanifold convs with one key share one rulebook (so they must agree on the
    rows, grid, kernel and dilation); a strided or transposed conv owns its key (a second one would
    overwrite the pairs in spconv, which no reference network does, so it is refused); an inverse conv
    names the key of a strided conv.
    """

    def __init__(self):
        self._keys: dict[str, tuple[ConvLayer, Sparse]] = {}  # the first layer with each key, and its input

    def plan(self, x: Sparse, kind: str, weight: np.ndarray, bias, *, name: str, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None) -> ConvLayer:
        ndim = len(x.spatial_shape)
        self._check_call(x, kind, weight, bias, name, ndim, activation)
        kernel = tuple(int(k) for k in weight.shape[1:-1])
        geometry = dict(stride=per_dim(stride, ndim), padding=per_dim(padding, ndim),
                        dilation=per_dim(dilation, ndim), output_padding=per_dim(output_padding, ndim))
        common = dict(name=name, kind=kind, in_channels=x.channels, out_channels=int(weight.shape[0]),
                      kernel=kernel, input_shape=tuple(x.spatial_shape), indice_key=indice_key,
                      activation=activation)
        if kind == "inverse":
            return self._inverse(x, geometry, common)
        self._check_geometry(name, kind, kernel, geometry)
        output_shape = spconv_output_shape(kind, x.spatial_shape, kernel, geometry["stride"], geometry["padding"],
                                           geometry["dilation"], geometry["output_padding"])
        if any(v < 1 for v in output_shape):
            raise ValueError(f"layer '{name}': output extent {list(output_shape)} has a dimension below 1 "
                             f"(input extent {list(x.spatial_shape)})")
        layer = ConvLayer(**common, **geometry, output_shape=output_shape)
        self._register(x, layer)
        return layer

    def _check_call(self, x, kind, weight, bias, name, ndim, activation) -> None:
        if kind not in KINDS:
            raise ValueError(f"layer '{name}': unknown kind '{kind}' (use one of {', '.join(KINDS)})")
        if activation not in ACTIVATIONS:
            raise ValueError(f"layer '{name}': unknown activation '{activation}' (use one of {ACTIVATIONS})")
        if weight.ndim != ndim + 2 or weight.shape[-1] != x.channels:
            raise ValueError(f"layer '{name}': weight {list(weight.shape)} is not [Cout, *kernel ({ndim} dims), "
                             f"Cin={x.channels}] (spconv 2.x layout)")
        if bias is not None and np.shape(bias) != (weight.shape[0],):
            raise ValueError(f"layer '{name}': bias {list(np.shape(bias))} is not [Cout={weight.shape[0]}]")

    @staticmethod
    def _check_geometry(name, kind, kernel, g) -> None:
        for attr, low in (("stride", 1), ("dilation", 1), ("padding", 0), ("output_padding", 0)):
            if any(v < low for v in g[attr]):
                raise ValueError(f"layer '{name}': {attr}={list(g[attr])} has a value below {low}")
        if kind == "subm" and (any(k % 2 == 0 for k in kernel) or any(s != 1 for s in g["stride"])):
            raise ValueError(f"layer '{name}': a submanifold conv needs an odd kernel and stride 1 "
                             f"(got kernel {list(kernel)}, stride {list(g['stride'])})")
        if kind == "deconv" and any(d != 1 for d in g["dilation"]):
            raise ValueError(f"layer '{name}': spconv ignores the dilation of a transposed conv in its output "
                             f"shape, so dilation={list(g['dilation'])} has no well-defined meaning; use 1")
        if kind == "deconv" and any(op >= s for op, s in zip(g["output_padding"], g["stride"])):
            raise ValueError(f"layer '{name}': output_padding={list(g['output_padding'])} must be below the "
                             f"stride {list(g['stride'])}")
        if kind != "deconv" and any(g["output_padding"]):
            raise ValueError(f"layer '{name}': output_padding is only defined for kind 'deconv'")

    def _inverse(self, x: Sparse, g: dict, common: dict) -> ConvLayer:
        name, key = common["name"], common["indice_key"]
        if any(v != 1 for v in g["stride"] + g["dilation"]) or any(g["padding"] + g["output_padding"]):
            raise ValueError(f"layer '{name}': an inverse conv takes stride, padding and dilation from its "
                             f"forward conv; leave them at their defaults")
        found = self._keys.get(key) if key else None
        if found is None or found[0].kind != "conv":
            raise ValueError(f"layer '{name}': an inverse conv needs the indice_key of a strided conv built "
                             f"before it (got {key!r})")
        forward, forward_input = found
        if common["kernel"] != forward.kernel:
            raise ValueError(f"layer '{name}': kernel {list(common['kernel'])} differs from the kernel "
                             f"{list(forward.kernel)} of '{forward.name}', whose rulebook it reuses")
        if tuple(x.spatial_shape) != forward.output_shape:
            raise ValueError(f"layer '{name}': its input extent {list(x.spatial_shape)} is not the output "
                             f"extent {list(forward.output_shape)} of '{forward.name}'")
        return ConvLayer(**common, stride=forward.stride, padding=forward.padding, dilation=forward.dilation,
                         output_padding=(0,) * len(forward.kernel), output_shape=forward.input_shape,
                         forward=forward_input)

    def _register(self, x: Sparse, layer: ConvLayer) -> None:
        key = layer.indice_key
        if key is None:
            return
        if key not in self._keys:
            self._keys[key] = (layer, x)
            return
        held, held_input = self._keys[key]
        same_rulebook = (layer.kind == held.kind == "subm" and layer.kernel == held.kernel
                         and layer.dilation == held.dilation and layer.input_shape == held.input_shape)
        if not same_rulebook:
            raise ValueError(f"layer '{layer.name}': indice_key '{key}' already belongs to '{held.name}' "
                             f"({held.kind}, kernel {list(held.kernel)}, grid {list(held.input_shape)}); only "
                             f"submanifold convs of one geometry share a key")
        rows, held_rows = getattr(x.handle, "rows", None), getattr(held_input.handle, "rows", None)
        if rows != held_rows:  # spconv would apply the first layer's pairs to other rows
            raise ValueError(f"layer '{layer.name}': indice_key '{key}' belongs to '{held.name}', whose input "
                             f"has other rows; submanifold convs share a key only on the same coords")


def rows_after(layer: ConvLayer, x: Sparse, new_rows: str) -> str:
    """The row-set name of a conv's output (see `Values.rows`)."""
    if layer.kind == "subm":
        return x.handle.rows
    if layer.kind == "inverse":
        return layer.forward.handle.rows
    return new_rows


def check_add(a: Sparse, b: Sparse) -> None:
    """A residual add needs the same channels on the same rows."""
    if a.channels != b.channels or tuple(a.spatial_shape) != tuple(b.spatial_shape):
        raise ValueError(f"add of {a.channels} channels on {list(a.spatial_shape)} and {b.channels} channels "
                         f"on {list(b.spatial_shape)}")
    if a.handle.rows != b.handle.rows:
        raise ValueError(f"add of tensors on different rows ('{a.handle.rows}' and '{b.handle.rows}'): a sparse "
                         f"add needs both on the same coords in the same order")


def check_reshape(x: Dense, shape) -> tuple:
    shape = tuple(int(v) for v in shape)
    if int(np.prod(shape)) != int(np.prod(x.shape)):
        raise ValueError(f"reshape of {list(x.shape)} to {list(shape)} changes the element count")
    return shape


def output_name(index: int, count: int) -> str:
    """The name of graph output `index` of `count`, the same in every ONNX form: "output", or "output_i"
    among several. A sparse output's coordinates (where the graph has them) are "<name>_coords", the
    importers' convention, so an imported model has the outputs of the canonical one."""
    return "output" if count == 1 else f"output_{index}"
