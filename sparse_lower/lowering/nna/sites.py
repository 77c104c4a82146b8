"""What the nna form knows of a layer's rows, computed outside the accelerator: their fixed counts
(`Sizes`), their count as a tensor, the neighbour table as the combines read it, per-tap slices of an
index table, and the mask of real output columns. Shared by the combine methods and the compute form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..context import FLOAT, INT64, LoweringContext


@dataclass(frozen=True)
class Sizes:
    """The fixed row counts of one layer (None: known only at run time). `inputs` and `outputs` are
    the capacities of its input and output rows: they differ when `max_active` gives one per level and
    the layer changes level (a SparseConv: the next). `columns` is the input image's column count: the
    capacity, plus the zero row the combine may append."""

    inputs: int | None
    outputs: int | None
    columns: int | None


def row_count(ctx: LoweringContext, tensor: gs.Tensor, capacity: int | None = None) -> gs.Tensor:
    """The row count of `tensor` as int64 [1]: its capacity when it has one, else its run-time length
    (one Shape node per tensor, however many layers ask)."""
    if capacity:
        return ctx.shared_constant(f"capacity_{capacity}", np.array([capacity], np.int64))
    (count,) = ctx.shared_node("Shape", tensor.name, [tensor], [("count", INT64, [1])], {"start": 0, "end": 1}, domain="")
    return count


def zero_based(ctx: LoweringContext, table: gs.Tensor) -> gs.Tensor:
    """`table` as the custom ops hold it: int64, input row r as r, −1 for none. The nna combines and the
    gpu path's custom ops read it so; standard-op tables hold 1 + r and 0 in int32 (IndexTables.first_row),
    and are converted once per table, however many layers read it."""
    first = ctx.tables.first_row
    if first == 0 and table.dtype == INT64:
        return table
    if table.dtype != INT64:
        (table,) = ctx.shared_node("Cast", table.name, [table], [("int64", INT64, table.shape)], {"to": 7}, domain="")
    if first:
        (table,) = ctx.shared_node("Sub", table.name, [table, ctx.shared_constant(f"first_row_{first}", np.array(first))],
                                   [("zero_based", INT64, table.shape)], {}, domain="")
    return table


def column_rows(ctx: LoweringContext, coords: gs.Tensor, sizes: Sizes) -> gs.Tensor:
    """An int64 tensor with one row per image column, for the index builders that read only its row
    count: taken from the coords (never from the features, so that the index part does not wait for
    the accelerator), or a zero-byte [columns, 0] constant under a capacity."""
    if sizes.inputs:
        return ctx.shared_constant(f"rows_{sizes.columns}", np.zeros((sizes.columns, 0), np.int64))
    pads = ctx.shared_constant("pads_one_row", np.array([0, 0, 1, 0], np.int64))
    (extended,) = ctx.shared_node("Pad", f"{coords.name}/zero_row", [coords, pads], [("with_zero_row", INT64, [None, None])],
                                  {}, domain="")
    return extended


def per_tap(ctx: LoweringContext, table: gs.Tensor, taps: int, axis: int, length: int | None) -> list[gs.Tensor]:
    """Slice k along `axis` of an int64 table ([length] each), one tensor per tap."""
    return [ctx.shared_node("Gather", f"{table.name}/tap{k}", [table, ctx.shared_constant(f"index_{k}", np.array(k))],
                            [("tap", INT64, [length])], {"axis": axis}, domain="")[0] for k in range(taps)]


def tap_columns(ctx: LoweringContext, nbr: gs.Tensor, zero_column: gs.Tensor, taps: int,
                outputs: int | None) -> list[gs.Tensor]:
    """Per tap, the input column each output reads ([M] int64), `zero_column` (the index of the zero
    column appended to what is gathered) where it reads nothing."""
    zero = ctx.shared_constant("zero_scalar", np.array(0, np.int64))
    (missing,) = ctx.shared_node("Less", nbr.name, [nbr, zero], [("missing", np.bool_, nbr.shape)], {}, domain="")
    (columns,) = ctx.shared_node("Where", nbr.name, [missing, zero_column, nbr], [("columns", INT64, nbr.shape)], {},
                                 domain="")
    return per_tap(ctx, columns, taps, 1, outputs)


def sum_over_taps(ctx: LoweringContext, base: str, moved: list[gs.Tensor], shape: list) -> gs.Tensor:
    """The partial outputs of every tap, moved to the output sites, added up one tap at a time."""
    total = moved[0]
    for k, tensor in enumerate(moved[1:], start=1):
        (total,) = ctx.standard("Add", f"{base}/tap{k}", [total, tensor], [("sum", FLOAT, shape)])
    return total


def valid_rows(ctx: LoweringContext, out_coords: gs.Tensor, capacity: int) -> gs.Tensor:
    """[capacity] float: 1 for the real output sites, 0 for the padding ones."""
    positions = ctx.shared_constant(f"range_{capacity}", np.arange(capacity, dtype=np.int64))
    count = row_count(ctx, out_coords)
    (real,) = ctx.shared_node("Less", f"{count.name}/valid", [positions, count], [("real", np.bool_, [capacity])], {},
                              domain="")
    (mask,) = ctx.shared_node("Cast", real.name, [real], [("mask", FLOAT, [capacity])], {"to": 1}, domain="")
    return mask
