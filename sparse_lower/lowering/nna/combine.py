"""The interface of a combine method: which rows each tap multiplies, and how its partial outputs `P_k`
reach the output sites. One module per method: gather_combine.py, scatter_combine.py and
matmul_combine.py multiply every input row by every tap; pair_combine.py only each tap's paired rows."""

from __future__ import annotations

from abc import ABC, abstractmethod

import onnx_graphsurgeon as gs

from ..compute import ConvParts
from ..context import LoweringContext
from .products import TapProducts
from .sites import Sizes


class Combine(ABC):
    needs_zero_row = False  # whether the input rows must end with a zero row (see NnaCompute._zero_row)

    def __init__(self, layout):
        self.layout = layout  # layout.py: where the sites axis is, and the shapes

    @abstractmethod
    def __call__(self, ctx: LoweringContext, conv: ConvParts, nbr: gs.Tensor, x: gs.Tensor, sizes: Sizes,
                 products: TapProducts) -> gs.Tensor:
        """The layer's output before its bias, `layout.shape(Cout, sizes.outputs)`, from the input image
        or rows `x` (`layout.shape(Cin, sizes.columns)`), the (capacity-padded) neighbour table and the
        products by the taps' weights."""
