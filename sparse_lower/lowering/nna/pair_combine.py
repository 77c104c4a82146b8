"""The `pairs` combine: multiply only the rows that have a partner. Per tap k, `Gather` the input rows
paired through k (`P_k` of them, listed by pair_lists.py, then the zero row), multiply them by `W_k`,
and `Gather` for each output its pair's product row (the zero row's product where it has none), then
`Add` over taps. Each tap's rows are gathered, multiplied and dropped in turn: no tensor holds every
tap's rows at once.

Why: the other combines multiply every input row by every tap, K·N·Cin·Cout multiply-adds, where a
sparse conv needs only Σ_k P_k·Cin·Cout; on LiDAR frames most taps pair a fraction of the rows (the
CenterPoint frame: 2.1× fewer products, docs/performance/pair_list.md). Gather only, like `gather`:
no scatter for accelerators that lack one, O(N) memory, NaN/Inf propagate as in the dense conv.

Under a capacity (`max_active`) each tap holds `max_pairs[layer][k]` pairs, measured on frames by
`capacity.pair_rows` (`sparse-lower inspect --frames`); a layer `max_pairs` leaves out holds as many
as can exist, min(input rows, output rows), which never overflows and multiplies as much as `gather`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, LoweringContext
from ..portable.emit import Emit
from .combine import Combine
from .products import TapProducts
from .sites import Sizes, sum_over_taps


class PairCombine(Combine):
    needs_zero_row = True  # every tap's list ends with it: its product is what outputs without a pair read

    def __init__(self, layout, max_pairs: Mapping[str, Sequence[int]] | None = None):
        super().__init__(layout)
        self.max_pairs = dict(max_pairs or {})

    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, x: gs.Tensor, sizes: Sizes,
                 products: TapProducts) -> gs.Tensor:
        capacities = self.capacities(conv, sizes)
        inputs = conv.coords if capacities is None else ctx.shared_constant(
            f"rows_{sizes.inputs}", np.zeros((sizes.inputs, 0), np.int64))  # its row count is the zero row's index
        tables = ctx.tables.pair_lists(ctx, nbr, inputs, capacities, f"max_pairs['{conv.base}']")
        shape = self.layout.shape(conv.cout, sizes.outputs)
        moved = []
        for k, (source, position) in enumerate(zip(tables.sources, tables.positions)):
            columns = capacities[k] + 1 if capacities else None
            (rows,) = ctx.standard("Gather", f"{conv.base}/tap{k}", [x, source],
                                   [("paired", FLOAT, self.layout.shape(conv.cin, columns))], {"axis": self.layout.axis})
            product = products.one_tap(ctx, conv, k, rows, columns)
            moved.append(ctx.standard("Gather", f"{conv.base}/tap{k}", [product, position], [("moved", FLOAT, shape)],
                                      {"axis": self.layout.axis})[0])
        total = sum_over_taps(ctx, conv.base, moved, shape)
        if tables.invalid is None:
            return total
        # standard-op lists cut a tap over its capacity, and flag the frame: NaN outputs, as for a broken one
        poison = Emit(ctx, conv.base).poison(tables.invalid)
        return ctx.standard("Add", conv.base, [total, poison], [("flagged", FLOAT, shape)])[0]

    def capacities(self, conv: ConvParts, sizes: Sizes) -> tuple[int, ...] | None:
        """The pairs each tap holds under a capacity (None without one). A tap pairs each input and each
        output at most once, so min(inputs, outputs) always suffices; a larger max_pairs entry is cut to it."""
        if not sizes.inputs:
            return None
        most = min(sizes.inputs, sizes.outputs)
        given = self.max_pairs.get(conv.base, [most] * conv.taps)
        return tuple(min(int(n), most) for n in given)
