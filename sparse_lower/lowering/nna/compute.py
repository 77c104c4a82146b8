"""The nna compute form of a sparse conv (docs/lowered_forms.md; the patent's NNA method).

The accelerator runs standard ops only. The features enter as the image `[1, Cin, 1, N]` (or as rows
`[N, Cin]` with `layout="rows"`: layout.py); one 1×1 `Conv` per kernel tap (a `MatMul` on rows; with
`fuse_taps`, one product with K·Cout outputs split per tap: products.py) gives each input's partial
output for that tap, `P_k [1, Cout, 1, N]`; a combine method moves the partials to the output sites
`[1, Cout, 1, M]`: `gather` (gather_combine.py), `scatter` (scatter_combine.py) or `matmul`
(matmul_combine.py). The `pairs` combine (pair_combine.py) multiplies each tap's paired rows only;
`unfold` (unfold_combine.py) gathers every tap's input rows side by side and multiplies them once.

The index tables the combine reads are computed outside the accelerator, from the same neighbour
tables the gpu target uses, by the custom-op index builders and int64 standard ops (sites.py), or with
`tables="standard"` by standard ops only (standard_tables.py), which flag a frame they cannot refuse:
its outputs are NaN. With a capacity (`max_active`) every tensor has fixed rows (padding.py).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from collections.abc import Mapping, Sequence

from ...errors import SparseLowerError
from ..compute import ConvParts
from ..context import FLOAT, LoweringContext, level_capacity
from ..portable.emit import Emit
from .gather_combine import GatherCombine
from .layout import layout
from .matmul_combine import MatmulCombine
from .padding import pad_to_capacity, padded_rows
from .pair_combine import PairCombine
from .products import TapProducts
from .scatter_combine import ScatterCombine
from .unfold_combine import UnfoldCombine
from .sites import Sizes, row_count, valid_rows, zero_based

_COMBINES = {"gather": GatherCombine, "scatter": ScatterCombine, "matmul": MatmulCombine, "pairs": PairCombine,
             "unfold": UnfoldCombine}
COMBINES = tuple(_COMBINES)


class NnaCompute:
    reads_dense = False

    def __init__(self, combine: str, max_active: int | tuple[int, ...] | None, fuse_taps: bool,
                 layout_name: str = "image", max_pairs: Mapping[str, Sequence[int]] | None = None,
                 max_members: int | None = None):
        """`fuse_taps` with the pairs or unfold combine is refused by `lower` (one product cannot serve taps
        that multiply different rows, and unfold has one product already); here those combines just ask
        for the products they multiply."""
        self.max_active = max_active
        self.max_members = max_members
        self.layout = layout(layout_name)
        self.products = TapProducts(self.layout, fuse_taps)
        self.combine = PairCombine(self.layout, max_pairs) if combine == "pairs" else _COMBINES[combine](self.layout)

    def capacity(self, ctx: LoweringContext, coords: gs.Tensor) -> int | None:
        """The row capacity of a sparse tensor: the one of its level, or of the deepest level given."""
        return level_capacity(self.max_active, ctx.level(coords))

    row_capacity = capacity

    def members(self, node: gs.Node) -> int:
        """`max_members`, which a Coalesce under a capacity needs (its table's fixed width)."""
        if self.max_members is None:
            raise SparseLowerError(
                f"with a row capacity (max_active), the nna target needs the most rows one site of a {node.op} may "
                f"hold", node.name, "give max_members (--max-members): `sparse-lower inspect MODEL --frames ...` or "
                "sparse_lower.capacity.most_members measures it on your frames")
        return self.max_members

    def emit(self, ctx: LoweringContext, conv: ConvParts) -> None:
        inputs, outputs = self.capacity(ctx, conv.coords), self.capacity(ctx, conv.out_coords)
        zero_row = self._zero_row(inputs)
        sizes = Sizes(inputs, outputs, inputs + zero_row if inputs else None)
        source, invalid = ctx.tables.paired_rows(ctx, conv.base, conv.source, conv.coords, conv.nbr)
        invalid = ctx.tables.flag_overflow(ctx, invalid, (conv.coords, inputs), (conv.out_coords, outputs))
        rows = padded_rows(ctx, source, inputs) if inputs else source
        nbr = zero_based(ctx, ctx.tables.within(ctx, conv.nbr, inputs))
        if outputs:
            nbr = pad_to_capacity(ctx, nbr, outputs, np.int64(-1), [outputs, conv.taps])
        if zero_row:
            rows = self._with_zero_row(ctx, rows, conv.cin, sizes)
        x = self.layout.enter(ctx, rows, conv.cin, sizes.columns)
        y = self.combine(ctx, conv, nbr, x, sizes, self.products)
        if conv.bias is not None or invalid is not None:
            y = self._add_bias(ctx, conv, y, sizes, invalid)
        if not outputs:
            self.layout.leave(ctx, conv.base, y, conv.cout, None, conv.out_features)
            return
        padded = self.layout.leave(ctx, conv.base, y, conv.cout, outputs, ("out_padded", FLOAT, [outputs, conv.cout]))
        ctx.padded[conv.out_features.name] = padded
        zero = ctx.shared_constant("zero_1", np.array([0], np.int64))
        ctx.standard("Slice", conv.base, [padded, zero, row_count(ctx, conv.out_coords), zero], [conv.out_features])

    def _zero_row(self, capacity: int | None) -> bool:
        """Whether the input rows get a zero row appended: its partial output is the zero column that
        outputs without a neighbour gather, and it keeps the image from having zero width (a frame
        can be empty, and onnxruntime's Conv refuses a zero-width image). With a capacity, scatter and
        matmul need neither, and the image is exactly [1, Cin, 1, max_active]."""
        return self.combine.needs_zero_row or not capacity

    def _with_zero_row(self, ctx, rows, cin, sizes: Sizes) -> gs.Tensor:
        """Rows [N, Cin] with a zero row appended, shared by every layer reading them."""
        pads = ctx.shared_constant("pads_one_row", np.array([0, 0, 1, 0], np.int64))
        (extended,) = ctx.shared_node("Pad", f"{rows.name}/zero_row", [rows, pads],
                                      [("with_zero_row", FLOAT, [sizes.columns, cin])], {}, domain="")
        return extended

    def _add_bias(self, ctx, conv: ConvParts, y, sizes: Sizes, invalid: gs.Tensor | None) -> gs.Tensor:
        """Bias on the real output columns only: with a capacity, padding columns stay zero. Where the
        tables flag a frame (`invalid`), NaN on every column: no output of it looks plausible."""
        shape = self.layout.shape(conv.cout, sizes.outputs)
        bias = conv.bias if conv.bias is not None else np.zeros(conv.cout)
        value = ctx.constant(f"{conv.base}/B", self.layout.channel_vector(bias.astype(np.float32)))
        if sizes.outputs and conv.bias is not None:
            mask = self.layout.site_vector(ctx, valid_rows(ctx, conv.out_coords, sizes.outputs), FLOAT, sizes.outputs)
            (value,) = ctx.standard("Mul", conv.base, [value, mask], [("bias_columns", FLOAT, shape)])
        if invalid is not None:
            (value,) = ctx.standard("Add", conv.base, [value, Emit(ctx, conv.base).poison(invalid)],
                                    [("flagged_bias", FLOAT, value.shape)])
        (y,) = ctx.standard("Add", conv.base, [y, value], [("biased", FLOAT, shape)])
        return y
