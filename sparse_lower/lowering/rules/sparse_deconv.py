"""SparseDeconv → TransposedMap, or TargetMap when `target_coords` is given (the outputs are then
exactly the targets, in their order); the weights in the transposed layout."""

from __future__ import annotations

from ..graph import optional_input
from .conv_rule import ConvRule
from ..weights import deconv_matrix


class SparseDeconvRule(ConvRule):
    op_type = "SparseDeconv"
    arity = (3, 5, 2)  # the fifth input: target_coords
    transposed = True

    def index_table(self, ctx, node, base, geometry, coords, source):
        targets = optional_input(node, 4)
        if targets is None:
            return ctx.tables.transposed_map(ctx, base, geometry, coords, source)
        return targets, ctx.tables.target_map(ctx, base, geometry, coords, targets, source)

    def matrix(self, weights):
        return deconv_matrix(weights)
