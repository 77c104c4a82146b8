"""What the three sparse-conv rules share: their connections, their refusals (constant float weights
in the ONNX layout, features and coords that fit them) and the rewrite skeleton (index table → compute
→ output coords). Each rule module supplies only its table and its weight layout; the compute form (gpu
or nna) is chosen per node by the target's policy (LoweringContext.compute_for)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from ...schemas import ConvGeometry, conv_channels, conv_geometry, weight_shape
from ..compute import ConvParts
from ..context import FLOAT, INT64, LoweringContext
from ..graph import constant_value, declare, detach, node_proto, optional_input, replace_uses
from .checks import constant_refusals, coords_refusals, declared_shape, features_refusals
from .rule import Refusal, Rule


class ConvRule(Rule):
    arity = (3, 4, 2)
    required = ("features", "coords", "weights")
    transposed = False  # whether the weights are in ConvTranspose's layout (Cin, Cout, *kernel)

    def refusals(self, node: gs.Node) -> Iterator[Refusal]:
        geometry = conv_geometry(node_proto(node))
        weights = node.inputs[2]
        yield from constant_refusals(weights, "weights")
        shape = declared_shape(weights)
        onnx_op = "ConvTranspose" if self.transposed else "Conv"
        if len(shape) != 2 + geometry.ndim:
            yield Refusal(f"weights of shape {shape} for a {geometry.ndim}D conv",
                          f"give weights of rank {2 + geometry.ndim} in the ONNX {onnx_op} layout")
            return
        cin, cout = conv_channels(node.op, shape)
        expected = list(weight_shape(geometry, cin, cout))
        if shape != expected:
            yield self._layout_refusal(shape, expected, geometry)
            return
        bias = optional_input(node, 3)
        yield from constant_refusals(bias, "bias")
        if bias is not None and declared_shape(bias) != [cout]:
            yield Refusal(f"bias of shape {declared_shape(bias)}, expected [{cout}]", f"give a bias of shape [{cout}] or none")
        yield from features_refusals(node.inputs[0], cin)
        yield from coords_refusals(node.inputs[1], geometry.ndim)
        targets = optional_input(node, 4)
        if targets is not None:
            yield from coords_refusals(targets, geometry.ndim, "target_coords")

    def _layout_refusal(self, shape: list, expected: list, geometry: ConvGeometry) -> Refusal:
        layout = f"({'Cin, Cout' if self.transposed else 'Cout, Cin'}, *kernel)"
        if shape[1:-1] != list(geometry.kernel_shape):
            return Refusal(f"weights of shape {shape} do not match kernel_shape {list(geometry.kernel_shape)}",
                           f"give weights {expected} {layout}")
        # spconv's KRSC [Cout, *kernel, Cin], as exported
        moved = [shape[-1], shape[0], *shape[1:-1]] if self.transposed else [shape[0], shape[-1], *shape[1:-1]]
        return Refusal(f"weights of shape {shape} are in spconv's layout [Cout, *kernel, Cin], not {layout}",
                       f"transpose them: np.moveaxis(w, -1, {0 if self.transposed else 1}) gives {moved} "
                       f"(sparse_lower.export does this for spconv modules)")

    @abstractmethod
    def index_table(self, ctx: LoweringContext, node: gs.Node, base: str, geometry: ConvGeometry, coords: gs.Tensor,
                    source: str) -> tuple[gs.Tensor, gs.Tensor]:
        """(output coords, neighbour table) of this conv."""

    @abstractmethod
    def matrix(self, weights: np.ndarray) -> np.ndarray:
        """The weights as the unfold matrix [K·Cin, Cout]."""

    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        compute = ctx.compute_for(node)
        geometry = conv_geometry(node_proto(node))
        features, coords = ctx.float32(node.inputs[0]), node.inputs[1]
        matrix = self.matrix(constant_value(node.inputs[2]))
        bias = constant_value(optional_input(node, 3))
        base = node.name or ctx.fresh(self.op_type)
        source, dense = features, False
        source_dense = ctx.dense_sources.get(features.name)
        if compute.reads_dense and source_dense is not None and source_dense.coords is coords:
            source, dense = source_dense.dense, True  # the dense-format method: unfold straight from X
        out_coords, nbr = self.index_table(ctx, node, base, geometry, coords, "dense" if dense else "rows")
        if node.outputs[1].name in ctx.levels:  # the output sites' level, under the name they now have
            ctx.levels[out_coords.name] = ctx.levels[node.outputs[1].name]
        conv = ConvParts(base, geometry, source, dense, coords, nbr, out_coords, matrix, bias, node.outputs[0])
        width = 1 + geometry.ndim
        for tensor, dtype, shape in ((node.inputs[0], FLOAT, [None, conv.cin]), (coords, INT64, [None, width]),
                                     (node.outputs[0], FLOAT, [None, conv.cout]), (node.outputs[1], INT64, [None, width])):
            declare(tensor, dtype, shape)
        targets = optional_input(node, 4)
        if targets is not None:
            declare(targets, INT64, [None, width])
        node_coords = node.outputs[1]
        detach(node)
        compute.emit(ctx, conv)
        ctx.conv_outputs.add(conv.out_features.name)
        replace_uses(ctx.graph, node_coords, out_coords)
