"""SparseConv → StridedMap (output coords sorted, neighbour table)."""

from __future__ import annotations

from .conv_rule import ConvRule
from ..weights import conv_matrix


class SparseConvRule(ConvRule):
    op_type = "SparseConv"

    def index_table(self, ctx, node, base, geometry, coords, source):
        return ctx.tables.strided_map(ctx, base, geometry, coords, source)

    def matrix(self, weights):
        return conv_matrix(weights)
