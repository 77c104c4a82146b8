"""The `scatter` combine: `ScatterElements` with `reduction="add"` of each tap's partial output `P_k`
into the output columns, one scatter per tap so that no index repeats within one op (onnxruntime's
scatter-add races on repeated indices); inputs that feed no output through tap k go to a dump column
that is sliced off."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, INT64, LoweringContext
from .combine import Combine
from .products import TapProducts
from .sites import Sizes, column_rows, per_tap, row_count


class ScatterCombine(Combine):
    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, x: gs.Tensor, sizes: Sizes,
                 products: TapProducts) -> gs.Tensor:
        partials = products.every_tap(ctx, conv, x, sizes.columns)
        layout, cout = self.layout, conv.cout
        outputs = row_count(ctx, nbr, sizes.outputs)
        indices = self._indices(ctx, column_rows(ctx, conv.coords, sizes), nbr, outputs, conv.taps, cout, sizes)
        accumulator = self._zeros(ctx, outputs, cout, sizes)
        scattered = layout.shape(cout, sizes.outputs + 1 if sizes.outputs else None)
        for k, (partial, index) in enumerate(zip(partials, indices)):
            (accumulator,) = ctx.standard("ScatterElements", f"{conv.base}/tap{k}", [accumulator, index, partial],
                                          [("scattered", FLOAT, scattered)], {"axis": layout.axis, "reduction": "add"})
        zero = ctx.shared_constant("zero_1", np.array([0], np.int64))
        axis = ctx.shared_constant(f"axis_{layout.axis}", np.array([layout.axis], np.int64))
        (y,) = ctx.standard("Slice", conv.base, [accumulator, zero, outputs, axis],
                            [("combined", FLOAT, layout.shape(cout, sizes.outputs))])
        return y

    def _indices(self, ctx, like, nbr, outputs, taps, cout, sizes: Sizes) -> list[gs.Tensor]:
        """Per tap, the output column each input lands in, broadcast to the partial's shape as
        ScatterElements wants; M (the dump column) for inputs that feed nothing through that tap."""
        columns = sizes.columns
        inverse = ctx.tables.inverse_map(ctx, nbr, like, columns)
        zero = ctx.shared_constant("zero_scalar", np.array(0, np.int64))
        (missing,) = ctx.shared_node("Less", inverse.name, [inverse, zero], [("missing", np.bool_, [taps, columns])], {},
                                     domain="")
        (targets,) = ctx.shared_node("Where", inverse.name, [missing, outputs, inverse], [("targets", INT64, [taps, columns])],
                                     {}, domain="")
        channels = self.layout.shape(cout, 1)
        expand = ctx.shared_constant("expand_" + "_".join(map(str, channels)), np.array(channels, np.int64))
        indices = []
        for row in per_tap(ctx, targets, taps, 0, columns):
            placed = self.layout.site_vector(ctx, row, INT64, columns)
            (broadcast,) = ctx.shared_node("Expand", f"{placed.name}/{cout}", [placed, expand],
                                           [("broadcast", INT64, self.layout.shape(cout, columns))], {}, domain="")
            indices.append(broadcast)
        return indices

    def _zeros(self, ctx, outputs, cout, sizes: Sizes) -> gs.Tensor:
        """The scatter accumulator with M + 1 sites (the last collects what feeds nothing)."""
        if sizes.outputs:
            shape = self.layout.shape(cout, sizes.outputs + 1)
            return ctx.shared_constant("zeros_" + "_".join(map(str, shape)), np.zeros(shape, np.float32))
        one = ctx.shared_constant("one_1", np.array([1], np.int64))
        (columns,) = ctx.shared_node("Add", outputs.name, [outputs, one], [("plus_one", INT64, [1])], {}, domain="")
        shape = self.layout.shape(cout, None)
        parts = [columns if d is None else ctx.shared_constant(f"dim_{d}", np.array([d], np.int64)) for d in shape]
        (shape_tensor,) = ctx.shared_node("Concat", f"{columns.name}/{self.layout.name}{cout}", parts,
                                          [("shape", INT64, [len(shape)])], {"axis": 0}, domain="")
        (zeros,) = ctx.shared_node("ConstantOfShape", shape_tensor.name, [shape_tensor], [("zeros", FLOAT, shape)],
                                   {"value": gs.Constant("zero", np.zeros(1, np.float32))}, domain="")
        return zeros
