"""ToDense(features, coords) → the rows written straight into the zero-initialised dense output, with
nothing dense materialised before it (the target's index tables say how: lowering/index_tables.py)."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

import onnx_graphsurgeon as gs

from ...onnx_conventions import MAX_TENSOR_ELEMENTS
from ...schemas import to_dense_attributes
from ..context import FLOAT, INT64, LoweringContext
from ..graph import declare, detach, node_proto
from .checks import coords_refusals, features_refusals
from .rule import Refusal, Rule


class ToDenseRule(Rule):
    op_type = "ToDense"
    arity = (2, 2, 1)
    required = ("features", "coords")

    def refusals(self, node: gs.Node) -> Iterator[Refusal]:
        boundary = to_dense_attributes(node_proto(node))
        yield from features_refusals(node.inputs[0], None)
        yield from coords_refusals(node.inputs[1], len(boundary.spatial_shape))
        shape = node.inputs[0].shape
        channels = shape[1] if shape is not None and len(shape) == 2 and isinstance(shape[1], int) else 1
        elements = boundary.batch_size * channels * prod(boundary.spatial_shape)
        if elements > MAX_TENSOR_ELEMENTS:
            yield Refusal(f"its dense output [{boundary.batch_size}, {channels}, "
                          f"{', '.join(map(str, boundary.spatial_shape))}] would hold {elements:,} elements, more "
                          f"than the {MAX_TENSOR_ELEMENTS:,} one tensor may", "densify a cropped grid, or fewer batches")

    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        boundary = to_dense_attributes(node_proto(node))
        features, coords = ctx.float32(node.inputs[0]), node.inputs[1]
        (output,) = node.outputs
        base = node.name or ctx.fresh("ToDense")
        ndim = len(boundary.spatial_shape)
        declare(node.inputs[0], FLOAT, [None, None])
        declare(coords, INT64, [None, 1 + ndim])
        declare(output, FLOAT, [boundary.batch_size, features.shape[1] if features.shape else None,
                                *boundary.spatial_shape])
        detach(node)
        ctx.tables.to_dense(ctx, base, features, coords, boundary, output)
