"""Candidate sites per tap, output sites, and quotients, in standard ops.

* A conv's candidate site for row m and tap k is, per dimension, a function of that dimension's
  coordinate and tap index alone. So the arithmetic runs per dimension on `[M, K_i]` tables
  (`per_dimension`), and only their sum (a cell) or conjunction (a validity) is spread over the K
  taps (`over_taps`): K·M elements instead of K·M·D for every step of the arithmetic.
* `exact_quotients`: a SparseConv's output o is reached by input i through tap k when
  `o·s = i + pb − k·d`, a transposed conv's output o reads input i when `i·s = o + pb − k·d`: both
  need the quotient and whether the division is exact.
* `reached_sites`: the sites reached, each once, sorted: every candidate marks its cell in a zero grid
  of the output extent (`ScatterElements`; the candidates outside go to a last cell), and `NonZero`
  lists the marked cells in ascending order, which is the lexicographic order of (batch, d0, d1, d2).
  The marks are float32: TensorRT's ONNX parser takes `NonZero` of float tensors only.
"""

from __future__ import annotations

from math import prod

import numpy as np
import onnx_graphsurgeon as gs

from ..context import FLOAT
from .emit import BOOL, Emit
from .grid import SiteGrid, row_major_strides

_NO_BOUND = np.iinfo(np.int64).max


def per_dimension(e: Emit, coords: gs.Tensor, dim: int, scale: int, shifts: np.ndarray) -> gs.Variable:
    """[M, K_i]: `coords[:, 1 + dim]·scale + shifts[k]` for each tap index k of dimension `dim`."""
    column = e("Unsqueeze", e.column(coords, 1 + dim), e.const([1]), shape=[None, 1])
    if scale != 1:
        column = e("Mul", column, e.const(scale), shape=[None, 1])
    return e("Add", column, e.const(np.asarray(shifts)[None]), shape=[None, len(shifts)], name=f"dim{dim}")


def over_taps(e: Emit, op: str, parts: list[gs.Tensor | None], kernel, dtype=np.int64) -> gs.Tensor | None:
    """[M, K]: `op` ("Add" or "And") of one value per dimension, `parts[i] [M, K_i]`, for every tap, in
    the kernel's row-major order (the weights'). None parts are left out; None if all are."""
    total = None
    for dim, part in enumerate(parts):
        if part is None:
            continue
        axes = [1 + other for other in range(len(kernel)) if other != dim]
        spread = e("Unsqueeze", part, e.const(axes), dtype=dtype) if axes else part
        total = spread if total is None else e(op, total, spread, dtype=dtype)
    if total is None or len(kernel) == 1:
        return total
    return e("Reshape", total, e.const([-1, prod(kernel)]), dtype=dtype, shape=[None, prod(kernel)])


def exact_quotients(e: Emit, numerators: gs.Tensor, stride: int) -> tuple[gs.Tensor, gs.Tensor | None]:
    """(floor(n / s), whether n / s is exact) per element of `numerators`; quotients below −1 come out
    as −1 (a site outside the grid either way). None for exactness: a stride of 1."""
    if stride == 1:
        return numerators, None
    shifted = e("Add", e("Max", numerators, e.const(-stride)), e.const(stride))  # >= 0
    quotients = e("Div", shifted, e.const(stride), name="quotients")
    exact = e("Equal", e("Mul", quotients, e.const(stride)), shifted, dtype=BOOL, name="exact")
    return e("Sub", quotients, e.const(1)), exact


def inside_extent(e: Emit, positions: gs.Tensor, extent) -> gs.Variable:
    """bool, element-wise: 0 <= position < extent (an int, or one per element of the last axis)."""
    above = e("GreaterOrEqual", positions, e.const(0), dtype=BOOL)
    return e("And", above, e("Less", positions, e.const(extent), dtype=BOOL), dtype=BOOL, name="inside")


def reached_sites(e: Emit, grid: SiteGrid, coords: gs.Tensor, positions: list[gs.Tensor],
                  reachable: list[gs.Tensor | None], kernel, extents) -> gs.Variable:
    """The output coords [M, 1+D], sorted, of the candidate sites of the input rows `coords` (same
    batch): per dimension, `positions[i] [N, K_i]`, reachable where `reachable[i]` (None: always).
    Candidates outside `extents` are dropped."""
    volume, strides = prod(extents), row_major_strides(extents)
    valid = [inside_extent(e, p, extent) if r is None else e("And", r, inside_extent(e, p, extent), dtype=BOOL)
             for p, r, extent in zip(positions, reachable, extents)]
    inside = over_taps(e, "And", valid, kernel, BOOL)
    if grid.inside is not None:
        inside = e("And", inside, e("Unsqueeze", grid.inside, e.const([1]), dtype=BOOL, shape=[None, 1]), dtype=BOOL)
    cells = over_taps(e, "Add", [e("Mul", p, e.const(stride)) for p, stride in zip(positions, strides)], kernel)
    batch_cells = e("Mul", e.column(coords, 0), e.const(volume), shape=[None])
    keys = e("Add", cells, e("Unsqueeze", batch_cells, e.const([1]), shape=[None, 1]), shape=[None, None])
    end = e("Mul", grid.batches, e.const([volume]), shape=[1], name="end")
    marked_keys = e("Reshape", e("Where", inside, keys, end, shape=[None, None]), e.const([-1]), shape=[None])
    zeros = e("ConstantOfShape", e("Add", end, e.const([1]), shape=[1]), dtype=FLOAT, shape=[None],
              value=gs.Constant("zero", np.zeros(1, np.float32)))
    ones = e("Expand", e.const([1], FLOAT), e("Shape", marked_keys, shape=[1]), dtype=FLOAT, shape=[None])
    marks = e("ScatterElements", zeros, marked_keys, ones, dtype=FLOAT, shape=[None], name="marks", axis=0)
    used = e("Slice", marks, e.const([0]), end, e.const([0]), dtype=FLOAT, shape=[None])
    found = e("Reshape", e("NonZero", used, shape=[1, None]), e.const([-1]), shape=[None], name="sites")
    ndim = len(extents)
    divided = e("Div", e("Unsqueeze", found, e.const([1]), shape=[None, 1]), e.const([volume, *strides]),
                shape=[None, 1 + ndim])
    return e("Mod", divided, e.const([_NO_BOUND, *extents]), shape=[None, 1 + ndim], name="out_coords")
