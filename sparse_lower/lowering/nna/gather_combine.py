"""The `gather` combine (the default): append a zero column to each tap's partial output `P_k`, and
`Gather` the column each output site reads through tap k (the zero column where it reads nothing), then
`Add` over taps. No scatter, O(N) memory, and NaN/Inf propagate exactly as in the dense conv."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, LoweringContext
from .combine import Combine
from .products import TapProducts
from .sites import Sizes, row_count, sum_over_taps, tap_columns


class GatherCombine(Combine):
    needs_zero_row = True  # the column of outputs that read nothing through a tap

    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, x: gs.Tensor, sizes: Sizes,
                 products: TapProducts) -> gs.Tensor:
        partials = products.every_tap(ctx, conv, x, sizes.columns)
        shape = self.layout.shape(conv.cout, sizes.outputs)
        indices = tap_columns(ctx, nbr, row_count(ctx, conv.coords, sizes.inputs), conv.taps, sizes.outputs)
        moved = [ctx.standard("Gather", f"{conv.base}/tap{k}", [partial, index], [("moved", FLOAT, shape)],
                              {"axis": self.layout.axis})[0] for k, (partial, index) in enumerate(zip(partials, indices))]
        return sum_over_taps(ctx, conv.base, moved, shape)
