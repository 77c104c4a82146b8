"""ToSparse(X) → the active sites of X, sorted, and the features at them (the target's index tables
say how: lowering/index_tables.py)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx_graphsurgeon as gs

from ..context import FLOAT, INT64, LoweringContext
from ..graph import declare, detach
from .checks import declared_shape
from .rule import Refusal, Rule


class ToSparseRule(Rule):
    op_type = "ToSparse"
    arity = (1, 1, 2)
    required = ("X",)

    def refusals(self, node: gs.Node) -> Iterator[Refusal]:
        shape = declared_shape(node.inputs[0])
        if shape is not None and not 3 <= len(shape) <= 5:
            yield Refusal(f"ToSparse input of rank {len(shape)}", "feed a dense [B, C, *S] tensor with 1 to 3 spatial "
                                                                  "dimensions")

    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        dense = ctx.float32(node.inputs[0])
        features, coords = node.outputs
        base = node.name or ctx.fresh("ToSparse")
        detach(node)
        declare(coords, INT64, [None, len(dense.shape) - 1 if dense.shape else None])
        declare(features, FLOAT, [None, dense.shape[1] if dense.shape else None])
        ctx.tables.to_sparse(ctx, base, dense, features, coords)
