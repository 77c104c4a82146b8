"""The output sites of SparseConv and SparseDeconv in standard ops: every candidate site of every
input row and tap (taps.py) that lies in the output grid, each once, sorted (grid.sorted_cells: a
mark per cell, then `NonZero`, which lists cells in ascending order: the lexicographic order of
(batch, d0, d1, d2)). In the dynamic form the marks span only the positions the candidates reach
(window.py), so their memory follows the frame, not the output grid."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .emit import BOOL, Emit
from .grid import MAX_GRID_BYTES, SiteGrid, cells_end, sorted_cells
from .taps import inside_extent, over_taps
from .window import Size, as_tensor, over_limit, product, row_major, span, unless, vector

_NO_BOUND = np.iinfo(np.int64).max


def reached_sites(e: Emit, grid: SiteGrid, coords: gs.Tensor, positions: list[gs.Tensor],
                  reachable: list[gs.Tensor | None], counts, extents, capacity: int | None = None
                  ) -> tuple[gs.Variable, gs.Tensor | None]:
    """(out_coords [M, 1+D], flag): the sorted sites of the candidates of the input rows `coords`
    (same batch): per dimension, `positions[i] [N, counts[i]]`, reachable where `reachable[i]` (None:
    always). Candidates outside `extents` are dropped. The marks span the reached positions in the
    dynamic form (window.py), flagged where they would take more than MAX_GRID_BYTES, and the whole
    output grid with a `capacity` (the static form): then M is the capacity, the rows past the last site
    are padding (−1) and the flag says that more sites were reached (grid.sorted_cells)."""
    kernel = counts
    valid = [inside_extent(e, p, extent) if r is None else e("And", r, inside_extent(e, p, extent), dtype=BOOL)
             for p, r, extent in zip(positions, reachable, extents)]
    if grid.inside is not None:
        valid = [e("And", v, e("Unsqueeze", grid.inside, e.const([1]), dtype=BOOL, shape=[None, 1]), dtype=BOOL)
                 for v in valid]
    inside = over_taps(e, "And", valid, kernel, BOOL)
    over = None
    if capacity is None:
        spans = [span(e, p, v, extent) for p, v, extent in zip(positions, valid, extents)]
        over = over_limit(e, product(e, [grid.batches, *[width for _, width in spans]]), MAX_GRID_BYTES // 4)
        # at least one cell per dimension, so that no stride is 0 (whose division onnxruntime refuses
        # even on no rows)
        sizes = [e("Max", unless(e, over, width), e.const([1]), shape=[1], name="size") for _, width in spans]
        starts: list[Size] = [first for first, _ in spans]
        # each candidate's cell along a dimension, clamped: no-op but where the marks are over the limit, whose one
        # cell per batch then takes every candidate (rows that show the flag's NaN, not none)
        places = [e("Max", e("Min", e("Sub", p, first), e("Sub", size, e.const([1]), shape=[1])), e.const(0))
                  for p, first, size in zip(positions, starts, sizes)]
    else:
        sizes, starts, places = list(extents), [0] * len(extents), positions
    strides, volume = row_major(e, sizes)
    cells = over_taps(e, "Add", [e("Mul", place, as_tensor(e, stride)) for place, stride in zip(places, strides)],
                      kernel)
    batch_cells = e("Mul", e.column(coords, 0), as_tensor(e, volume), shape=[None])
    spread = list(range(1, 1 + len(kernel)))
    keys = e("Add", cells, e("Unsqueeze", batch_cells, e.const(spread), shape=[None, *[1] * len(kernel)]))
    end = cells_end(e, grid.batches, volume)
    marked_keys = e.flat(e("Where", inside, keys, end))
    found, overflow = sorted_cells(e, marked_keys, end, capacity)
    return decoded_sites(e, found, end, sizes, capacity is not None, starts), e.either(over, overflow)


def decoded_sites(e: Emit, cells: gs.Tensor, end: gs.Tensor, sizes: list[Size], padded: bool,
                  starts: list[Size] | None = None) -> gs.Variable:
    """The coords [M, 1+D] of linear sites `cells [M]` (b·V + Σ (x_i − starts_i)·stride_i in a grid of
    `sizes` from `starts`, 0 where None); with `padded`, rows holding `end` (the static form's empty
    slots) become padding rows, all −1."""
    ndim = len(sizes)
    strides, volume = row_major(e, sizes)
    divisors = vector(e, [volume, *strides])
    moduli = vector(e, [_NO_BOUND, *sizes])
    divided = e("Div", e("Unsqueeze", cells, e.const([1]), shape=[None, 1]), divisors, shape=[None, 1 + ndim])
    coords = e("Mod", divided, moduli, shape=[None, 1 + ndim], name="out_coords")
    if starts is not None and any(not isinstance(start, int) or start for start in starts):
        coords = e("Add", coords, vector(e, [0, *starts]), shape=[None, 1 + ndim], name="out_coords")
    if not padded:
        return coords
    real = e("Unsqueeze", e("Less", cells, end, dtype=BOOL, shape=[None]), e.const([1]), dtype=BOOL, shape=[None, 1])
    return e("Where", real, coords, e.const(-1), shape=[None, 1 + ndim], name="out_coords")
