"""ToSparse(X) → ActiveSites(X) gives the coords and the linear sites; the features are a gather of
those sites. A conv reading these features unfolds straight from X instead (the patent's
dense-format method), and then the gather is unused and cleanup drops it."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ...schemas import SOURCE_DOMAIN
from ..graph import declare, detach
from ..context import FLOAT, INT64, DenseSource, LoweringContext


class ToSparseRule:
    def match(self, node: gs.Node) -> bool:
        return node.domain == SOURCE_DOMAIN and node.op == "ToSparse"

    def check(self, node: gs.Node, ctx: LoweringContext) -> str | None:
        return None

    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        dense = ctx.float32(node.inputs[0])
        features, coords = node.outputs
        base = node.name or ctx.fresh("ToSparse")
        detach(node)
        declare(coords, INT64, [None, len(dense.shape) - 1 if dense.shape else None])
        declare(features, FLOAT, [None, dense.shape[1] if dense.shape else None])
        (_, sites) = ctx.add("ActiveSites", base, [dense], [coords, ("sites", INT64, [None, 1])])
        # The sites come from X itself, so its extent needs no check here.
        ctx.add("IndexedUnfold", base, [dense, sites], [features])
        ctx.dense_sources[features.name] = DenseSource(dense, coords)
