"""The `matmul` combine (patent method 1): `MatMul` of each tap's partial output `P_k` with the
transposed scatter matrix `S_kᵀ [N, M]` (on rows, `S_k · P_k`), and `Add` over taps. O(K·M·N) memory,
refused at run time above `ScatterMatrices`' `max_bytes`; under a capacity the size is known, and a
layer whose matrices could never be built is refused when it is lowered.

Known limit: the product multiplies every partial by the zeros of `S_k` too, and 0·NaN = 0·Inf = NaN,
so one non-finite feature makes every output of the layer NaN where a dense conv has NaN/Inf only in
its receptive field. No op of the accelerator's table selects without multiplying, so this method
cannot avoid it; `gather` and `scatter` propagate NaN/Inf exactly like the dense conv."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...errors import SparseLowerError
from ..compute import ConvParts
from ..context import FLOAT, LoweringContext
from .combine import Combine
from .products import TapProducts
from .sites import Sizes, column_rows, sum_over_taps


MAX_MATRIX_BYTES = 1 << 30  # ScatterMatrices' default max_bytes (custom_ops/index/scatter_matrices.cc)


class MatmulCombine(Combine):
    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, x: gs.Tensor, sizes: Sizes,
                 products: TapProducts) -> gs.Tensor:
        size = conv.taps * (sizes.outputs or 0) * (sizes.columns or 0) * 4  # 0: known only at run time
        if size > MAX_MATRIX_BYTES:
            raise SparseLowerError(f"the matmul combine's scatter matrices [K, M, N] = [{conv.taps}, {sizes.outputs}, "
                                   f"{sizes.columns}] would take {size / 2**30:,.1f} GiB, more than the "
                                   f"{MAX_MATRIX_BYTES / 2**30:.0f} GiB ScatterMatrices builds", conv.base,
                                   "use combine='gather' or 'scatter' (tables linear in the sites), or a max_active "
                                   "small enough")
        partials = products.every_tap(ctx, conv, x, sizes.columns)
        shape = self.layout.shape(conv.cout, sizes.outputs)
        matrices = ctx.tables.scatter_matrices(ctx, conv.base, nbr, column_rows(ctx, conv.coords, sizes),
                                               sizes.outputs, sizes.columns)
        moved = []
        for k, partial in enumerate(partials):
            (chosen,) = ctx.shared_node("Gather", f"{nbr.name}/tap{k}", [matrices, ctx.shared_constant(f"index_{k}", np.array(k))],
                                        [("S_k", FLOAT, [sizes.outputs, sizes.columns])], {"axis": 0}, domain="")
            moved.append(self.layout.moved_by_matrix(ctx, f"{conv.base}/tap{k}", partial, chosen, ("moved", FLOAT, shape)))
        return sum_over_taps(ctx, conv.base, moved, shape)
