"""The nna and hybrid targets' tables in standard ONNX ops (`tables="standard"`): a board's plain
onnxruntime, or an accelerator runtime's CPU fallback, then runs the host part with no library.

The neighbour tables, ToSparse and ToDense are the portable target's (StandardOpTables, its dynamic
form: rows follow the frame, as the nna inputs do); this class adds the standard form of each custom op
the nna combines and row capacities use (docs/custom_ops.md, "Index tables of the nna target"):

* `CapacityPads`: the pads `capacity − N`, computed. A frame over the capacity cannot be refused in
  standard ops: the negative pad cuts its rows to the capacity, `within` makes table entries of the
  cut rows read as none (every gather stays in bounds), and the frame is flagged (`flag_overflow`), so
  its outputs are NaN as a broken frame's are on the portable target.
* `InverseMap`: one `ScatterElements` of each output's number into the input column it reads per tap
  (a dump column for none, sliced off).
* `ScatterMatrices`: `Equal` of each tap's column of the table with the input numbers. Its size is
  refused when lowered, so a capacity is required: the library refuses a frame's matrices over 1 GiB
  at run time, which standard ops cannot.
* `PairLists`: per tap, a `Compress` of the table's column by "has a pair", and each output's rank
  among the pairs by a `CumSum`; a tap over its `max_pairs` entry is cut and flags the frame.

The combines' tables here read the neighbour table in the custom ops' convention (int64, row r as r, −1
for none: sites.zero_based converts the portable one) and write theirs in it, as the library's do; only
`within` reads a table as the portable target holds it (1 + r, 0 for none), before that conversion.
"""

from __future__ import annotations

import numpy as np

from ...errors import SparseLowerError
from ..context import FLOAT, INT64
from ..portable.emit import BOOL, Emit
from ..portable.tables import StandardOpTables
from .pair_lists import PairTables
from .sites import per_tap, row_count


class StandardNnaTables(StandardOpTables):
    """StandardOpTables in its dynamic form, and the nna combines' tables (the module docstring)."""

    def capacity_pads(self, ctx, tensor, capacity, rank):
        """[0, …, 0, capacity − N, 0, …]: negative where N > capacity, which cuts the rows to the capacity."""
        short = ctx.shared_node("Sub", f"{tensor.name}/capacity", [ctx.shared_constant(f"capacity_{capacity}",
                                np.array([capacity], np.int64)), row_count(ctx, tensor)], [("short", INT64, [1])], {},
                                domain="")[0]
        zeros = [ctx.shared_constant(f"zeros_{n}", np.zeros(n, np.int64)) for n in (rank, rank - 1)]
        (pads,) = ctx.shared_node("Concat", short.name, [zeros[0], short, zeros[1]], [("pads", INT64, [2 * rank])],
                                  {"axis": 0}, domain="")
        return pads

    def within(self, ctx, table, capacity):
        """Entries of rows at or past the capacity (one-based: above it) read as none (0)."""
        if not capacity:
            return table
        dtype = np.dtype(table.dtype).type
        bound = ctx.shared_constant(f"bound_{np.dtype(dtype).name}_{capacity}", np.array(capacity, dtype))
        (cut,) = ctx.shared_node("Greater", table.name, [table, bound], [("cut", BOOL, table.shape)], {}, domain="")
        none = ctx.shared_constant(f"none_{np.dtype(dtype).name}", np.array(self.first_row - 1, dtype))
        (kept,) = ctx.shared_node("Where", table.name, [cut, none, table], [("within", dtype, table.shape)], {}, domain="")
        return kept

    def inverse_map(self, ctx, nbr, like, columns):
        """ScatterElements of m into column nbr[m, k] of row k (column N where there is none, sliced off)."""
        e = Emit(ctx, f"{nbr.name}/inverse")
        taps, inputs = nbr.shape[1], row_count(ctx, like, columns)
        missing = e("Less", nbr, e.const(0), dtype=BOOL, shape=nbr.shape)
        targets = e("Transpose", e("Where", missing, inputs, nbr, shape=nbr.shape), shape=[taps, nbr.shape[0]],
                    perm=[1, 0])
        numbers = e("Range", e.const(0), e("Squeeze", row_count(ctx, nbr, nbr.shape[0]), e.const([0]), shape=[]),
                    e.const(1), shape=[nbr.shape[0]], name="outputs")
        numbers = e("Expand", numbers, e("Shape", targets, shape=[2]), shape=targets.shape, name="outputs")
        wide = e("Concat", e.const([taps]), e("Add", inputs, e.const([1]), shape=[1]), shape=[2], axis=0)
        empty = e("Expand", e.const([[-1]]), wide, shape=[taps, None], name="none")
        inverse = e("ScatterElements", empty, targets, numbers, shape=[taps, None], axis=1)
        return e("Slice", inverse, e.const([0]), inputs, e.const([1]), shape=[taps, columns], name="inverse")

    def scatter_matrices(self, ctx, base, nbr, like, outputs, columns):
        """S[k, m, n] = (nbr[m, k] == n): an Equal of the transposed table with 0 … N − 1."""
        if columns is None:
            raise SparseLowerError("the matmul combine's scatter matrices grow as K·M·N with the frame: the library's "
                                   "ScatterMatrices refuses them over 1 GiB at run time, which standard ops cannot",
                                   base, "give max_active (their size is then checked when lowered), or use "
                                         "combine='gather' or 'scatter'")
        e = Emit(ctx, f"{nbr.name}/scatter_matrices")
        taps = nbr.shape[1]
        reads = e("Unsqueeze", e("Transpose", nbr, shape=[taps, outputs], perm=[1, 0]), e.const([2]),
                  shape=[taps, outputs, 1], name="reads")
        hits = e("Equal", reads, e.const(np.arange(columns)), dtype=BOOL, shape=[taps, outputs, columns], name="hits")
        return e.cast(hits, FLOAT, shape=[taps, outputs, columns])

    def pair_lists(self, ctx, nbr, inputs, capacities, option):
        """Per tap k: the rows of outputs with a pair (`Compress`), then the zero row N (to `capacities[k] + 1`
        entries where given); each output's position is its rank among them (`CumSum`), P_k where none."""
        e = Emit(ctx, f"{nbr.name}/pairs")
        taps, outputs = nbr.shape[1], nbr.shape[0]
        has = e("GreaterOrEqual", nbr, e.const(0), dtype=BOOL, shape=nbr.shape, name="has")
        ones = e.cast(has, INT64, shape=nbr.shape)
        ranks = e("CumSum", ones, e.const(0), shape=nbr.shape, name="ranks", exclusive=1)
        counts = e("ReduceSum", ones, e.const([0]), shape=[taps], name="counts", keepdims=0)
        positions = e("Where", has, ranks, counts, shape=nbr.shape, name="positions")
        invalid = None
        if capacities:
            limits = e.const(list(capacities))
            positions = e("Min", positions, limits, shape=nbr.shape, name="positions")
            invalid = e.any(e("Greater", counts, limits, dtype=BOOL, shape=[taps], name="over"))
        zero_row = row_count(ctx, inputs)
        sources = []
        for k, column in enumerate(per_tap(ctx, nbr, taps, 1, outputs)):
            paired = e("Compress", column, e("GreaterOrEqual", column, e.const(0), dtype=BOOL, shape=[outputs]),
                       shape=[None], name=f"tap{k}_paired", axis=0)
            if not capacities:
                sources.append(e("Concat", paired, zero_row, shape=[None], name=f"tap{k}_sources", axis=0))
                continue
            size = capacities[k] + 1
            filled = e("Concat", paired, e("Expand", zero_row, e.const([size]), shape=[size]), shape=[None], axis=0)
            sources.append(e("Slice", filled, e.const([0]), e.const([size]), shape=[size], name=f"tap{k}_sources"))
        return PairTables(sources, per_tap(ctx, positions, taps, 1, outputs), invalid)
