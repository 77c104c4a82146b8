"""The gpu compute form of a sparse conv, once its index table exists.

Two strategies, same numbers:

* `unfold` (output-stationary, the patent's GPU method): `IndexedUnfold` gathers, for every output
  row, the K input rows its taps read into one `[M, K·Cin]` row (zeros for missing neighbours), and
  one `MatMul` with the `[K·Cin, Cout]` weight matrix produces the output rows in output order, so no
  fold is needed between sparse layers.
* `rulebook` (weight-stationary): `Rulebook` lists, per tap, the (input, output) pairs that exist;
  `IndexedUnfold` gathers `[K, P, Cin]`, a batched `MatMul` with `[K, Cin, Cout]` gives each pair's
  contribution and `IndexedFold` accumulates them into the output rows in a fixed order.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...schemas import ConvGeometry
from ..context import FLOAT, INT64, LoweringContext


class GpuCompute:
    reads_dense = True

    def __init__(self, strategy: str):
        self.strategy = strategy

    def emit(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, source: gs.Tensor, dense: bool,
             coords: gs.Tensor, nbr: gs.Tensor, out_coords: gs.Tensor, matrix: np.ndarray,
             bias: np.ndarray | None, out_features: gs.Variable) -> None:
        """Emit unfold → MatMul (→ fold) (+ bias) writing `out_features`."""
        cin_k, cout = matrix.shape
        taps = geometry.volume
        unfold_attrs = {"spatial_shape": list(geometry.spatial_shape)} if dense else {}
        unfold_extra = [] if dense else [coords]
        rows_out = out_features if bias is None else ("rows", FLOAT, [None, cout])
        if self.strategy == "rulebook":
            in_rows, out_rows = ctx.table("Rulebook", base, [nbr], [("in_rows", INT64, [None, None]),
                                                                 ("out_rows", INT64, [None, None])], {})
            axes = ctx.shared_constant("axes_2", np.array([2], np.int64))
            (in_rows3,) = ctx.table("Unsqueeze", base, [in_rows, axes], [("in_rows3", INT64, [None, None, 1])], {},
                                    domain="")
            (gathered,) = ctx.add("IndexedUnfold", base, [source, in_rows3, *unfold_extra],
                                  [("gathered", FLOAT, [taps, None, cin_k // taps])], unfold_attrs)
            weights = ctx.constant(f"{base}/W", matrix.reshape(taps, -1, cout))
            (pairs,) = ctx.standard("MatMul", base, [gathered, weights], [("pairs", FLOAT, [taps, None, cout])])
            (rows,) = ctx.add("IndexedFold", base, [pairs, out_rows, out_coords], [rows_out], {"mode": "rows"})
        else:
            (cols,) = ctx.add("IndexedUnfold", base, [source, nbr, *unfold_extra],
                              [("cols", FLOAT, [None, cin_k])], unfold_attrs)
            (rows,) = ctx.standard("MatMul", base, [cols, ctx.constant(f"{base}/W", matrix)], [rows_out])
        if bias is not None:
            ctx.standard("Add", base, [rows, ctx.constant(f"{base}/B", bias.astype(np.float32))], [out_features])
