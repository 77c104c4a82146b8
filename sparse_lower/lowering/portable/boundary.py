"""ToSparse and ToDense in standard ops.

* ToSparse: a site is active where any channel is non-zero (NaN too: `Not(Equal(x, 0))`); `NonZero`
  of the per-site count lists the active sites in ascending order, which is the sorted order of the
  coords, and `GatherND` reads their features from the channels-last tensor.
* ToDense: `ScatterElements` of every feature into a flat zero tensor `[batch_size·C·V]` at
  `b·C·V + c·V + site`, then a `Reshape`: one pass over the rows, no transpose of the dense output.
  A row outside the grid or with a batch outside `[0, batch_size)` is written to element 0 instead,
  and, as every broken rule of the frame, makes every written feature NaN.
"""

from __future__ import annotations

from math import prod

import numpy as np
import onnx_graphsurgeon as gs

from ...errors import SparseLowerError
from ...schemas import DenseBoundary
from ..context import FLOAT
from .emit import BOOL, Emit
from .grid import row_major_strides
from .sites import inside_extent


def rows_from_dense(e: Emit, dense: gs.Tensor, features: gs.Variable, coords: gs.Variable) -> None:
    """Write `features [N, C]` and `coords [N, 1+D]` (sorted) of the active sites of `dense [B, C, *S]`."""
    if not dense.shape:
        raise SparseLowerError(f"the rank of ToSparse's input '{dense.name}' is not declared", e.base,
                               "declare the input's shape (at least its rank: [B, C, *S]) in the model")
    rank = len(dense.shape)
    nonzero = e.cast(e("Not", e("Equal", dense, e.const(0, FLOAT), dtype=BOOL), dtype=BOOL), FLOAT)
    counts = e("ReduceSum", nonzero, e.const([1]), dtype=FLOAT, keepdims=0)  # float: TensorRT's NonZero takes no ints
    e.ctx.standard("Transpose", e.base, [e("NonZero", counts, shape=[rank - 1, None])], [coords], {"perm": [1, 0]})
    channels_last = e("Transpose", dense, dtype=FLOAT, perm=[0, *range(2, rank), 1])
    e.ctx.standard("GatherND", e.base, [channels_last, coords], [features])


def dense_from_rows(e: Emit, features: gs.Tensor, coords: gs.Tensor, boundary: DenseBoundary,
                    invalid: gs.Tensor | None, output: gs.Variable) -> None:
    """Write the rows into `output [batch_size, C, *spatial_shape]`, zeros elsewhere; every feature NaN
    where the frame broke a rule (`invalid`, or a row outside this grid)."""
    extents = boundary.spatial_shape
    ndim, volume = len(extents), prod(extents)
    channels = e("Shape", features, shape=[1], name="channels", start=1, end=2)
    plane = e("Mul", channels, e.const([volume]), shape=[1], name="plane")  # C·V: one batch
    weights = e("Concat", plane, e.const(row_major_strides(extents)), shape=[1 + ndim], axis=0)
    sites = e("ReduceSum", e("Mul", coords, weights, shape=[None, 1 + ndim]), e.const([1]), shape=[None], keepdims=0)
    inside = e.all_of_row(inside_extent(e, coords, [boundary.batch_size, *extents]), shape=[None])
    sites = e("Where", inside, sites, e.const(0), shape=[None], name="sites")
    invalid = e.either(invalid, e.any(e("Not", inside, dtype=BOOL, shape=[None])))
    count = e("Squeeze", channels, e.const([0]), shape=[])
    channel_starts = e("Mul", e("Range", e.const(0), count, e.const(1), shape=[None]), e.const(volume), shape=[None])
    index = e("Add", e("Unsqueeze", sites, e.const([1]), shape=[None, 1]),
              e("Unsqueeze", channel_starts, e.const([0]), shape=[1, None]), shape=[None, None], name="index")
    poison = e("Where", invalid, e.const([np.nan], FLOAT), e.const([0], FLOAT), dtype=FLOAT, shape=[1], name="poison")
    values = e("Add", features, poison, dtype=FLOAT, shape=[None, None])
    total = e("Mul", plane, e.const([boundary.batch_size]), shape=[1])
    zeros = e("ConstantOfShape", total, dtype=FLOAT, shape=[None], value=gs.Constant("zero", np.zeros(1, np.float32)))
    flat = e("ScatterElements", zeros, e.flat(index), e.flat(values, FLOAT), dtype=FLOAT, shape=[None], axis=0)
    shape = e("Concat", e.const([boundary.batch_size]), channels, e.const(extents), shape=[2 + ndim], axis=0)
    e.ctx.standard("Reshape", e.base, [flat, shape], [output])
