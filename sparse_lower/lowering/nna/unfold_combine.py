"""The `unfold` combine: gather each output's input rows first, one `Gather` per tap (the zero row
where it reads nothing), set them side by side (`Concat` on channels: `[M, K·Cin]`, as the gpu
target's IndexedUnfold lays them out), and multiply once by the layer's `[K·Cin, Cout]` weight.

Why: every other combine adds up K partial products per output in separate tensors. An accelerator
that quantizes every tensor (QNN's HTP, rknn) rounds each partial and each running sum to its 8 bits;
here the K·Cin products of an output accumulate inside one MatMul (int32 on an int8 accelerator) and
are rounded once, as in a quantized dense conv. The multiply-adds are K·M·Cin·Cout: `gather`'s
K·N·Cin·Cout with output rows for input rows. Gathers only: no scatter, NaN/Inf propagate as in the
dense conv; `fuse_taps` does not apply (there is one product already) and is refused.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import FLOAT, LoweringContext
from .combine import Combine
from .products import TapProducts
from .sites import Sizes, row_count, tap_columns


class UnfoldCombine(Combine):
    needs_zero_row = True  # what outputs without a neighbour through a tap read

    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, x: gs.Tensor, sizes: Sizes,
                 products: TapProducts) -> gs.Tensor:
        indices = tap_columns(ctx, nbr, row_count(ctx, conv.coords, sizes.inputs), conv.taps, sizes.outputs)
        rows = [ctx.standard("Gather", f"{conv.base}/tap{k}", [x, index],
                             [("neighbours", FLOAT, self.layout.shape(conv.cin, sizes.outputs))],
                             {"axis": self.layout.axis})[0] for k, index in enumerate(indices)]
        (unfolded,) = ctx.standard("Concat", conv.base, rows,
                                   [("unfolded", FLOAT, self.layout.shape(conv.taps * conv.cin, sizes.outputs))],
                                   {"axis": 1})
        if sizes.outputs or self.layout.name == "rows":
            return products.all_taps(ctx, conv, unfolded, sizes.outputs)
        return self._never_zero_width(ctx, conv, unfolded, products)

    def _never_zero_width(self, ctx: LoweringContext, conv: ConvParts, unfolded: gs.Tensor,
                          products: TapProducts) -> gs.Tensor:
        """The product of an image whose width is the frame's output count, one zero column wider for
        the 1×1 Conv (onnxruntime's refuses a zero-width image: a frame without outputs), then cut back."""
        pads = ctx.shared_constant("pads_last_column", np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int64))
        (wider,) = ctx.standard("Pad", conv.base, [unfolded, pads],
                                [("unfolded_wider", FLOAT, self.layout.shape(conv.taps * conv.cin, None))])
        product = products.all_taps(ctx, conv, wider, None)
        zero, last = ctx.shared_constant("zero_1", np.array([0], np.int64)), ctx.shared_constant("three_1", np.array([3]))
        (y,) = ctx.standard("Slice", conv.base, [product, zero, row_count(ctx, conv.out_coords), last],
                            [("summed", FLOAT, self.layout.shape(conv.cout, None))])
        return y
