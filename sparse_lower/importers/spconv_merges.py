"""What fully sparse detectors (VoxelNeXt) do to spconv tensors besides convolving, as the tracer
(spconv_tracer.py) writes it: coordinate arithmetic as standard ops on the coords, rows concatenated,
rows that share a site merged (`Coalesce`) and sparse max pooling (`SparseMaxPool`).

The torch patterns recognised are VoxelNeXt's own:

* `x.indices[:, 1:] *= 2`: a view of coords columns multiplied in place becomes `Mul` by a per-column
  vector; the tensor's features then lie on the new coords;
* `torch.cat([a.features, b.features])` and `torch.cat([a.indices, b.indices])` (rows, dim 0) become
  `Concat` on axis 0; the features lie on the coords concatenated in the same order (their rows may
  repeat sites now: only a Coalesce may read them, which the lowering checks);
* `x.indices[:, [0, 2, 3]]` (the batch, then some spatial columns) becomes `Gather` on axis 1;
* `u, inv = torch.unique(c, dim=0, return_inverse=True)` then `y = f.new_zeros(...)` and
  `y.index_add_(0, inv, f)` become `Coalesce(f, c)` with reduction "sum": `y` its features, `u` its
  coords (sorted, as torch.unique's are);
* an spconv `SparseMaxPool` module becomes `SparseMaxPool` then `Relu`: spconv's pooling kernels
  start from 0, so they return max(0, max over the window), which is what Relu of the true maximum is.

Every coords value carries an upper bound of its grid (`_Value.grid`): a scaling by k takes an extent S
to (S − 1)·k + 1, a concatenation takes the largest extent, a Gather keeps the extents of its columns.
A Coalesce's `spatial_shape` is that bound: its keys and checks need one, its output does not depend on
it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SparseLowerError
from ..onnx_conventions import SOURCE_DOMAIN


@dataclass
class _Value:
    """A traced tensor: its graph name, kind and, for features, the coords they lie on (a name, or the
    ("rows", names) of a row concatenation not written yet). Coords carry their grid's bound; a view of
    coords columns (`kind` "coords_view") the id of the tensor it views and its columns; the pieces of a
    torch.unique / index_add_ merge their `source`."""

    name: str
    kind: str
    coords: str | tuple | None = None
    grid: tuple | None = None
    view: tuple | None = None
    source: object = None


@dataclass
class RowState:
    """What the patterns above remember between calls."""

    moved: dict = field(default_factory=dict)  # coords name -> the name after an in-place change
    row_sets: dict = field(default_factory=dict)  # tuple of coords names -> their row concatenation


_REFUSE = ("cannot be exported", "write coordinate changes as VoxelNeXt does (x.indices[:, 1:] *= k, torch.cat of "
           "indices, x.indices[:, [0, ...]], torch.unique(dim=0, return_inverse=True) + index_add_)")


def _refuse(what: str):
    raise SparseLowerError(f"{what} {_REFUSE[0]}", fix=_REFUSE[1])


class RowOps:
    """Handlers of the patterns above, mixed into the tracer (which supplies `values`, `_track`, `_node`,
    `writer` and `torch`)."""

    def _row_handlers(self, torch) -> dict:
        T = torch.Tensor
        self.rows = RowState()
        return {T.__getitem__: self._getitem, T.mul_: self._scale, T.__imul__: self._scale,
                T.__setitem__: self._setitem, torch.unique: self._unique, T.unique: self._unique,
                T.new_zeros: self._new_zeros, T.index_add_: self._index_add}

    def coords_of(self, value: _Value) -> str | None:
        """The coords name the features of `value` lie on now (after in-place changes), None where their
        row concatenation has no coords counterpart yet."""
        coords = value.coords
        if isinstance(coords, tuple):
            coords = self.rows.row_sets.get(coords[1])
        while coords in self.rows.moved:
            coords = self.rows.moved[coords]
        return coords

    def _not_coords(self, func, tensor) -> None:
        """Refuse, naming the function, a pattern of this module applied to a tensor that is no coords."""
        value = self.values.get(id(tensor)) if isinstance(tensor, self.torch.Tensor) else None
        if value is None or value.kind not in ("coords", "coords_view"):
            self.cannot_translate(func)

    def _getitem(self, func, args, kwargs, result):
        self._not_coords(func, args[0])
        value = self.values.get(id(args[0]))
        key = args[1]
        if value.kind != "coords" or not isinstance(key, tuple) or len(key) != 2 or key[0] != slice(None):
            _refuse("indexing coords (other than a choice of their columns)")
        width = args[0].shape[1]
        columns = key[1]
        if isinstance(columns, slice):
            chosen = list(range(width))[columns]
            self._track(result, _Value(value.name, "coords_view", grid=value.grid, view=(id(args[0]), chosen)))
            return
        listed = columns.tolist() if isinstance(columns, self.torch.Tensor) else columns
        if not isinstance(listed, (list, tuple)):
            _refuse(f"taking coords column {listed!r} alone (a 1-D tensor of batch or positions)")
        chosen = [int(c) for c in listed]
        if not chosen or chosen[0] != 0 or any(not 1 <= c < width for c in chosen[1:]) or len(set(chosen)) != len(chosen):
            _refuse(f"choosing coords columns {chosen} (the batch column first, then distinct spatial ones)")
        name = self._node("Gather", [value.name, self.writer.constant(f"{value.name}.columns",
                                                                      np.array(chosen, np.int64))],
                          f"{value.name}.columns", "Gather", axis=1)
        self._track(result, _Value(name, "coords", grid=tuple(value.grid[c - 1] for c in chosen[1:]),
                                   source=self.coords_of(value) or value.name))

    def _scale(self, func, args, kwargs, result):
        self._not_coords(func, args[0])
        value = self.values.get(id(args[0]))
        factor = args[1]
        if value.kind != "coords_view" or not isinstance(factor, int) or factor < 1:
            _refuse("changing coords in place (other than scaling some of their columns by a positive int)")
        base_id, columns = value.view
        if 0 in columns:
            _refuse("scaling the batch column of coords")
        base = self.values[base_id]
        scale = np.ones(len(base.grid) + 1, np.int64)
        scale[columns] = factor
        name = self._node("Mul", [base.name, self.writer.constant(f"{base.name}.scale", scale)], f"{base.name}.scaled",
                          "ScaleCoords")
        grid = tuple((extent - 1) * int(s) + 1 for extent, s in zip(base.grid, scale[1:]))
        self.rows.moved[base.name] = name
        self.values[base_id] = _Value(name, "coords", grid=grid)
        self._track(result, _Value(name, "coords_view", grid=grid, view=value.view))

    def _setitem(self, func, args, kwargs, result):
        self._not_coords(func, args[0])
        value = self.values.get(id(args[2])) if isinstance(args[2], self.torch.Tensor) else None
        if value is None or value.kind != "coords_view" or value.view[0] != id(args[0]):
            _refuse("assigning into coords (other than an in-place scaling of some of their columns)")

    def concat_rows(self, items, result) -> None:
        """torch.cat of features or coords along the rows."""
        values = [value for _, value in items]
        if any(v is None for v in values) or len({v.kind for v in values}) != 1 or values[0].kind not in (
                "features", "coords"):
            _refuse("concatenating rows of anything but the features (or the coords) of sparse tensors")
        names = [name for name, _ in items]
        if values[0].kind == "coords":
            output = self._node("Concat", names, f"{names[0]}.rows", "ConcatCoords", axis=0)
            self.rows.row_sets[tuple(names)] = output
            grid = tuple(max(extents) for extents in zip(*(v.grid for v in values)))
            self._track(result, _Value(output, "coords", grid=grid))
            return
        on = tuple(self.coords_of(v) for v in values)
        output = self._node("Concat", names, f"{names[0]}.rows", "ConcatRows", axis=0)
        self._track(result, _Value(output, "features", ("rows", on)))

    def _unique(self, func, args, kwargs, result):
        self._not_coords(func, args[0])
        value = self.values.get(id(args[0]))
        dim = kwargs.get("dim")
        if value.kind != "coords" or dim != 0 or not kwargs.get("sorted", True) \
                or not kwargs.get("return_inverse") or kwargs.get("return_counts"):
            _refuse("torch.unique of coords (other than with dim=0, return_inverse=True)")
        unique, inverse = result
        self._track(unique, _Value(value.name, "unique", grid=value.grid, source=value))
        self._track(inverse, _Value(value.name, "inverse", source=unique))

    def _new_zeros(self, func, args, kwargs, result):
        if self.values[id(args[0])].kind != "features":
            _refuse("new_zeros of a traced tensor other than features")
        self._track(result, _Value("", "zeros"))

    def _index_add(self, func, args, kwargs, result):
        target, index, source = (self.values.get(id(a)) if isinstance(a, self.torch.Tensor) else None
                                 for a in (args[0], args[2], args[3]))
        if target is None or target.kind != "zeros" or args[1] != 0 or index is None or index.kind != "inverse" \
                or source is None or source.kind != "features" or kwargs.get("alpha", 1) != 1:
            _refuse("index_add_ (other than of features into new_zeros by the inverse of a torch.unique of coords)")
        unique = self.values[id(index.source)]
        sites = unique.source  # the coords whose rows torch.unique merged
        if (sites.source or sites.name) != self.coords_of(source):
            raise SparseLowerError("index_add_ merges features by the sites of other coords", fix="merge a sparse "
                                   "tensor's features by torch.unique of its own coords (or of some of their columns)")
        merged, merged_coords = self.writer.node(
            "Coalesce", [source.name, sites.name], [f"{source.name}.merged", f"{source.name}.merged_coords"],
            self.writer.unique("Coalesce"), domain=SOURCE_DOMAIN, spatial_shape=list(sites.grid), reduction="sum")
        self._track(index.source, _Value(merged_coords, "coords", grid=sites.grid))
        self._track(result, _Value(merged, "features", merged_coords))
        self._track(args[0], _Value(merged, "features", merged_coords))

    def max_pool(self, module, x, output, name: str) -> None:
        """An spconv SparseMaxPool module: SparseMaxPool, then Relu (spconv's kernels start from 0)."""
        features, coords = self._sparse(x, name)
        attrs = {"kernel_shape": [int(k) for k in module.kernel_size], "strides": [int(s) for s in module.stride],
                 "pads": [int(p) for p in module.padding] * 2, "dilations": [int(d) for d in module.dilation],
                 "spatial_shape": [int(s) for s in x.spatial_shape]}
        if module.subm:
            attrs["submanifold"] = 1
        pooled, pooled_coords = self.writer.node(
            "SparseMaxPool", [features, coords], [f"{name}.features", f"{name}.coords"], self.writer.unique(name),
            domain=SOURCE_DOMAIN, **attrs)
        out_coords = coords if module.subm else pooled_coords
        self._track(output.indices, _Value(out_coords, "coords", grid=tuple(int(s) for s in output.spatial_shape)))
        floored = self._node("Relu", [pooled], f"{pooled}.floor", f"{name}.zero_floor")
        self._track(output.features, _Value(floored, "features", out_coords))
