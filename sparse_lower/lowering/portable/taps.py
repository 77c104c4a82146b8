"""Per-dimension tap arithmetic in standard ops.

A conv's candidate site for row m and tap k is, per dimension, a function of that dimension's
coordinate and tap index alone. So the arithmetic runs per dimension on `[M, K_i]` tables
(`per_dimension`), and only their sum (a cell) or conjunction (a validity) is spread over the K taps
(`over_taps`): K·M elements instead of K·M·D for every step of the arithmetic.

`exact_quotients`: a SparseConv's output o is reached by input i through tap k when
`o·s = i + pb − k·d`, a transposed conv's output o reads input i when `i·s = o + pb − k·d`: both
need the quotient and whether the division is exact.
"""

from __future__ import annotations

from math import prod

import numpy as np
import onnx_graphsurgeon as gs

from .emit import BOOL, Emit


def row_major_strides(extents) -> np.ndarray:
    """The stride of each dimension of a row-major grid of these extents."""
    return np.array([prod(extents[i + 1:]) for i in range(len(extents))], np.int64)


def per_dimension(e: Emit, coords: gs.Tensor, dim: int, scale: int, shifts: np.ndarray) -> gs.Variable:
    """[M, K_i]: `coords[:, 1 + dim]·scale + shifts[k]` for each tap index k of dimension `dim`."""
    column = e("Unsqueeze", e.column(coords, 1 + dim), e.const([1]), shape=[None, 1])
    if scale != 1:
        column = e("Mul", column, e.const(scale), shape=[None, 1])
    return e("Add", column, e.const(np.asarray(shifts)[None]), shape=[None, len(shifts)], name=f"dim{dim}")



def over_taps(e: Emit, op: str, parts: list[gs.Tensor | None], kernel, dtype=np.int64) -> gs.Tensor | None:
    """`op` ("Add" or "And") of one value per dimension, `parts[i] [M, K_i]`, for every tap, spread as
    [M, K_0, …, K_{D−1}] (a dimension without a part keeps extent 1): `Flatten(axis=1)` of it lists the
    taps in the kernel's row-major order (the weights'). None if no part is given."""
    total = None
    for dim, part in enumerate(parts):
        if part is None:
            continue
        axes = [1 + other for other in range(len(kernel)) if other != dim]
        spread = e("Unsqueeze", part, e.const(axes), dtype=dtype) if axes else part
        total = spread if total is None else e(op, total, spread, dtype=dtype)
    return total


def reached_by_strided(e: Emit, coords: gs.Tensor, dim: int, size: int, stride: int, dilation: int, pad: int,
                       extent: int) -> tuple[gs.Variable, gs.Variable]:
    """SparseConv's output positions reached by each input row in dimension `dim`: ([N, J] positions,
    [N, J] whether each is reached). o is reached by i through some tap k when `o·s = i + pb − k·d`, so
    the candidates are the J = ⌊(K−1)·d / s⌋ + 1 values `⌊(i + pb)/s⌋ − j`, each reached when
    `r = i + pb − o·s` is at most (K−1)·d and a multiple of d, and o lies in `[0, extent)`: for a
    stride of 2 and a kernel of 3, 2 candidates per dimension where the taps are 3."""
    count = (size - 1) * dilation // stride + 1
    shifted = e("Add", e("Unsqueeze", e.column(coords, 1 + dim), e.const([1]), shape=[None, 1]), e.const(pad),
                shape=[None, 1])
    positions = e("Sub", e("Div", shifted, e.const(stride), shape=[None, 1]), e.const(np.arange(count)[None]),
                  shape=[None, count], name=f"dim{dim}")
    rests = e("Sub", shifted, e("Mul", positions, e.const(stride), shape=[None, count]), shape=[None, count])
    reached = e("And", inside_extent(e, positions, extent),
                e("LessOrEqual", rests, e.const((size - 1) * dilation), dtype=BOOL), dtype=BOOL)
    if dilation > 1:
        multiple = e("Equal", e("Mod", rests, e.const(dilation)), e.const(0), dtype=BOOL)
        reached = e("And", reached, multiple, dtype=BOOL)
    return positions, reached


def floored(e: Emit, coords: gs.Tensor, dim: int, stride: int) -> gs.Variable:
    """[N, 1]: `coords[:, 1 + dim] // s`, the one output position of each input row under the floor rule
    (coordinates are ≥ 0, so ONNX's truncating Div is the floor)."""
    column = e("Unsqueeze", e.column(coords, 1 + dim), e.const([1]), shape=[None, 1])
    return e("Div", column, e.const(stride), shape=[None, 1], name=f"dim{dim}")


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
