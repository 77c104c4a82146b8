"""SparseMaxPool → StridedMap (a pooling window has a strided convolution's output sites and neighbour
table), or SubmanifoldMap with `submanifold=1` → the per-channel maximum of the rows each output's taps
read (table_reduce.py)."""

from __future__ import annotations

from ...schemas import conv_geometry
from ..graph import node_proto
from .reduce_rule import ReduceRule


class SparseMaxPoolRule(ReduceRule):
    op_type = "SparseMaxPool"

    def ndim(self, node):
        return conv_geometry(node_proto(node)).ndim

    def reduction(self, node):
        return "max"

    def index_table(self, ctx, node, base, coords, width):
        geometry = conv_geometry(node_proto(node))
        if geometry.submanifold:
            return coords, ctx.tables.submanifold_map(ctx, base, geometry, coords, "rows"), geometry.volume
        out_coords, nbr = ctx.tables.strided_map(ctx, base, geometry, coords, "rows")
        return out_coords, nbr, geometry.volume
