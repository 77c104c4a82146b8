"""The output sites of SparseConv and SparseDeconv in standard ops: every candidate site of every
input row and tap (taps.py) that lies in the output grid, each once, sorted (grid.sorted_cells: a
mark per cell, then `NonZero`, which lists cells in ascending order: the lexicographic order of
(batch, d0, d1, d2))."""

from __future__ import annotations

from math import prod

import numpy as np
import onnx_graphsurgeon as gs

from .emit import BOOL, Emit
from .grid import SiteGrid, cells_end, sorted_cells
from .taps import inside_extent, over_taps, row_major_strides

_NO_BOUND = np.iinfo(np.int64).max


def reached_sites(e: Emit, grid: SiteGrid, coords: gs.Tensor, positions: list[gs.Tensor],
                  reachable: list[gs.Tensor | None], counts, extents, capacity: int | None = None
                  ) -> tuple[gs.Variable, gs.Tensor | None]:
    """(out_coords [M, 1+D], overflow): the sorted sites of the candidates of the input rows `coords`
    (same batch): per dimension, `positions[i] [N, counts[i]]`, reachable where `reachable[i]` (None:
    always). Candidates outside `extents` are dropped. With a `capacity` (the static form), M is the
    capacity, the rows past the last site are padding (−1) and `overflow` says that more sites were
    reached (grid.sorted_cells)."""
    kernel = counts
    volume, strides = prod(extents), row_major_strides(extents)
    valid = [inside_extent(e, p, extent) if r is None else e("And", r, inside_extent(e, p, extent), dtype=BOOL)
             for p, r, extent in zip(positions, reachable, extents)]
    inside = over_taps(e, "And", valid, kernel, BOOL)
    if grid.inside is not None:
        rows = e("Unsqueeze", grid.inside, e.const(list(range(1, 1 + len(kernel)))), dtype=BOOL)
        inside = e("And", inside, rows, dtype=BOOL)
    cells = over_taps(e, "Add", [e("Mul", p, e.const(stride)) for p, stride in zip(positions, strides)], kernel)
    batch_cells = e("Mul", e.column(coords, 0), e.const(volume), shape=[None])
    spread = list(range(1, 1 + len(kernel)))
    keys = e("Add", cells, e("Unsqueeze", batch_cells, e.const(spread), shape=[None, *[1] * len(kernel)]))
    end = cells_end(e, grid.batches, volume)
    marked_keys = e.flat(e("Where", inside, keys, end))
    found, overflow = sorted_cells(e, marked_keys, end, capacity)
    return decoded_sites(e, found, end, extents, capacity is not None), overflow


def decoded_sites(e: Emit, cells: gs.Tensor, end: gs.Tensor, extents, padded: bool) -> gs.Variable:
    """The coords [M, 1+D] of linear sites `cells [M]` (b·V + Σ x_i·stride_i); with `padded`, rows
    holding `end` (the static form's empty slots) become padding rows, all −1."""
    ndim, volume, strides = len(extents), prod(extents), row_major_strides(extents)
    divided = e("Div", e("Unsqueeze", cells, e.const([1]), shape=[None, 1]), e.const([volume, *strides]),
                shape=[None, 1 + ndim])
    coords = e("Mod", divided, e.const([_NO_BOUND, *extents]), shape=[None, 1 + ndim], name="out_coords")
    if not padded:
        return coords
    real = e("Unsqueeze", e("Less", cells, end, dtype=BOOL, shape=[None]), e.const([1]), dtype=BOOL, shape=[None, 1])
    return e("Where", real, coords, e.const(-1), shape=[None, 1 + ndim], name="out_coords")
