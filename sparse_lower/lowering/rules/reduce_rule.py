"""What the two rules without weights share (SparseMaxPool, Coalesce): their connections, their
refusals (features and coords), and the rewrite skeleton (index table → table_reduce.py's compute →
output coords). Each rule module supplies its table and its reduction."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator

import onnx_graphsurgeon as gs

from ..context import FLOAT, INT64, LoweringContext
from ..graph import constant_value, declare, detach, replace_uses
from ..nna.padding import ROWWISE
from ..table_reduce import TableReduce, emit_table_reduce
from .checks import coords_refusals, declared_shape, features_refusals
from .rule import Refusal, Rule


# Ops whose output rows have their input's channels: element-wise ops, and a concatenation of rows.
_SAME_CHANNELS = ROWWISE | {"Cast", "Concat"}


def _channels(features: gs.Tensor, depth: int = 64) -> int | None:
    """The channel count of feature rows, from their declared shape or, where none is declared (a row
    concatenation of conv outputs and activations), from what they are computed of: the nna target's
    static shapes need it to be known at compile time."""
    shape = declared_shape(features)
    if shape and len(shape) == 2 and isinstance(shape[1], int):
        return shape[1]
    producer = features.inputs[0] if len(features.inputs) == 1 else None
    if depth == 0 or producer is None or producer.op not in _SAME_CHANNELS or \
            (producer.op == "Concat" and producer.attrs.get("axis") not in (0, -2)):
        return None
    found = [_channels(t, depth - 1) for t in producer.inputs if t.name and constant_value(t) is None]
    return next((c for c in found if c is not None), None)


class ReduceRule(Rule):
    arity = (2, 2, 2)
    required = ("features", "coords")
    members_vary = False  # whether the table's width depends on the frame (fixed by max_members under a capacity)

    @abstractmethod
    def ndim(self, node: gs.Node) -> int:
        """The spatial dimensions of the node's grid (its attributes checked)."""

    @abstractmethod
    def reduction(self, node: gs.Node) -> str:
        """"sum" or "max"."""

    @abstractmethod
    def index_table(self, ctx: LoweringContext, node: gs.Node, base: str, coords: gs.Tensor,
                    width: int | None) -> tuple[gs.Tensor, gs.Tensor, int | None]:
        """(output coords, table [M, R], R where known) of this node; `width`: the R the static form asks."""

    def refusals(self, node: gs.Node) -> Iterator[Refusal]:
        yield from features_refusals(node.inputs[0], None)
        yield from coords_refusals(node.inputs[1], self.ndim(node))

    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        compute = ctx.compute_for(node)
        features, coords = ctx.float32(node.inputs[0]), node.inputs[1]
        base = node.name or ctx.fresh(self.op_type)
        channels = _channels(node.inputs[0])
        capacity_in = compute.row_capacity(ctx, coords)
        members = compute.members(node) if capacity_in and self.members_vary else None
        out_coords, table, width = self.index_table(ctx, node, base, coords, members)
        if node.outputs[1].name in ctx.levels:  # the output sites' level, under the name they now have
            ctx.levels[out_coords.name] = ctx.levels[node.outputs[1].name]
        width_d = 1 + self.ndim(node)
        for tensor, dtype, dims in ((node.inputs[0], FLOAT, [None, channels]), (coords, INT64, [None, width_d]),
                                    (node.outputs[0], FLOAT, [None, channels]), (node.outputs[1], INT64, [None, width_d])):
            declare(tensor, dtype, dims)
        out_features, node_coords = node.outputs
        detach(node)
        capacity_out = compute.row_capacity(ctx, out_coords)
        rows, invalid = ctx.tables.paired_rows(ctx, base, features, coords, table)
        invalid = ctx.tables.flag_overflow(ctx, invalid, (coords, capacity_in), (out_coords, capacity_out))
        part = TableReduce(base, self.reduction(node), rows, channels, table, width, out_coords, out_features,
                           (capacity_in, capacity_out))
        emit_table_reduce(ctx, part, ctx.tables.first_row, invalid)
        ctx.conv_outputs.add(out_features.name)
        replace_uses(ctx.graph, node_coords, out_coords)
