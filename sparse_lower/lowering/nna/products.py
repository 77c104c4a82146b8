"""The products of the nna form: the rows (image columns) a tap reads times that tap's `[Cin, Cout]`
weight, by one 1×1 `Conv` per tap (a `MatMul` on rows). The combine methods ask for them: gather,
scatter and matmul multiply every input row by every tap (`every_tap`, where `fuse_taps` makes it one
product with K·Cout outputs, split per tap); pairs multiplies each tap's own gathered rows (`one_tap`);
unfold multiplies every tap's gathered rows side by side at once (`all_taps`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, LoweringContext


@dataclass(frozen=True)
class TapProducts:
    layout: object  # layout.py: ImageLayout or RowsLayout
    fuse_taps: bool

    def one_tap(self, ctx: LoweringContext, conv: ConvParts, k: int, x: gs.Tensor, columns: int | None) -> gs.Tensor:
        """P_k = x times tap k's weight, `layout.shape(Cout, columns)`."""
        spec = ("partial", FLOAT, self.layout.shape(conv.cout, columns))
        return self.layout.multiply(ctx, f"{conv.base}/tap{k}", x, self._weight(conv, k), spec)

    def every_tap(self, ctx: LoweringContext, conv: ConvParts, x: gs.Tensor, columns: int | None) -> list[gs.Tensor]:
        """P_k for every tap, from the same x: one product per tap, or one by all taps' weights side by
        side, split per tap (the channel axis is 1 in both layouts)."""
        taps, cout = conv.taps, conv.cout
        if not self.fuse_taps:
            return [self.one_tap(ctx, conv, k, x, columns) for k in range(taps)]
        weights = np.concatenate([self._weight(conv, k) for k in range(taps)], axis=1)
        fused = self.layout.multiply(ctx, conv.base, x, weights, ("partials", FLOAT, self.layout.shape(taps * cout, columns)))
        split = ctx.shared_constant(f"split_{taps}x{cout}", np.full(taps, cout, np.int64))
        spec = ("partial", FLOAT, self.layout.shape(cout, columns))
        return ctx.standard("Split", conv.base, [fused, split], [spec] * taps, {"axis": 1})

    def all_taps(self, ctx: LoweringContext, conv: ConvParts, unfolded: gs.Tensor, columns: int | None) -> gs.Tensor:
        """The output itself from every tap's rows side by side (`layout.shape(K·Cin, columns)`, tap-major
        as the layer's matrix stacks them): one product by the `[K·Cin, Cout]` weight."""
        spec = ("summed", FLOAT, self.layout.shape(conv.cout, columns))
        return self.layout.multiply(ctx, conv.base, unfolded, conv.matrix, spec)

    @staticmethod
    def _weight(conv: ConvParts, k: int) -> np.ndarray:
        return conv.matrix[k * conv.cin:(k + 1) * conv.cin]
