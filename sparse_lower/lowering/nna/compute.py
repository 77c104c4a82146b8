"""The nna compute form of a sparse conv (README: What a lowered model looks like; the patent's NNA method).

The accelerator runs standard ops only. The features enter as the image `[1, Cin, 1, N]` (or as rows
`[N, Cin]` with `layout="rows"`: layout.py); one 1×1 `Conv` per kernel tap (a `MatMul` on rows; with
`fuse_taps`, one product with K·Cout outputs split per tap) gives each input's partial output for that
tap, `P_k [1, Cout, 1, N]`; a combine method moves the partials to the output sites `[1, Cout, 1, M]`:

* `gather`: append a zero column to `P_k` and `Gather` the column each output reads through tap k
  (the zero column where it reads nothing), then `Add` over taps — no scatter, O(N) memory;
* `scatter`: `ScatterElements` with `reduction="add"` of `P_k` into the output columns, one scatter
  per tap so that no index repeats within one op (onnxruntime's scatter-add races on repeated
  indices); inputs that feed no output through tap k go to a dump column that is sliced off;
* `matmul`: `MatMul` of `P_k` with the transposed scatter matrix `S_kᵀ [N, M]` (on rows, `S_k · P_k`)
  and `Add` (patent method 1, O(K·M·N) memory, refused at run time above `ScatterMatrices`'
  `max_bytes`). Known limit:
  the product multiplies every partial by the zeros of `S_k` too, and 0·NaN = 0·Inf = NaN, so one
  non-finite feature makes every output of the layer NaN where a dense conv has NaN/Inf only in its
  receptive field. No op of the accelerator's table selects without multiplying, so this method cannot
  avoid it; `gather` and `scatter` propagate NaN/Inf exactly like the dense conv.

The index tables the combine reads are computed outside the accelerator, from the same neighbour
tables the gpu target uses, by the custom-op index builders and int64 standard ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ...schemas import ConvGeometry
from ..context import FLOAT, INT64, LoweringContext
from .layout import layout
from .padding import pad_to_capacity, padded_rows

COMBINES = ("gather", "scatter", "matmul")


@dataclass(frozen=True)
class Capacity:
    """The fixed row counts of one layer: its input rows' and its output rows' (None: no capacity). They
    differ when `max_active` gives one per level and the layer changes level (a SparseConv: the next)."""

    inputs: int | None
    outputs: int | None


class NnaCompute:
    reads_dense = False

    def __init__(self, combine: str, max_active: int | tuple[int, ...] | None, fuse_taps: bool,
                 layout_name: str = "image"):
        self.combine = combine
        self.capacities = (max_active,) if isinstance(max_active, int) else max_active
        self.fuse_taps = fuse_taps
        self.layout = layout(layout_name)

    def capacity(self, ctx: LoweringContext, coords: gs.Tensor) -> int | None:
        """The row capacity of a sparse tensor: the one of its level, or of the deepest level given."""
        if not self.capacities:
            return None
        return self.capacities[min(ctx.level(coords), len(self.capacities) - 1)]

    def emit(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, source: gs.Tensor, dense: bool,
             coords: gs.Tensor, nbr: gs.Tensor, out_coords: gs.Tensor, matrix: np.ndarray,
             bias: np.ndarray | None, out_features: gs.Variable) -> None:
        taps, cout = geometry.volume, matrix.shape[1]
        cin = matrix.shape[0] // taps
        cap = Capacity(self.capacity(ctx, coords), self.capacity(ctx, out_coords))
        if not ctx.after_a_sparse_layer(source):  # the user's feeds: check that they pair with the coords
            (source,) = ctx.table("PairRows", source.name, [source, coords], [("paired", FLOAT, source.shape)], {})
        rows = padded_rows(ctx, source, cap.inputs) if cap.inputs else source
        if cap.outputs:
            nbr = pad_to_capacity(ctx, nbr, cap.outputs, np.int64(-1), [cap.outputs, taps])
        if self._zero_row(cap):
            rows = self._with_zero_row(ctx, rows, cin, cap)
        x = self.layout.enter(ctx, rows, cin, self._columns(cap))
        partials = self._partials(ctx, base, x, matrix, taps, cin, cout, cap)
        combine = {"gather": self._gather, "scatter": self._scatter, "matmul": self._matmul}[self.combine]
        y = combine(ctx, base, coords, nbr, partials, cout, cap)
        if bias is not None:
            y = self._add_bias(ctx, base, y, bias, out_coords, cout, cap)
        if not cap.outputs:
            self.layout.leave(ctx, base, y, cout, None, out_features)
            return
        padded = self.layout.leave(ctx, base, y, cout, cap.outputs, ("out_padded", FLOAT, [cap.outputs, cout]))
        ctx.padded[out_features.name] = padded
        zero = ctx.shared_constant("zero_1", np.array([0], np.int64))
        ctx.standard("Slice", base, [padded, zero, self._row_count(ctx, out_coords), zero], [out_features])

    # -- the accelerator part ---------------------------------------------------------------------

    def _zero_row(self, cap: Capacity) -> bool:
        """Whether the input rows get a zero row appended: its partial output is the zero column that
        outputs without a neighbour gather, and it keeps the image from having zero width (a frame
        can be empty, and onnxruntime's Conv refuses a zero-width image). With a capacity, scatter and
        matmul need neither, and the image is exactly [1, Cin, 1, max_active]."""
        return self.combine == "gather" or not cap.inputs

    def _columns(self, cap: Capacity) -> int | None:
        """The static column count of the input images (None when it is known only at run time)."""
        return cap.inputs + self._zero_row(cap) if cap.inputs else None

    def _with_zero_row(self, ctx, rows, cin, cap: Capacity) -> gs.Tensor:
        """Rows [N, Cin] with a zero row appended, shared by every layer reading them."""
        pads = ctx.shared_constant("pads_one_row", np.array([0, 0, 1, 0], np.int64))
        (extended,) = ctx.table("Pad", f"{rows.name}/zero_row", [rows, pads],
                                [("with_zero_row", FLOAT, [self._columns(cap), cin])], {}, domain="")
        return extended

    def _partials(self, ctx, base, x, matrix, taps, cin, cout, cap: Capacity) -> list[gs.Tensor]:
        """P_k for every tap: x times each tap's [Cin, Cout] weight, or one product by all taps' weights
        side by side, split per tap (the channel axis is 1 in both layouts)."""
        per_tap = [matrix[k * cin:(k + 1) * cin] for k in range(taps)]
        spec = ("partial", FLOAT, self.layout.shape(cout, self._columns(cap)))
        if not self.fuse_taps:
            return [self.layout.multiply(ctx, f"{base}/tap{k}", x, w, spec) for k, w in enumerate(per_tap)]
        fused = self.layout.multiply(ctx, base, x, np.concatenate(per_tap, axis=1),
                                     ("partials", FLOAT, self.layout.shape(taps * cout, self._columns(cap))))
        split = ctx.shared_constant(f"split_{taps}x{cout}", np.full(taps, cout, np.int64))
        return ctx.standard("Split", base, [fused, split], [spec] * taps, {"axis": 1})

    def _gather(self, ctx, base, coords, nbr, partials, cout, cap: Capacity) -> gs.Tensor:
        indices = self._tap_rows(ctx, nbr, self._count(ctx, coords, "inputs", cap.inputs), len(partials), cap)
        total = None
        for k, (partial, index) in enumerate(zip(partials, indices)):
            (moved,) = ctx.standard("Gather", f"{base}/tap{k}", [partial, index],
                                    [("moved", FLOAT, self.layout.shape(cout, cap.outputs))], {"axis": self.layout.axis})
            total = self._sum(ctx, f"{base}/tap{k}", total, moved, cout, cap)
        return total

    def _sum(self, ctx, base, total, moved, cout, cap: Capacity) -> gs.Tensor:
        """The running sum over taps."""
        if total is None:
            return moved
        return ctx.standard("Add", base, [total, moved], [("sum", FLOAT, self.layout.shape(cout, cap.outputs))])[0]

    def _scatter(self, ctx, base, coords, nbr, partials, cout, cap: Capacity) -> gs.Tensor:
        outputs = self._count(ctx, nbr, "outputs", cap.outputs)
        indices = self._scatter_indices(ctx, self._like(ctx, coords, cap), nbr, outputs, len(partials), cout, cap)
        accumulator = self._zeros(ctx, outputs, cout, cap)
        scattered = self.layout.shape(cout, cap.outputs + 1 if cap.outputs else None)
        for k, (partial, index) in enumerate(zip(partials, indices)):
            (accumulator,) = ctx.standard("ScatterElements", f"{base}/tap{k}", [accumulator, index, partial],
                                          [("scattered", FLOAT, scattered)], {"axis": self.layout.axis, "reduction": "add"})
        zero = ctx.shared_constant("zero_1", np.array([0], np.int64))
        axis = ctx.shared_constant(f"axis_{self.layout.axis}", np.array([self.layout.axis], np.int64))
        (y,) = ctx.standard("Slice", base, [accumulator, zero, outputs, axis],
                            [("combined", FLOAT, self.layout.shape(cout, cap.outputs))])
        return y

    def _matmul(self, ctx, base, coords, nbr, partials, cout, cap: Capacity) -> gs.Tensor:
        columns = self._columns(cap)
        (matrices,) = ctx.table("ScatterMatrices", nbr.name, [nbr, self._like(ctx, coords, cap)],
                                [("S", FLOAT, [len(partials), cap.outputs, columns])], {})
        total = None
        for k, partial in enumerate(partials):
            (chosen,) = ctx.table("Gather", f"{nbr.name}/tap{k}", [matrices, ctx.shared_constant(f"index_{k}", np.array(k))],
                                  [("S_k", FLOAT, [cap.outputs, columns])], {"axis": 0}, domain="")
            moved = self.layout.moved_by_matrix(ctx, f"{base}/tap{k}", partial, chosen,
                                                ("moved", FLOAT, self.layout.shape(cout, cap.outputs)))
            total = self._sum(ctx, f"{base}/tap{k}", total, moved, cout, cap)
        return total

    def _add_bias(self, ctx, base, y, bias, out_coords, cout, cap: Capacity) -> gs.Tensor:
        """Bias on the real output columns only: with a capacity, padding columns stay zero."""
        value = ctx.constant(f"{base}/B", self.layout.channel_vector(bias.astype(np.float32)))
        if cap.outputs:
            (masked,) = ctx.standard("Mul", base, [value, self._valid_columns(ctx, out_coords, cap.outputs)],
                                     [("bias_columns", FLOAT, self.layout.shape(cout, cap.outputs))])
            value = masked
        (y,) = ctx.standard("Add", base, [y, value], [("biased", FLOAT, self.layout.shape(cout, cap.outputs))])
        return y

    # -- the index part (outside the accelerator) -------------------------------------------------

    def _count(self, ctx, tensor, role, capacity: int | None) -> gs.Tensor:
        """The row count of `tensor` as int64 [1]: its capacity, or its run-time length. For the inputs
        also the index of the appended zero row."""
        if capacity:
            return ctx.shared_constant(f"capacity_{capacity}", np.array([capacity], np.int64))
        (count,) = ctx.table("Shape", tensor.name, [tensor], [(f"{role}_count", INT64, [1])], {"start": 0, "end": 1},
                             domain="")
        return count

    def _like(self, ctx, coords, cap: Capacity) -> gs.Tensor:
        """An int64 tensor with one row per image column, for the index builders that read only its
        row count: taken from the coords (never from the features, so that the index part does not
        wait for the accelerator), or a zero-byte [columns, 0] constant under a capacity."""
        if cap.inputs:
            return ctx.shared_constant(f"rows_{self._columns(cap)}", np.zeros((self._columns(cap), 0), np.int64))
        pads = ctx.shared_constant("pads_one_row", np.array([0, 0, 1, 0], np.int64))
        (extended,) = ctx.table("Pad", f"{coords.name}/zero_row", [coords, pads], [("with_zero_row", INT64, [None, None])],
                                {}, domain="")
        return extended

    def _row_count(self, ctx, out_coords) -> gs.Tensor:
        (count,) = ctx.table("Shape", out_coords.name, [out_coords], [("count", INT64, [1])], {"start": 0, "end": 1},
                             domain="")
        return count

    def _tap_rows(self, ctx, nbr, rows_count, taps, cap: Capacity) -> list[gs.Tensor]:
        """Per tap, the input column each output reads ([M] int64), N (the zero column) for none."""
        zero = ctx.shared_constant("zero_scalar", np.array(0, np.int64))
        (missing,) = ctx.table("Less", nbr.name, [nbr, zero], [("missing", np.bool_, nbr.shape)], {}, domain="")
        (columns,) = ctx.table("Where", nbr.name, [missing, rows_count, nbr], [("columns", INT64, nbr.shape)], {},
                               domain="")
        return self._per_tap(ctx, columns, taps, 1, cap.outputs)

    def _scatter_indices(self, ctx, like, nbr, outputs, taps, cout, cap: Capacity) -> list[gs.Tensor]:
        """Per tap, the output column each input lands in, broadcast to the partial's shape as
        ScatterElements wants; M (the dump column) for inputs that feed nothing through that tap."""
        columns = self._columns(cap)
        (inverse,) = ctx.table("InverseMap", nbr.name, [nbr, like], [("inverse", INT64, [taps, columns])], {})
        zero = ctx.shared_constant("zero_scalar", np.array(0, np.int64))
        (missing,) = ctx.table("Less", inverse.name, [inverse, zero], [("missing", np.bool_, [taps, columns])], {},
                               domain="")
        (targets,) = ctx.table("Where", inverse.name, [missing, outputs, inverse], [("targets", INT64, [taps, columns])], {},
                               domain="")
        channels = self.layout.shape(cout, 1)
        expand = ctx.shared_constant("expand_" + "_".join(map(str, channels)), np.array(channels, np.int64))
        indices = []
        for k, row in enumerate(self._per_tap(ctx, targets, taps, 0, columns)):
            placed = self.layout.site_vector(ctx, row, INT64, columns)
            (broadcast,) = ctx.table("Expand", f"{placed.name}/{cout}", [placed, expand],
                                     [("broadcast", INT64, self.layout.shape(cout, columns))], {}, domain="")
            indices.append(broadcast)
        return indices

    def _per_tap(self, ctx, table, taps, axis, length) -> list[gs.Tensor]:
        """Slice k along `axis` of an int64 table ([length] each), one tensor per tap."""
        return [ctx.table("Gather", f"{table.name}/tap{k}", [table, ctx.shared_constant(f"index_{k}", np.array(k))],
                          [("tap", INT64, [length])], {"axis": axis}, domain="")[0] for k in range(taps)]

    def _zeros(self, ctx, outputs, cout, cap: Capacity) -> gs.Tensor:
        """The scatter accumulator with M + 1 sites (the last collects what feeds nothing)."""
        if cap.outputs:
            shape = self.layout.shape(cout, cap.outputs + 1)
            return ctx.shared_constant("zeros_" + "_".join(map(str, shape)), np.zeros(shape, np.float32))
        one = ctx.shared_constant("one_1", np.array([1], np.int64))
        (columns,) = ctx.table("Add", outputs.name, [outputs, one], [("plus_one", INT64, [1])], {}, domain="")
        shape = self.layout.shape(cout, None)
        parts = [columns if d is None else ctx.shared_constant(f"dim_{d}", np.array([d], np.int64)) for d in shape]
        (shape_tensor,) = ctx.table("Concat", f"{columns.name}/{self.layout.name}{cout}", parts,
                                    [("shape", INT64, [len(shape)])], {"axis": 0}, domain="")
        (zeros,) = ctx.table("ConstantOfShape", shape_tensor.name, [shape_tensor], [("zeros", FLOAT, shape)],
                             {"value": gs.Constant("zero", np.zeros(1, np.float32))}, domain="")
        return zeros

    def _valid_columns(self, ctx, out_coords, cap: int) -> gs.Tensor:
        """1 for the real output sites, 0 for the padding ones, broadcasting over channels."""
        count = self._row_count(ctx, out_coords)
        positions = ctx.shared_constant(f"range_{cap}", np.arange(cap, dtype=np.int64))
        (real,) = ctx.table("Less", f"{count.name}/valid", [positions, count], [("real", np.bool_, [cap])], {}, domain="")
        (mask,) = ctx.table("Cast", real.name, [real], [("mask", FLOAT, [cap])], {"to": 1}, domain="")
        return self.layout.site_vector(ctx, mask, FLOAT, cap)
