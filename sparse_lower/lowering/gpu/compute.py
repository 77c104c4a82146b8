"""The compute part every sparse conv lowers to, once its index table exists.

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
from .context import FLOAT, INT64, GpuContext


def conv_input(ctx: GpuContext, features: gs.Tensor, coords: gs.Tensor) -> tuple[gs.Tensor, bool]:
    """What the unfold reads, and whether it is dense: the dense tensor itself when the features come
    from a lowered ToSparse on the same coords (the dense-format method), else the feature rows."""
    dense = ctx.dense_sources.get(features.name)
    if dense is not None and dense.coords is coords:
        return dense.dense, True
    return features, False


def emit_conv(ctx: GpuContext, base: str, geometry: ConvGeometry, source: gs.Tensor, dense: bool,
              coords: gs.Tensor, nbr: gs.Tensor, out_coords: gs.Tensor, matrix: np.ndarray,
              bias: np.ndarray | None, out_features: gs.Variable) -> None:
    """Emit unfold → MatMul (→ fold) (+ bias) writing `out_features`."""
    cin_k, cout = matrix.shape
    unfold_attrs = {"spatial_shape": list(geometry.spatial_shape)} if dense else {}
    unfold_extra = [] if dense else [coords]
    rows_out = out_features if bias is None else ("rows", FLOAT, [None, cout])
    if ctx.strategy == "rulebook":
        in_rows, out_rows = ctx.table("Rulebook", base, [nbr], [("in_rows", INT64, [None, None]),
                                                             ("out_rows", INT64, [None, None])], {})
        (in_rows3,) = ctx.table("Unsqueeze", base, [in_rows, ctx.shared_constant("axes_2", np.array([2], np.int64))],
                                [("in_rows3", INT64, [None, None, 1])], {}, domain="")
        (gathered,) = ctx.add("IndexedUnfold", base, [source, in_rows3, *unfold_extra],
                              [("gathered", FLOAT, [geometry.volume, None, cin_k // geometry.volume])], unfold_attrs)
        weights = ctx.constant(f"{base}/W", matrix.reshape(geometry.volume, -1, cout))
        (pairs,) = ctx.add("MatMul", base, [gathered, weights], [("pairs", FLOAT, [geometry.volume, None, cout])], domain="")
        (rows,) = ctx.add("IndexedFold", base, [pairs, out_rows, out_coords], [rows_out], {"mode": "rows"})
    else:
        (cols,) = ctx.add("IndexedUnfold", base, [source, nbr, *unfold_extra],
                          [("cols", FLOAT, [None, cin_k])], unfold_attrs)
        weights = ctx.constant(f"{base}/W", matrix)
        (rows,) = ctx.add("MatMul", base, [cols, weights], [rows_out], domain="")
    if bias is not None:
        ctx.add("Add", base, [rows, ctx.constant(f"{base}/B", bias.astype(np.float32))], [out_features], domain="")
