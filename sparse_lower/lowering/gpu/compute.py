"""The gpu compute form of a sparse conv, once its index table exists.

Three strategies, same numbers:

* `unfold` (output-stationary, the patent's GPU method): `IndexedUnfold` gathers, for every output
  row, the K input rows its taps read into one `[M, K·Cin]` row (zeros for missing neighbours), and
  one `MatMul` with the `[K·Cin, Cout]` weight matrix produces the output rows in output order, so no
  fold is needed between sparse layers.
* `rulebook` (weight-stationary): `Rulebook` lists, per tap, the (input, output) pairs that exist, in
  RULEBOOK_GROUPS groups of taps with similar pair counts. Per group, `IndexedUnfold` gathers
  `[Kg, Pg, Cin]`, a batched `MatMul` with the group's `[Kg, Cin, Cout]` weights gives each pair's
  contribution and `IndexedFold` accumulates them into the output rows in a fixed order, each group's
  fold starting from the previous one's result. A submanifold conv's centre tap reads every row itself,
  so it is a plain `MatMul` (`Gemm` with the bias) of the input rows, outside the rulebook, and the
  first fold starts from it; otherwise the first fold starts from the bias. A 1×1 submanifold conv,
  all centre, takes the unfold: its neighbour table is then what checks the coords.
* `fused`: one `IndexedConv` reads the neighbour table, the input rows and the `[K, Cin, Cout]` weights
  and writes the output rows: the rulebook's gather, products and fold in one op, block of output rows
  by block, with no `[pairs, C]` matrix in memory and no padding of tap groups. A conv reading the
  dense input of a `ToSparse` keeps the rulebook, whose `IndexedUnfold` gathers from the dense tensor.

Why the rulebook's groups: real LiDAR neighbourhoods fill 10–90 % of a tap's rows, very unevenly
across taps. One batch padded to the fullest tap (or the unfold's K full taps) multiplies 1.6–3.6× the
existing pairs on the nuScenes frames; four groups sized at run time from the actual counts multiply
1.03–1.04× (`sparse-lower bench`: the rulebook is then 1.3–7× faster than the unfold on every real
layer, and more groups only add nodes). Why `fused` is the default (`auto`): like the rulebook it
multiplies only the pairs that exist, and it moves no `[pairs, C]` matrix through memory between a
gather, a MatMul and a fold (over the rulebook: the CenterPoint backbone from 601 to 416 ms on 2
threads).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, INT64, LoweringContext
from ..nna.sites import zero_based

RULEBOOK_GROUPS = 4


class GpuCompute:
    reads_dense = True

    def __init__(self, strategy: str):
        self.strategy = strategy

    def row_capacity(self, ctx: LoweringContext, coords: gs.Tensor) -> None:
        """Rows are as many as the frame has: no capacity."""
        return None

    def emit(self, ctx: LoweringContext, conv: ConvParts) -> None:
        """Emit the strategy's nodes computing `conv.out_features` (bias included). The custom ops read the
        neighbour table as the library's builders write it, so a hybrid model's standard-op table
        (`tables="standard"`) is converted first."""
        conv = replace(conv, nbr=zero_based(ctx, conv.nbr))
        if self.strategy == "fused" and not conv.dense:
            _fused(ctx, conv)
            return
        gather = _Gather(ctx, conv.base, conv.source, [] if conv.dense else [conv.coords],
                         {"spatial_shape": list(conv.geometry.spatial_shape)} if conv.dense else {})
        if self.strategy in ("rulebook", "fused"):
            _rulebook(ctx, conv, gather)
        else:
            _unfold(ctx, conv, gather)


class _Gather:
    """IndexedUnfold from the conv's source: rows (checked against their coords) or the dense input."""

    def __init__(self, ctx: LoweringContext, base: str, source: gs.Tensor, extra: list, attrs: dict):
        self.ctx, self.base, self.source, self.extra, self.attrs = ctx, base, source, extra, attrs

    def __call__(self, idx: gs.Tensor, output: tuple) -> gs.Variable:
        (gathered,) = self.ctx.add("IndexedUnfold", self.base, [self.source, idx, *self.extra], [output], self.attrs)
        return gathered


def _unfold(ctx: LoweringContext, conv: ConvParts, gather: _Gather) -> None:
    base, bias = conv.base, conv.bias
    cols = gather(conv.nbr, ("cols", FLOAT, [None, conv.matrix.shape[0]]))
    rows_out = conv.out_features if bias is None else ("rows", FLOAT, [None, conv.cout])
    (rows,) = ctx.standard("MatMul", base, [cols, ctx.constant(f"{base}/W", conv.matrix)], [rows_out])
    if bias is not None:
        ctx.standard("Add", base, [rows, ctx.constant(f"{base}/B", bias.astype(np.float32))], [conv.out_features])


def _fused(ctx: LoweringContext, conv: ConvParts) -> None:
    base = conv.base
    weights = ctx.constant(f"{base}/W", conv.matrix.reshape(conv.taps, conv.cin, conv.cout))
    bias_input = gs.Variable.empty() if conv.bias is None else ctx.constant(f"{base}/B", conv.bias.astype(np.float32))
    ctx.add("IndexedConv", base, [conv.source, conv.nbr, weights, bias_input, conv.coords], [conv.out_features])


def _rulebook(ctx: LoweringContext, conv: ConvParts, gather: _Gather) -> None:
    base, bias, taps, cin, cout = conv.base, conv.bias, conv.taps, conv.cin, conv.cout
    submanifold_rows = conv.geometry.op_type == "SubmanifoldConv" and not conv.dense
    skip = [(taps - 1) // 2] if submanifold_rows else []  # the centre tap of output row m reads row m
    groups = min(RULEBOOK_GROUPS, taps - len(skip))
    if groups == 0:  # a 1×1 submanifold conv: its table only checks the coords, which the unfold keeps
        _unfold(ctx, conv, gather)
        return
    weights = conv.matrix.reshape(taps, cin, cout)
    # What the first fold starts from: the centre tap's rows, the bias, or zeros.
    start = None if bias is None else ctx.constant(f"{base}/B", bias.astype(np.float32))
    if skip:
        product = [gather.source, ctx.constant(f"{base}/W_centre", weights[skip[0]])]
        (start,) = ctx.standard("MatMul" if start is None else "Gemm", base, product + ([] if start is None else [start]),
                                [("centre", FLOAT, [None, cout])])
    specs = [spec for g in range(groups) for spec in (
        (f"in_rows{g}", INT64, [None, None]), (f"out_rows{g}", INT64, [None, None]), (f"taps{g}", INT64, [None]))]
    tables = ctx.shared_node("Rulebook", base, [conv.nbr], specs, {"groups": groups, **({"skip_taps": skip} if skip else {})})
    all_weights = ctx.constant(f"{base}/W", weights)
    axes = ctx.shared_constant("axes_2", np.array([2], np.int64))
    for g in range(groups):
        in_rows, out_rows, tap_ids = tables[3 * g: 3 * g + 3]
        (in_rows3,) = ctx.shared_node("Unsqueeze", base, [in_rows, axes], [(f"in_rows{g}_3", INT64, [None, None, 1])], {},
                                      domain="")
        (group_weights,) = ctx.standard("Gather", base, [all_weights, tap_ids], [(f"W{g}", FLOAT, [None, cin, cout])],
                                        {"axis": 0})
        gathered = gather(in_rows3, (f"gathered{g}", FLOAT, [None, None, cin]))
        (pairs,) = ctx.standard("MatMul", base, [gathered, group_weights], [(f"pairs{g}", FLOAT, [None, None, cout])])
        last = g == groups - 1
        (start,) = ctx.add("IndexedFold", base, [pairs, out_rows, conv.out_coords] + ([] if start is None else [start]),
                           [conv.out_features if last else (f"rows{g}", FLOAT, [None, cout])], {"mode": "rows"})
