"""The portable compute form of a sparse conv: the indexed unfold in standard ops.

The features get a zero row put first (row 0, where the tables point for a missing neighbour; row r
is then r + 1, as the tables hold it); one
`Gather` by the neighbour table `[M, K]` gives `[M, K, Cin]`, a `Flatten` the unfolded `[M, K·Cin]`,
one `MatMul` by the `[K·Cin, Cout]` weights the output rows, and an `Add` the bias. The flag of the
tables (a frame that broke a rule of sparse tensors: tables.py) adds NaN to that bias, so every output
feature of a bad frame is NaN, in any runtime, at the cost of one `Where` on a scalar.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, LoweringContext
from ..table_reduce import rows_after_zero_row
from .emit import BOOL, Emit
from .tables import fix_rows


class PortableCompute:
    reads_dense = False

    def row_capacity(self, ctx: LoweringContext, coords: gs.Tensor) -> None:
        """The ops without weights take the dynamic form only (the static form is refused before lowering)."""
        return None

    def emit(self, ctx: LoweringContext, conv: ConvParts) -> None:
        e = Emit(ctx, conv.base)
        invalid = ctx.tables.invalid(conv.nbr)
        source = conv.source
        fixed_in, fixed_out = ctx.tables.fixed(ctx.level(conv.coords)), ctx.tables.fixed(ctx.level(conv.out_coords))
        if fixed_in:
            fix_rows(ctx, source, fixed_in.rows)
        if fixed_out and conv.out_features in ctx.graph.outputs:
            conv.out_features.shape = [fixed_out.rows, conv.cout]
        if not ctx.after_a_sparse_layer(source):  # the user's feeds: their rows must pair with the coords
            paired = e("Equal", e.rows(source), e.rows(conv.coords), dtype=BOOL, shape=[1], name="paired")
            unpaired = e("Not", paired, dtype=BOOL, shape=[1], name="unpaired")
            invalid = e.either(invalid, unpaired)
        rows = rows_after_zero_row(ctx, source, conv.cin)
        gathered = e("Gather", rows, conv.nbr, dtype=FLOAT, shape=[None, conv.taps, conv.cin], axis=0)
        unfolded = e("Flatten", gathered, dtype=FLOAT, shape=[None, conv.taps * conv.cin], name="unfolded", axis=1)
        bias = conv.bias if conv.bias is not None else np.zeros(conv.cout, np.float32)
        added = ctx.constant(f"{conv.base}/B", bias.astype(np.float32))
        weights = ctx.constant(f"{conv.base}/W", conv.matrix)
        if invalid is not None:
            added = e("Add", added, e.poison(invalid), dtype=FLOAT, shape=[conv.cout], name="bias")
        elif conv.bias is None:
            ctx.standard("MatMul", conv.base, [unfolded, weights], [conv.out_features])
            return
        product = e("MatMul", unfolded, weights, dtype=FLOAT, shape=[None, conv.cout])
        ctx.standard("Add", conv.base, [product, added], [conv.out_features])

