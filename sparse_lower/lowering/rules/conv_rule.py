"""What the three sparse-conv rules share: match by op type, refuse non-constant weights, and the
rewrite skeleton (index table → compute → output coords). Each rule module supplies only its table
and its weight layout; the compute form (gpu or nna) is chosen per node by the target's policy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Protocol

import numpy as np
import onnx_graphsurgeon as gs

from ...schemas import SOURCE_DOMAIN, ConvGeometry, conv_geometry
from ..context import FLOAT, INT64, LoweringContext
from ..graph import constant_value, declare, detach, node_proto, optional_input, replace_uses


class Compute(Protocol):
    """The part of a conv after its index table: how the output rows are computed."""

    reads_dense: bool  # whether it can unfold straight from a dense ToSparse input

    def emit(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, source: gs.Tensor, dense: bool,
             coords: gs.Tensor, nbr: gs.Tensor, out_coords: gs.Tensor, matrix: np.ndarray,
             bias: np.ndarray | None, out_features: gs.Variable) -> None: ...


class ConvRule(ABC):
    op_type = ""

    def __init__(self, choose: Callable[[gs.Node, LoweringContext], Compute]):
        self.choose = choose

    def match(self, node: gs.Node) -> bool:
        return node.domain == SOURCE_DOMAIN and node.op == self.op_type

    def check(self, node: gs.Node, ctx: LoweringContext) -> str | None:
        """Why this node cannot be lowered, or None."""
        for index, role in ((2, "weights"), (3, "bias")):
            tensor = optional_input(node, index)
            if tensor is not None and constant_value(tensor) is None:
                return (f"the {role} '{tensor.name}' are computed at run time; the lowering re-lays them "
                        f"out at compile time, so store them as an initializer or a Constant node")
        return None

    @abstractmethod
    def table(self, ctx: LoweringContext, node: gs.Node, base: str, geometry: ConvGeometry, coords: gs.Tensor,
              source: str) -> tuple[gs.Tensor, gs.Tensor]:
        """(output coords, neighbour table) of this conv."""

    @abstractmethod
    def matrix(self, weights: np.ndarray) -> np.ndarray:
        """The weights as the unfold matrix [K·Cin, Cout]."""

    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        compute = self.choose(node, ctx)
        geometry = conv_geometry(node_proto(node))
        features, coords = ctx.float32(node.inputs[0]), node.inputs[1]
        matrix = self.matrix(constant_value(node.inputs[2]))
        bias = constant_value(optional_input(node, 3))
        base = node.name or ctx.fresh(self.op_type)
        source, dense = features, False
        source_dense = ctx.dense_sources.get(features.name)
        if compute.reads_dense and source_dense is not None and source_dense.coords is coords:
            source, dense = source_dense.dense, True  # the dense-format method: unfold straight from X
        out_coords, nbr = self.table(ctx, node, base, geometry, coords, "dense" if dense else "rows")
        if node.outputs[1].name in ctx.levels:  # the output sites' level, under the name they now have
            ctx.levels[out_coords.name] = ctx.levels[node.outputs[1].name]
        cin, cout = matrix.shape[0] // geometry.volume, matrix.shape[1]
        width = 1 + geometry.ndim
        for tensor, dtype, shape in ((node.inputs[0], FLOAT, [None, cin]), (coords, INT64, [None, width]),
                                     (node.outputs[0], FLOAT, [None, cout]), (node.outputs[1], INT64, [None, width])):
            declare(tensor, dtype, shape)
        targets = optional_input(node, 4)
        if targets is not None:
            declare(targets, INT64, [None, width])
        out_features, node_coords = node.outputs[0], node.outputs[1]
        detach(node)
        compute.emit(ctx, base, geometry, source, dense, coords, nbr, out_coords, matrix, bias, out_features)
        ctx.conv_outputs.add(out_features.name)
        replace_uses(ctx.graph, node_coords, out_coords)
