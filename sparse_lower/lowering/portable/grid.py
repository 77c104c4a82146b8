"""The site grid of a sparse tensor, built inside the graph: the portable target's replacement for a
hash table of coordinates, which standard ONNX has not.

A dense grid of every site would take 4 bytes per cell: 358 MB for one batch of CenterPoint's
[41, 1440, 1440] voxel grid, allocated, filled and copied on every frame. LiDAR sites lie on few
columns: the frame's 79,745 voxels sit on about 55,000 of the 2 million (y, x) columns. So the grid
has two levels. One dimension, the one of the smallest extent (z for LiDAR), is the *depth*; the
others are the *column*:

* `columns`, int32 `[B·Vc + 1]`, one cell per column of every batch (Vc: the column cells of one
  batch): the column's number, 1-based in sorted order, 0 where no row is (the last cell: the column
  of the rows outside the grid, always 0);
* `table`, int32 `[(C + 1)·P + 1]`, one slice of P depth cells per column, column 0 the empty one:
  1 + the row at (column, depth), 0 where none (the last cell: where rows outside the grid are
  written).

Each dimension has cells that hold no row before and after the positions the rows take, so a
neighbour outside those positions is missing and stays in its own batch. The compute gathers from the
features with a zero row put first, so what the table holds is the row to gather. A lookup is two
`Gather`s: the column of each tap's column part, then the row at its depth.

In the dynamic form the grid is sized by the frame, not by the op's `spatial_shape` (a bound, which
may be far larger than any frame: an export's default bound is what its coordinates can hold). Each
dimension spans the frame's own rows, from their smallest to their largest position (window.py), with
one empty cell on each side; a position is clamped into that span, so a neighbour past it reads an
empty cell. Its memory follows the frame: 4 bytes per column cell of the rows' span, plus 4·P per
occupied column (26 MB on the CenterPoint frame). A frame whose grid would take more than
`MAX_GRID_BYTES` flags itself, as a frame that breaks a rule does, and its grid collapses to one empty
cell per dimension instead of being allocated.

In the static form (`Fixed`: `max_active`) every size is a constant: the grid spans the op's whole
grid, each dimension grown by a halo (`low` before it, `high` after it) as wide as its taps reach, so
that no position needs clamping; it holds `batches` batches, the table as many columns as the tensor
has rows, and `sorted_cells` numbers the occupied columns with a `CumSum` rather than `NonZero`.
Padding rows (batch −1) are left out. Its memory is said when lowering: at worst (every column
occupied) 4·(P + 2) per column cell (`grid_bytes`), refused past `MAX_GRID_BYTES` per batch.

Rows that break the rules of a sparse tensor (a coordinate outside the grid, a negative batch, two
rows on one site) cannot raise an error in a standard graph. The grid finds them: the rows outside
are written to the last cell instead, and a row that does not read its own number back from its
cell shares it with another. `invalid` (bool [1]) says so, and the layers reading the tensor add NaN
to every output feature (compute.py), so a bad frame never gives plausible numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
import onnx_graphsurgeon as gs

from ..context import FLOAT, INT64
from ..nna.sites import row_count
from .emit import BOOL, INT32, Emit
from .taps import over_taps
from .window import Size, as_tensor, over_limit, row_major, span, unless, vector

# A frame's grid or marks (the dynamic form), a batch of the static form's at worst; the CenterPoint backbone's
# finest static grid: 357 MiB
MAX_GRID_BYTES = 2**31


def depth_dimension(padded) -> int:
    """The dimension of the table's slices: the one of the smallest (grown) extent, the first of equals."""
    return int(np.argmin(padded))


def column_volume(extents, low, high) -> int:
    """The column cells of one batch of a site grid (every dimension grown by its halo, but the depth)."""
    padded = [s + a + b for s, a, b in zip(extents, low, high)]
    return prod(padded) // padded[depth_dimension(padded)]


def grid_bytes(extents, low, high) -> int:
    """The most bytes one batch of a site grid takes: every column occupied."""
    padded = [s + a + b for s, a, b in zip(extents, low, high)]
    return 4 * (padded[depth_dimension(padded)] + 2) * column_volume(extents, low, high)


@dataclass(frozen=True)
class Fixed:
    """The static form's sizes (`max_active`): the rows of the tensor at hand, and the batches every grid
    holds. Rows whose batch index is −1 are padding: they hold no site, and break no rule."""

    rows: int
    batches: int


@dataclass(frozen=True)
class SiteGrid:
    """The rows of one sparse tensor by site (see the module docstring). Per dimension, a position p is
    cell `p + offsets[i]` of `sizes[i]` cells; where `clamped` (the dynamic form's window), positions
    past the span are clamped into its empty edge cells, else the halo holds every position a tap
    reaches."""

    columns: gs.Tensor  # int32 [B·Vc + 1]
    table: gs.Tensor  # int32 [(C + 1)·P + 1]
    depth: int  # the dimension of the table's slices
    offsets: tuple[Size, ...]
    sizes: tuple[Size, ...]
    clamped: bool
    batches: gs.Tensor  # int64 [1]: B, one more than the largest batch index (0 for no rows)
    invalid: gs.Tensor | None  # bool [1]: whether a row breaks the rules; None: the rows are right by construction
    inside: gs.Tensor | None  # bool [N]: each row inside the grid with a batch >= 0 (None: all are)
    strides: dict[int, Size]  # the stride of each column dimension in the column cells
    volume: Size  # Vc, the column cells of one batch

    def cells(self, e: Emit, dim: int, positions: gs.Tensor) -> gs.Variable:
        """The cells of `positions` along dimension `dim` (any shape)."""
        cells = e("Add", positions, as_tensor(e, self.offsets[dim]))
        if not self.clamped:
            return cells
        last = e("Sub", self.sizes[dim], e.const([1]), shape=[1], name="last_cell")
        return e("Max", e("Min", cells, last), e.const(0), name="cells")


def _layout(e: Emit, depth: int, sizes: list[Size]) -> tuple[dict[int, Size], Size]:
    """(the strides of the column dimensions, the column volume) of a grid of `sizes` cells per dimension."""
    dims = [i for i in range(len(sizes)) if i != depth]
    strides, volume = row_major(e, [sizes[i] for i in dims])
    return dict(zip(dims, strides)), volume


def build_grid(e: Emit, coords: gs.Tensor, extents, low, high, check: bool, inherited: gs.Tensor | None,
               fixed: Fixed | None = None) -> SiteGrid:
    """The grid of `coords` (int64 [N, 1+D]) in the op's grid of `extents`: in the dynamic form spanning
    the frame's rows (`low` and `high` unused), in the static form (`fixed`, whose every size is a
    constant, its padding rows left out) the whole grid with the halo `low` before and `high` after
    each dimension. `check`: whether the coords come from outside (a graph input) and are checked;
    coords that the lowering made itself (unique sites inside their grid) are not, and carry the
    `inherited` flag of the coords they were made from."""
    ndim = len(extents)
    batch = e.column(coords, 0)
    inside, invalid = None, inherited
    padding = e("Equal", batch, e.const(-1), dtype=BOOL, shape=[None], name="padding") if fixed else None
    if check:
        bounds = [fixed.batches if fixed else np.iinfo(np.int64).max, *extents]
        above = e("GreaterOrEqual", coords, e.const(np.zeros(1 + ndim)), dtype=BOOL, shape=[None, 1 + ndim])
        below = e("Less", coords, e.const(bounds), dtype=BOOL, shape=[None, 1 + ndim])
        inside = e.all_of_row(e("And", above, below, dtype=BOOL, shape=[None, 1 + ndim]), shape=[None])
    elif fixed:
        inside = e("Not", padding, dtype=BOOL, shape=[None], name="inside")
    if fixed:  # every size a constant, so that shape inference finds every shape
        batches = e.const([fixed.batches])
    else:
        largest = e("ReduceMax", e("Concat", batch, e.const([-1]), shape=[None], axis=0), shape=[1], keepdims=1)
        batches = e("Add", largest, e.const([1]), shape=[1], name="batches")
    if fixed:
        depth = depth_dimension([s + a + b for s, a, b in zip(extents, low, high)])
        offsets, sizes = tuple(low), tuple(s + a + b for s, a, b in zip(extents, low, high))
        strides, volume = _layout(e, depth, list(sizes))
        shifted, offset = coords, sum(low[i] * stride for i, stride in strides.items())
    else:
        depth = depth_dimension([s + 2 for s in extents])
        spans = [span(e, e.column(coords, 1 + i), inside, extent) for i, extent in enumerate(extents)]
        widths = [width for _, width in spans]
        strides, volume = _layout(e, depth, [e("Add", w, e.const([2]), shape=[1]) for w in widths])
        most_slices = e("Add", e.rows(coords), e.const([1]), shape=[1], name="most_slices")  # the table's
        held = e("Add", e("Mul", batches, as_tensor(e, volume), shape=[1]),
                 e("Mul", most_slices, e("Add", widths[depth], e.const([2]), shape=[1]), shape=[1]), shape=[1])
        over = over_limit(e, held, MAX_GRID_BYTES // 4)  # int32 cells: the columns and the table
        invalid = e.either(invalid, over)
        sizes = tuple(e("Add", unless(e, over, w), e.const([2]), shape=[1], name="size") for w in widths)
        offsets = tuple(e("Sub", e.const([1]), first, shape=[1], name="offset") for first, _ in spans)
        strides, volume = _layout(e, depth, list(sizes))
        # every row's cells, clamped into the grid (rows outside the bound are left out below, and a grid over
        # the limit, which holds none, flags the frame)
        shift = vector(e, [0, *offsets])
        top = vector(e, [int(np.iinfo(np.int64).max), *[e("Sub", size, e.const([1]), shape=[1]) for size in sizes]])
        shifted = e("Max", e("Min", e("Add", coords, shift, shape=[None, 1 + ndim]), top, shape=[None, 1 + ndim]),
                    e.const(0), shape=[None, 1 + ndim], name="shifted")
        offset = 0
    weights = vector(e, [volume] + [strides.get(i, 0) for i in range(ndim)])
    column_keys = e("ReduceSum", e("Mul", shifted, weights, shape=[None, 1 + ndim]), e.const([1]),
                    shape=[None], name="column_keys", keepdims=0)
    if offset:
        column_keys = e("Add", column_keys, e.const(offset), shape=[None], name="column_keys")
    end = cells_end(e, batches, volume)
    if inside is not None:
        column_keys = e("Where", inside, column_keys, end, shape=[None], name="column_keys")
    occupied, _ = sorted_cells(e, column_keys, end, fixed.rows if fixed else None)  # columns <= rows: no overflow
    if fixed:
        count = e.const(fixed.rows, INT32)
        numbers = e("Where", e("Less", occupied, end, dtype=BOOL, shape=[None]), _numbers(e, count), e.const(0, INT32),
                    dtype=INT32, shape=[None], name="numbers")  # the empty slots write 0 to the last cell
    else:
        numbers = numbers_like(e, occupied)
    columns = e("ScatterElements", e.zeros(_plus_one(e, end), INT32), occupied,
                numbers, dtype=INT32, shape=[None], name="columns", axis=0)
    column = e.cast(e.gather_like(columns, column_keys, INT32, shape=[None]), INT64, shape=[None])
    depths = e.column(shifted, 1 + depth) if not fixed else \
        e("Add", e.column(coords, 1 + depth), e.const(low[depth]), shape=[None])
    cells = e("Add", e("Mul", column, as_tensor(e, sizes[depth]), shape=[None]), depths, shape=[None], name="cells")
    if fixed:
        last = e.const([(fixed.rows + 1) * sizes[depth]])  # the table's last cell
    else:
        slices = e("Add", e.cast(e.rows(occupied), INT64, shape=[1]), e.const([1]), shape=[1])
        last = e("Mul", slices, sizes[depth], shape=[1], name="last")
    if inside is not None:
        cells = e("Where", inside, cells, last, shape=[None], name="cells")
    numbers = _numbers(e, e.const(fixed.rows, INT32)) if fixed else numbers_like(e, coords)
    table = e("ScatterElements", e.zeros(_plus_one(e, last), INT32), cells, numbers,
              dtype=INT32, shape=[None], name="table", axis=0)
    if check:
        back = e.gather_like(table, cells, INT32, shape=[None], name="read_back")
        own = e("And", inside, e("Equal", back, numbers, dtype=BOOL, shape=[None]), dtype=BOOL, shape=[None])
        broken = e("Not", own, dtype=BOOL, shape=[None])
        if fixed:
            broken = e("And", broken, e("Not", padding, dtype=BOOL, shape=[None]), dtype=BOOL, shape=[None])
        invalid = e.either(invalid, e.any(broken))
    return SiteGrid(columns, table, depth, offsets, sizes, not fixed, batches, invalid, inside, strides, volume)


def cells_end(e: Emit, batches: gs.Tensor, volume: Size) -> gs.Tensor:
    """int64 [1]: batches·volume, the first cell past every batch's `volume` cells; a constant where
    both are (the static form keeps every shape inferable)."""
    if isinstance(batches, gs.Constant) and isinstance(volume, (int, np.integer)):
        return e.const(np.asarray(batches.values) * volume)
    return e("Mul", batches, vector(e, [volume]) if isinstance(volume, (int, np.integer)) else volume, shape=[1],
             name="end")


def _plus_one(e: Emit, size: gs.Tensor) -> gs.Tensor:
    """size + 1, a constant where size is one (the static form keeps every shape inferable)."""
    if isinstance(size, gs.Constant):
        return e.const(np.asarray(size.values) + 1)
    return e("Add", size, e.const([1]), shape=[1])


def _numbers(e: Emit, count: gs.Constant) -> gs.Variable:
    """int32 1, 2, …, count: a Range with constant limits, which shape inference reads (the static form)."""
    return e("Range", e.const(1, INT32), e.const(int(count.values) + 1, INT32), e.const(1, INT32), dtype=INT32,
             shape=[int(count.values)], name="numbers")


def numbers_like(e: Emit, tensor: gs.Tensor) -> gs.Variable:
    """int32 1, 2, …, one per row of `tensor`: a Range to its row count, reshaped to that count (a no-op
    that tells TVM's importer the Range is as long as the rows it is compared with or written beside)."""
    count = e("Squeeze", e.cast(e.rows(tensor), INT32, shape=[1]), e.const([0]), dtype=INT32, shape=[])
    limit = e("Add", count, e.const(1, INT32), dtype=INT32, shape=[])
    numbers = e("Range", e.const(1, INT32), limit, e.const(1, INT32), dtype=INT32, shape=[None], name="numbers")
    return e("Reshape", numbers, row_count(e.ctx, tensor), dtype=INT32, shape=[None], name="numbers")


def sorted_cells(e: Emit, keys: gs.Tensor, end: gs.Tensor, capacity: int | None = None
                 ) -> tuple[gs.Variable, gs.Tensor | None]:
    """(int64 cells, overflow): the distinct `keys` below `end`, ascending. Each key marks its cell of a
    zero grid of `end` + 1 cells (float marks: TensorRT's NonZero takes no integers) with 1, a key at
    `end` (a row outside, or padding) with 0, so the last cell stays unmarked and nothing is cut off
    after; `NonZero` lists the marked cells in order. With a `capacity` (the static form) they are
    `capacity` cells, `end` in the slots past the last: a `CumSum` of the marks numbers each marked
    cell (exact in float32 below 2^24 cells, which the static form checks), and a `ScatterElements`
    puts it in its slot; `overflow` (bool [1]) says that more cells than that were marked."""
    zeros = e.zeros(_plus_one(e, end), FLOAT)
    inside = e.cast(e("Less", keys, end, dtype=BOOL, shape=[None]), FLOAT, shape=[None])
    marks = e("ScatterElements", zeros, keys, inside, dtype=FLOAT, shape=[None], name="marks", axis=0)
    if capacity is None:
        return e("Squeeze", e("NonZero", marks, shape=[1, None]), e.const([0]), shape=[None], name="sorted"), None
    running = e("CumSum", marks, e.const(0), dtype=FLOAT, shape=[None], name="running")
    slots = e("Sub", e.cast(running, INT64, shape=[None]), e.const(1), shape=[None], name="slots")
    limit = e.const(int(end.values[0]) + 1) if isinstance(end, gs.Constant) else \
        e("Squeeze", _plus_one(e, end), e.const([0]), shape=[])
    cells = e("Range", e.const(0), limit, e.const(1), shape=[None], name="cells")
    marked = e("Greater", marks, e.const(0, FLOAT), dtype=BOOL, shape=[None])
    kept = e("And", marked, e("Less", slots, e.const(capacity), dtype=BOOL, shape=[None]), dtype=BOOL, shape=[None])
    targets = e("Where", kept, slots, e.const(capacity), shape=[None], name="targets")
    empty = e("Expand", end, e.const([capacity + 1]), shape=[capacity + 1], name="empty")
    placed = e("ScatterElements", empty, targets, cells, shape=[capacity + 1], name="placed", axis=0)
    found = e("Slice", placed, e.const([0]), e.const([capacity]), e.const([0]), shape=[capacity], name="sorted")
    count = e.cast(e("Gather", running, e("Sub", end, e.const([1]), shape=[1]), dtype=FLOAT, shape=[1], axis=0),
                   INT64, shape=[1])
    return found, e("Greater", count, e.const([capacity]), dtype=BOOL, shape=[1], name="overflow")


def lookup(e: Emit, grid: SiteGrid, batch: gs.Tensor, positions: list[gs.Tensor], kernel,
           known: gs.Tensor | None = None) -> gs.Variable:
    """nbr int32 [M, K]: 1 + the row at every tap's site (0 where none), the taps in the kernel's
    row-major order. `batch [M]` and `positions[i] [M, K_i]` (dimension i of tap index k_i) give the
    sites, every position within the halo (or, in a clamped grid, anywhere); `known [M]` (None: all):
    rows whose taps are looked up, the others read the empty column."""
    shape = [None, prod(kernel)]
    depth, strides = grid.depth, grid.strides
    parts = [e("Mul", grid.cells(e, i, positions[i]), as_tensor(e, strides[i])) if i != depth else None
             for i in range(len(kernel))]
    row_cells = e("Mul", batch, as_tensor(e, grid.volume), shape=[None])
    row_cells = e("Unsqueeze", row_cells, e.const(list(range(1, 1 + len(kernel)))), shape=[None, *[1] * len(kernel)])
    spread = over_taps(e, "Add", parts, kernel)  # [M, K_0, …, 1 at the depth, …]
    cells = row_cells if spread is None else e("Add", spread, row_cells, name="column_cells")
    depth_axes = [1 + i for i in range(len(kernel)) if i != depth]
    depths = grid.cells(e, depth, positions[depth])  # [M, K_depth]
    depths = e("Unsqueeze", depths, e.const(depth_axes), name="depths") if depth_axes else depths
    if known is not None:  # the others: the empty column's first cell, whatever their positions
        known = e("Unsqueeze", known, e.const(list(range(1, 1 + len(kernel)))), dtype=BOOL)
        end = cells_end(e, grid.batches, grid.volume)
        cells = e("Where", known, cells, end, name="column_cells")
        depths = e("Where", known, depths, e.const(0), name="depths")
    column = e.cast(e.gather_like(grid.columns, cells, INT32), INT64)
    starts = e("Mul", column, as_tensor(e, grid.sizes[depth]), name="starts")  # the slices' first cells
    keys = e("Flatten", e("Add", starts, depths), shape=shape, name="keys", axis=1)
    return e.gather_like(grid.table, keys, INT32, shape=shape, name="nbr")
