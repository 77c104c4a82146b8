"""ToSparse and ToDense in standard ops.

* ToSparse: a site is active where any channel is non-zero (NaN too: `Not(Equal(x, 0))`); `NonZero`
  of the per-site count lists the active sites in ascending order, which is the sorted order of the
  coords (in the static form, grid.sorted_cells into the capacity), and `GatherND` reads their
  features from the channels-last tensor.
* ToDense: `ScatterElements` of every feature into a flat zero tensor `[batch_size·C·V]` at
  `b·C·V + c·V + site`, then a `Reshape`: one pass over the rows, no transpose of the dense output.
  A row outside the grid or with a batch outside `[0, batch_size)` is written past the end, to a
  plane that is cut off, and, as every broken rule of the frame, makes every written feature NaN;
  so is a padding row of the static form, which breaks no rule.
"""

from __future__ import annotations

from math import prod

import numpy as np
import onnx_graphsurgeon as gs

from ...errors import SparseLowerError
from ..nna.padding import ROWWISE as _ROWWISE
from ...schemas import DenseBoundary
from ..context import FLOAT
from .emit import BOOL, Emit
from .grid import sorted_cells
from .sites import decoded_sites
from .taps import inside_extent, row_major_strides


def rows_from_dense(e: Emit, dense: gs.Tensor, features: gs.Variable, coords: gs.Variable,
                    capacity: int | None = None) -> gs.Tensor | None:
    """Write `features [N, C]` and `coords [N, 1+D]` (sorted) of the active sites of `dense [B, C, *S]`.
    With a `capacity` (the static form), N is the capacity, padding rows after the sites (coords −1,
    features 0); returns the flag of more active sites than that."""
    if not dense.shape:
        raise SparseLowerError(f"the rank of ToSparse's input '{dense.name}' is not declared", e.base,
                               "declare the input's shape (at least its rank: [B, C, *S]) in the model")
    rank = len(dense.shape)
    nonzero = e.cast(e("Not", e("Equal", dense, e.const(0, FLOAT), dtype=BOOL), dtype=BOOL), FLOAT)
    counts = e("ReduceSum", nonzero, e.const([1]), dtype=FLOAT, keepdims=0)  # float: TensorRT's NonZero takes no ints
    channels_last = e("Transpose", dense, dtype=FLOAT, perm=[0, *range(2, rank), 1])
    if capacity is None:
        e.ctx.standard("Transpose", e.base, [e("NonZero", counts, shape=[rank - 1, None])], [coords], {"perm": [1, 0]})
        e.ctx.standard("GatherND", e.base, [channels_last, coords], [features])
        return None
    extents = [d if isinstance(d, int) else None for d in dense.shape[2:]]
    if None in extents or not isinstance(dense.shape[0], int):
        raise SparseLowerError(f"ToSparse's input '{dense.name}' has shape {dense.shape}", e.base,
                               "declare its batch and spatial extents: the static form (max_active) sizes by them")
    sites = [dense.shape[0], *extents]
    flat_counts = e.flat(counts, FLOAT)
    end = e.const([prod(sites)])
    keys = e("Range", e.const(0), e.const(prod(sites)), e.const(1), shape=[None], name="sites")
    keys = e("Where", e("Greater", flat_counts, e.const(0, FLOAT), dtype=BOOL, shape=[None]), keys, end, shape=[None])
    found, overflow = sorted_cells(e, keys, end, capacity)
    padded = decoded_sites(e, found, end, extents, True)
    e.ctx.standard("Identity", e.base, [padded], [coords])
    real = e("Unsqueeze", e("Less", found, end, dtype=BOOL, shape=[None]), e.const([1]), dtype=BOOL, shape=[None, 1])
    rows = e("GatherND", channels_last, e("Max", padded, e.const(0), shape=[None, rank - 1]), dtype=FLOAT)
    e.ctx.standard("Where", e.base, [real, rows, e.const(0, FLOAT)], [features])
    return overflow


def _channels(features: gs.Tensor, depth: int = 8) -> int | None:
    """The channels of feature rows where the graph says them: declared, or declared on the input of the
    element-wise ops (Relu, a residual Add, …) that made them."""
    if features.shape and len(features.shape) == 2 and isinstance(features.shape[1], int):
        return features.shape[1]
    if depth == 0 or len(features.inputs) != 1 or features.inputs[0].op not in _ROWWISE:
        return None
    return next((c for c in (_channels(t, depth - 1) for t in features.inputs[0].inputs) if c is not None), None)


def dense_from_rows(e: Emit, features: gs.Tensor, coords: gs.Tensor, boundary: DenseBoundary,
                    invalid: gs.Tensor | None, output: gs.Variable, padded: bool = False) -> None:
    """Write the rows into `output [batch_size, C, *spatial_shape]`, zeros elsewhere; every feature NaN
    where the frame broke a rule (`invalid`, or a row outside this grid). `padded`: the static form,
    whose padding rows (batch −1) are written nowhere."""
    extents = boundary.spatial_shape
    ndim, volume, batches = len(extents), prod(extents), boundary.batch_size
    strides = row_major_strides(extents)
    known = _channels(features)
    if known is not None:  # every size a constant, as TVM's importer wants them (and shape inference)
        plane, shape = e.const([known * volume]), e.const([batches, known, *extents])
        weights, starts = e.const([known * volume, *strides]), e.const(np.arange(known) * volume)
        total, size = e.const([known * volume * batches]), e.const([known * volume * (batches + 1)])
    else:
        channels = e("Shape", features, shape=[1], name="channels", start=1, end=2)
        plane = e("Mul", channels, e.const([volume]), shape=[1], name="plane")  # C·V: one batch
        shape = e("Concat", e.const([batches]), channels, e.const(extents), shape=[2 + ndim], axis=0)
        weights = e("Concat", plane, e.const(strides), shape=[1 + ndim], axis=0)
        count = e("Squeeze", channels, e.const([0]), shape=[])
        starts = e("Mul", e("Range", e.const(0), count, e.const(1), shape=[None]), e.const(volume), shape=[None])
        total = e("Mul", plane, e.const([batches]), shape=[1])
        size = e("Add", total, plane, shape=[1])  # a plane more, for the rows that go nowhere
    sites = e("ReduceSum", e("Mul", coords, weights, shape=[None, 1 + ndim]), e.const([1]), shape=[None], keepdims=0)
    inside = e.all_of_row(inside_extent(e, coords, [batches, *extents]), shape=[None])
    broken = e("Not", inside, dtype=BOOL, shape=[None])
    if padded:
        padding = e("Equal", e.column(coords, 0), e.const(-1), dtype=BOOL, shape=[None], name="padding")
        broken = e("And", broken, e("Not", padding, dtype=BOOL, shape=[None]), dtype=BOOL, shape=[None])
    sites = e("Where", inside, sites, total, shape=[None], name="sites")  # past the end: a plane cut off below
    invalid = e.either(invalid, e.any(broken))
    index = e("Add", e("Unsqueeze", sites, e.const([1]), shape=[None, 1]),
              e("Unsqueeze", starts, e.const([0]), shape=[1, None]), shape=[None, None], name="index")
    values = e("Add", features, e.poison(invalid), dtype=FLOAT, shape=[None, None])
    written = e("ScatterElements", e.zeros(size, FLOAT), e.flat(index), e.flat(values, FLOAT), dtype=FLOAT, shape=[None], axis=0)
    flat = e("Slice", written, e.const([0]), total, e.const([0]), dtype=FLOAT, shape=[None])
    e.ctx.standard("Reshape", e.base, [flat, shape], [output])
