"""Coalesce → CoalesceMap (the distinct sites, sorted, and the rows at each) → their sum or per-channel
maximum (table_reduce.py)."""

from __future__ import annotations

from ...schemas import coalesce_attributes
from ..graph import node_proto
from .reduce_rule import ReduceRule


class CoalesceRule(ReduceRule):
    op_type = "Coalesce"
    members_vary = True

    def ndim(self, node):
        return len(coalesce_attributes(node_proto(node)).spatial_shape)

    def reduction(self, node):
        return coalesce_attributes(node_proto(node)).reduction

    def index_table(self, ctx, node, base, coords, width):
        merge = coalesce_attributes(node_proto(node))
        out_coords, members = ctx.tables.coalesce_map(ctx, base, merge.spatial_shape, coords, width)
        return out_coords, members, width
