"""The span of positions a frame occupies, per dimension, computed in the graph: the dynamic form sizes
its site grids and output marks by it rather than by the op's grid.

An op's `spatial_shape` is a bound. A grid of it costs what the bound holds, which is the frame's own
extent only where the bound is tight: an export of a network whose grid comes from the frame bounds it
by what the coordinates can hold (docs/source_ops.md), and Pointcept's own grid of a nuScenes frame at
0.05 m is 1515 × 2199 × 255 cells, 3.3 GiB at worst for a grid of the bound. The frame's rows span a
fraction of that. So each dimension's cells start at the smallest position of the frame's rows and
end at the largest: a `ReduceMin` and a `ReduceMax` of a column, masked where a row is left out.

Sizes here are `Size`s: an int where the lowering knows them (the static form), an int64 [1] tensor
where the frame gives them. The arithmetic on them (`product`, `as_tensor`) folds ints, so the static
form keeps every shape inferable.
"""

from __future__ import annotations

from math import prod
from typing import Union

import numpy as np
import onnx_graphsurgeon as gs

from .emit import BOOL, Emit

Size = Union[int, gs.Tensor]


def as_tensor(e: Emit, size: Size) -> gs.Tensor:
    """`size` as a graph value: a constant for an int."""
    return e.const(size) if isinstance(size, (int, np.integer)) else size


def vector(e: Emit, values: list[Size]) -> gs.Tensor:
    """int64 [len(values)] of `values`: a constant where all are ints, else their `Concat`."""
    if all(isinstance(v, (int, np.integer)) for v in values):
        return e.const([int(v) for v in values])
    return e("Concat", *[e.const([int(v)]) if isinstance(v, (int, np.integer)) else v for v in values],
             shape=[len(values)], name="sizes", axis=0)


def product(e: Emit, sizes: list[Size]) -> Size:
    """The product of `sizes` (1 for none), an int where all are ints."""
    known = prod(int(s) for s in sizes if isinstance(s, (int, np.integer)))
    total: Size = known
    for size in sizes:
        if not isinstance(size, (int, np.integer)):
            total = size if isinstance(total, int) and total == 1 else e("Mul", as_tensor(e, total), size, shape=[1])
    return total


def row_major(e: Emit, sizes: list[Size]) -> tuple[list[Size], Size]:
    """(the stride of each dimension, the volume) of a row-major grid of `sizes`."""
    return [product(e, sizes[i + 1:]) for i in range(len(sizes))], product(e, sizes)


def span(e: Emit, positions: gs.Tensor, kept: gs.Tensor | None, extent: int) -> tuple[gs.Tensor, gs.Tensor]:
    """(first, width), int64 [1] each: the smallest of `positions` (any shape) where `kept` (None: all),
    and how many positions from there to the largest (0 where none is kept, `first` then `extent`).
    `extent`: the bound every kept position lies below."""
    flat = e.flat(positions)
    if kept is not None:
        flags = e.flat(kept, BOOL)
        low = e("Where", flags, flat, e.const(extent), shape=[None], name="low")
        high = e("Where", flags, flat, e.const(-1), shape=[None], name="high")
    else:
        low, high = flat, flat
    first = e("ReduceMin", e("Concat", low, e.const([extent]), shape=[None], axis=0), shape=[1], name="first",
              keepdims=1)
    last = e("ReduceMax", e("Concat", high, e.const([-1]), shape=[None], axis=0), shape=[1], name="last", keepdims=1)
    width = e("Max", e("Add", e("Sub", last, first, shape=[1]), e.const([1]), shape=[1]), e.const([0]), shape=[1],
              name="width")
    return first, width


def over_limit(e: Emit, cells: Size, limit: int) -> gs.Tensor:
    """bool [1]: whether `cells` (int64 [1]) exceed `limit`."""
    return e("Greater", as_tensor(e, cells), e.const([limit]), dtype=BOOL, shape=[1], name="over_limit")


def unless(e: Emit, over: gs.Tensor, width: gs.Tensor) -> gs.Tensor:
    """`width`, or 0 where `over`: a window over the limit is not allocated."""
    return e("Where", over, e.const([0]), width, shape=[1], name="width")
