"""LowerToGpu: rewrite every source node with the gpu rules (DESIGN.md §4, gpu target)."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..lowering.graph import export
from ..lowering.gpu import STRATEGIES, GpuContext, rules
from ..schemas import CUSTOM_DOMAIN, SOURCE_DOMAIN


def source_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == SOURCE_DOMAIN]


class LowerToGpu:
    """requires: validated source nodes. ensures: no `sparse` node is left; the model imports the
    `sparse_lower` domain."""

    name = "lower-gpu"

    def __init__(self, strategy: str = "auto"):
        if strategy not in STRATEGIES:
            raise SparseLowerError(f"unknown strategy '{strategy}'", fix=f"use one of {', '.join(STRATEGIES)}")
        # Both strategies do the same multiply-adds here (the rulebook is padded to the busiest tap), and
        # the unfold needs no fold: auto takes it until a pair-count cost model says otherwise.
        self.strategy = "unfold" if strategy == "auto" else strategy

    def requires(self, model: onnx.ModelProto) -> None:
        """The validate pass ran: nothing to re-check."""

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        graph = gs.import_onnx(model)
        graph.toposort()
        ctx = GpuContext(graph, self.strategy)
        rule_list = rules()
        for node in list(graph.nodes):
            rule = next((r for r in rule_list if r.match(node)), None)
            if rule is None:
                continue
            reason = rule.check(node, ctx)
            if reason:
                raise SparseLowerError(reason, node.name)
            rule.rewrite(node, ctx)
        graph.cleanup().toposort()
        return export(graph, model, drop_domains=(SOURCE_DOMAIN,), add_domains=((CUSTOM_DOMAIN, 1),))

    def ensures(self, model: onnx.ModelProto) -> None:
        left = source_nodes(model)
        if left:
            raise SparseLowerError(f"{len(left)} source nodes were not lowered", left[0].name)
