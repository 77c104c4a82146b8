"""SubmanifoldConv → SubmanifoldMap: the output rows are the input rows, so the output coords are
the input coords tensor itself, and later layers on them share the table."""

from __future__ import annotations

from .conv_rule import ConvRule
from ..weights import conv_matrix


class SubmanifoldConvRule(ConvRule):
    op_type = "SubmanifoldConv"

    def index_table(self, ctx, node, base, geometry, coords, source):
        return coords, ctx.tables.submanifold_map(ctx, base, geometry, coords, source)

    def matrix(self, weights):
        return conv_matrix(weights)
