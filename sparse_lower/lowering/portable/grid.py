"""The site grid of a sparse tensor, built inside the graph: the portable target's replacement for a
hash table of coordinates, which standard ONNX has not.

A `SiteGrid` is a flat int32 tensor with one cell per site of every batch of the grid, grown on each
side of each dimension by a halo, plus one last cell: cell `b·V + Σ (x_i + low_i)·stride_i` (V the
cells of one batch of the grown grid) holds 1 + the row of the sparse tensor at (b, x), or 0 where no
row is. The compute gathers from the features with a zero row put first, so what a cell holds is
the row to gather, the zero row for a missing neighbour. A neighbour's row is then one `Gather` of
its cell: the halo holds only zeros, so a neighbour up to `low`/`high` sites outside the grid is
missing without a bounds check, and stays in its own batch.

Built with `ScatterElements` of the row numbers into a `ConstantOfShape` of zeros, so it costs 4 bytes
per cell and batch (`grid_bytes`), which is why the portable target refuses grids over `MAX_GRID_BYTES`.

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

from ..context import INT64
from .emit import BOOL, INT32, Emit

MAX_GRID_BYTES = 2**31  # per batch; the CenterPoint frame's finest grid, [43, 1442, 1442], takes 358 MB


def row_major_strides(extents) -> np.ndarray:
    """The stride of each dimension of a row-major grid of these extents."""
    return np.array([prod(extents[i + 1:]) for i in range(len(extents))], np.int64)


def grid_bytes(extents, low, high) -> int:
    """The bytes of one batch of a site grid (int32 cells)."""
    return 4 * prod(s + a + b for s, a, b in zip(extents, low, high))


@dataclass(frozen=True)
class SiteGrid:
    """The rows of one sparse tensor by site (see the module docstring)."""

    cells: gs.Tensor  # int32 [B·V + 1]: 1 + row, 0 where none
    extents: tuple[int, ...]  # the grid's spatial_shape S
    low: tuple[int, ...]  # the halo before each dimension
    high: tuple[int, ...]  # and after it
    batches: gs.Tensor  # int64 [1]: B, one more than the largest batch index (0 for no rows)
    keys: gs.Tensor  # int64 [N]: each row's cell (a rule-breaking row: the origin's, so that lookups stay in bounds)
    invalid: gs.Tensor | None  # bool [1]: whether a row breaks the rules; None: the rows are right by construction
    inside: gs.Tensor | None  # bool [N]: each row inside the grid with a batch >= 0 (None: all are)

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(s + a + b for s, a, b in zip(self.extents, self.low, self.high))

    @property
    def volume(self) -> int:
        return prod(self.padded)

    @property
    def strides(self) -> np.ndarray:
        return row_major_strides(self.padded)

    @property
    def origin(self) -> int:
        """The cell of site 0 of batch 0."""
        return int(np.dot(self.low, self.strides))

    def end(self, e: Emit) -> gs.Tensor:
        """int64 [1]: B·V, the last cell, where no lookup reaches."""
        return e("Mul", self.batches, e.const([self.volume]), shape=[1], name="end")


def site_keys(e: Emit, coords: gs.Tensor, weights, offset: int) -> gs.Variable:
    """int64 [N]: Σ coords[:, j]·weights[j] + offset, the cell of each row of `coords`."""
    weighted = e("Mul", coords, e.const(weights), shape=[None, len(weights)])
    keys = e("ReduceSum", weighted, e.const([1]), shape=[None], keepdims=0)
    return e("Add", keys, e.const(offset), shape=[None], name="keys") if offset else keys


def build_grid(e: Emit, coords: gs.Tensor, extents, low, high, check: bool, inherited: gs.Tensor | None) -> SiteGrid:
    """The grid of `coords` (int64 [N, 1+D]). `check`: whether the coords come from outside (a graph
    input) and are checked; coords that the lowering made itself (unique sites inside their grid)
    are not, and carry the `inherited` flag of the coords they were made from."""
    ndim = len(extents)
    padded = tuple(s + a + b for s, a, b in zip(extents, low, high))
    volume, strides = prod(padded), row_major_strides(padded)
    origin = int(np.dot(low, strides))
    n = e.rows(coords)
    batch = e.column(coords, 0)
    largest = e("ReduceMax", e("Concat", batch, e.const([-1]), shape=[None], axis=0), shape=[1], keepdims=1)
    batches = e("Add", largest, e.const([1]), shape=[1], name="batches")
    keys = site_keys(e, coords, [volume, *strides], origin)
    end = e("Mul", batches, e.const([volume]), shape=[1], name="end")
    inside, invalid = None, inherited
    written = keys
    if check:
        above = e("GreaterOrEqual", coords, e.const(np.zeros(1 + ndim)), dtype=BOOL, shape=[None, 1 + ndim])
        below = e("Less", coords, e.const([np.iinfo(np.int64).max, *extents]), dtype=BOOL, shape=[None, 1 + ndim])
        inside = e.all_of_row(e("And", above, below, dtype=BOOL, shape=[None, 1 + ndim]), shape=[None])
        written = e("Where", inside, keys, end, shape=[None], name="written")
        keys = e("Where", inside, keys, e.const(origin), shape=[None], name="safe_keys")
    empty = e("ConstantOfShape", e("Add", end, e.const([1]), shape=[1], name="size"), dtype=INT32, shape=[None],
              value=gs.Constant("zero_int32", np.zeros(1, np.int32)))
    last = e("Squeeze", e.cast(n, INT32, shape=[1]), e.const([0]), dtype=INT32, shape=[])
    numbers = e("Range", e.const(1, INT32), e("Add", last, e.const(1, INT32), dtype=INT32, shape=[]), e.const(1, INT32),
                dtype=INT32, shape=[None], name="numbers")  # 1 + row
    cells = e("ScatterElements", empty, written, numbers, dtype=INT32, shape=[None], name="cells", axis=0)
    if check:
        back = e("Gather", cells, written, dtype=INT32, shape=[None], name="read_back", axis=0)
        own = e("And", inside, e("Equal", back, numbers, dtype=BOOL, shape=[None]), dtype=BOOL, shape=[None])
        invalid = e.any(e("Not", own, dtype=BOOL, shape=[None]))
    return SiteGrid(cells, tuple(extents), tuple(low), tuple(high), batches, keys, invalid, inside)


def lookup(e: Emit, grid: SiteGrid, keys: gs.Tensor, shape: list) -> gs.Variable:
    """int32: 1 + the row at each cell key (0 where none); every key must lie in the grid."""
    return e("Gather", grid.cells, keys, dtype=INT32, shape=shape, name="nbr", axis=0)
