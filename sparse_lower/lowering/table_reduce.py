"""The compute of the source ops without weights (SparseMaxPool, Coalesce): per output row, the sum or
the per-channel maximum of the input rows its table lists.

One form serves every target, in standard ops on the feature rows: the rows get a zero row put first,
the table `[M, R]` is read one-based (0: no row; the custom ops' tables hold −1 there and get 1 added,
the standard-op ones are one-based already), one `Gather` gives `[M, R, C]` and one `ReduceSum` or
`ReduceMax` over axis 1 the output rows. For the maximum, an empty slot takes the row's largest entry
instead (an input it does list, since every output of these ops has one), so that it never contributes
the zero row's zeros; an output with no input at all (a padding row of the static form) reads the zero
row everywhere and is 0. Why no custom op: the work is a gather and a reduction, which every runtime and
accelerator compiler has; on the nna target the tables are padded to the static shapes and the rows to
their capacity (padding.py); with standard-op tables (portable, or nna with `tables="standard"`) a broken
frame's flag makes the output NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from .context import FLOAT, INT64, LoweringContext
from .nna.padding import pad_to_capacity, padded_rows
from .nna.sites import row_count
from .portable.emit import Emit


@dataclass(frozen=True)
class TableReduce:
    """One reduction, ready to emit: `rows [N, C]`; `table [M, R]` (R: `width`, None where
    the data decides it); the output sites `out_coords`; `capacities` (input, output) of the static form."""

    base: str
    reduction: str  # "sum" or "max"
    rows: gs.Tensor
    channels: int | None
    table: gs.Tensor
    width: int | None
    out_coords: gs.Tensor
    out_features: gs.Variable
    capacities: tuple[int | None, int | None] = (None, None)


def rows_after_zero_row(ctx: LoweringContext, rows: gs.Tensor, channels: int | None) -> gs.Tensor:
    """`rows [N, C]` after a zero row (row r is then r + 1, as one-based tables hold it), shared by every
    layer reading them."""
    zero = ctx.shared_constant(f"zero_row_{channels}", np.zeros((1, channels or 1), np.float32))
    if channels is None:  # a zero row as wide as the rows, whatever their width
        (width,) = ctx.shared_node("Shape", rows.name, [rows], [("width", INT64, [1])], {"start": 1, "end": 2}, domain="")
        one = ctx.shared_constant("one_1", np.array([1], np.int64))
        (shape,) = ctx.shared_node("Concat", rows.name, [one, width], [("zero_row_shape", INT64, [2])], {"axis": 0},
                                   domain="")
        (zero,) = ctx.shared_node("Expand", rows.name, [zero, shape], [("zero_row", FLOAT, [1, None])], {}, domain="")
    (extended,) = ctx.shared_node("Concat", f"{rows.name}/zero_row", [zero, rows],
                                  [("with_zero_row", FLOAT, [None, channels])], {"axis": 0}, domain="")
    return extended


def _reduce(ctx: LoweringContext, op: str, base: str, x: gs.Tensor, output, keepdims: int) -> gs.Variable:
    """`op` (ReduceSum / ReduceMax) over axis 1 into `output` (a Variable or a spec): its axes an input from
    opset 18 on (ReduceSum: 13), an attribute before."""
    axes = ctx.shared_constant("axes_1", np.array([1], np.int64))
    as_input = op == "ReduceSum" or (ctx.graph.opset or 0) >= 18
    inputs, attrs = ([x, axes], {"keepdims": keepdims}) if as_input else ([x], {"axes": [1], "keepdims": keepdims})
    (out,) = ctx.standard(op, base, inputs, [output], attrs)
    return out


def emit_table_reduce(ctx: LoweringContext, part: TableReduce, first_row: int, invalid: gs.Tensor | None) -> None:
    """Write `part.out_features`. `first_row`: what the table holds for input row 0 (0 for the custom ops'
    tables, 1 for the standard-op ones); `invalid`: the standard-op tables' flag of a broken frame (or of
    one over a capacity, whose rows `within` and the pads cut)."""
    base, (capacity_in, capacity_out) = part.base, part.capacities
    rows, table = part.rows, part.table
    if table.dtype != INT64:  # the standard-op tables' lookups are int32
        (table,) = ctx.standard("Cast", base, [table], [("table64", INT64, [None, part.width])], {"to": 7})
    if capacity_in:
        rows = padded_rows(ctx, rows, capacity_in)
        table = ctx.tables.within(ctx, table, capacity_in)
    if capacity_out:
        table = pad_to_capacity(ctx, table, capacity_out, np.int64(first_row - 1), [capacity_out, part.width])
    m = capacity_out
    if first_row == 0:
        (table,) = ctx.standard("Add", base, [table, ctx.shared_constant("one_scalar", np.array(1, np.int64))],
                                [("one_based", INT64, [m, part.width])])
    if part.reduction == "max":
        largest = _reduce(ctx, "ReduceMax", base, table, ("largest", INT64, [m, 1]), keepdims=1)
        empty = ctx.standard("Equal", base, [table, ctx.shared_constant("zero_scalar", np.array(0, np.int64))],
                             [("empty", np.bool_, [m, part.width])])[0]
        (table,) = ctx.standard("Where", base, [empty, largest, table], [("filled", INT64, [m, part.width])])
    source = rows_after_zero_row(ctx, rows, part.channels)
    (gathered,) = ctx.standard("Gather", base, [source, table], [("gathered", FLOAT, [m, part.width, part.channels])],
                               {"axis": 0})
    op = "ReduceSum" if part.reduction == "sum" else "ReduceMax"
    direct = invalid is None and not capacity_out
    out = _reduce(ctx, op, base, gathered, part.out_features if direct else ("reduced", FLOAT, [m, part.channels]),
                  keepdims=0)
    if direct:
        return
    if invalid is not None:
        flagged = part.out_features if not capacity_out else ("flagged", FLOAT, [m, part.channels])
        (out,) = ctx.standard("Add", base, [out, Emit(ctx, base).poison(invalid)], [flagged])
    if capacity_out:
        ctx.padded[part.out_features.name] = out
        zero = ctx.shared_constant("zero_1", np.array([0], np.int64))
        ctx.standard("Slice", base, [out, zero, row_count(ctx, part.out_coords), zero], [part.out_features])
