"""The interface of a combine method: how the partial outputs `P_k` of every tap, computed on the
input sites, reach the output sites. One module per method: gather_combine.py, scatter_combine.py,
matmul_combine.py."""

from __future__ import annotations

from abc import ABC, abstractmethod

import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import LoweringContext
from .sites import Sizes


class Combine(ABC):
    needs_zero_row = False  # whether the input rows must end with a zero row (see NnaCompute._zero_row)

    def __init__(self, layout):
        self.layout = layout  # layout.py: where the sites axis is, and the shapes

    @abstractmethod
    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, partials: list[gs.Tensor],
                 sizes: Sizes) -> gs.Tensor:
        """The layer's output before its bias, `layout.shape(Cout, sizes.outputs)`, from the partials
        and the (capacity-padded) neighbour table."""
