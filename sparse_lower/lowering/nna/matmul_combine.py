"""The `matmul` combine (patent method 1): `MatMul` of each tap's partial output `P_k` with the
transposed scatter matrix `S_kᵀ [N, M]` (on rows, `S_k · P_k`), and `Add` over taps. O(K·M·N) memory,
refused at run time above `ScatterMatrices`' `max_bytes`.

Known limit: the product multiplies every partial by the zeros of `S_k` too, and 0·NaN = 0·Inf = NaN,
so one non-finite feature makes every output of the layer NaN where a dense conv has NaN/Inf only in
its receptive field. No op of the accelerator's table selects without multiplying, so this method
cannot avoid it; `gather` and `scatter` propagate NaN/Inf exactly like the dense conv."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, LoweringContext
from .combine import Combine
from .sites import Sizes, column_rows, sum_over_taps


class MatmulCombine(Combine):
    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, partials: list[gs.Tensor],
                 sizes: Sizes) -> gs.Tensor:
        shape = self.layout.shape(conv.cout, sizes.outputs)
        (matrices,) = ctx.shared_node("ScatterMatrices", nbr.name, [nbr, column_rows(ctx, conv.coords, sizes)],
                                      [("S", FLOAT, [conv.taps, sizes.outputs, sizes.columns])], {})
        moved = []
        for k, partial in enumerate(partials):
            (chosen,) = ctx.shared_node("Gather", f"{nbr.name}/tap{k}", [matrices, ctx.shared_constant(f"index_{k}", np.array(k))],
                                        [("S_k", FLOAT, [sizes.outputs, sizes.columns])], {"axis": 0}, domain="")
            moved.append(self.layout.moved_by_matrix(ctx, f"{conv.base}/tap{k}", partial, chosen, ("moved", FLOAT, shape)))
        return sum_over_taps(ctx, conv.base, moved, shape)
