"""What a compute form (gpu/, nna/) is given of one sparse conv once its rule has built the index
table, and the interface a compute form implements. The rules decide which conv reads which table;
the compute forms decide which nodes compute its output rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx_graphsurgeon as gs

from ..schemas import ConvGeometry
from .context import LoweringContext


@dataclass(frozen=True)
class ConvParts:
    """One conv, ready for its compute form.

    `source` is the input rows, or with `dense` the `[B, C, *S]` input of a ToSparse read directly;
    `coords` the input sites, `nbr` the neighbour table `[M, K]`, `out_coords` the output sites;
    `matrix` the weights as the unfold matrix `[K·Cin, Cout]`; `out_features` the tensor to write."""

    base: str
    geometry: ConvGeometry
    source: gs.Tensor
    dense: bool
    coords: gs.Tensor
    nbr: gs.Tensor
    out_coords: gs.Tensor
    matrix: np.ndarray
    bias: np.ndarray | None
    out_features: gs.Variable

    @property
    def taps(self) -> int:
        return self.geometry.volume

    @property
    def cin(self) -> int:
        return self.matrix.shape[0] // self.geometry.volume

    @property
    def cout(self) -> int:
        return self.matrix.shape[1]


class Compute(Protocol):
    """The part of a conv after its index table: how the output rows are computed."""

    reads_dense: bool  # whether it can unfold straight from a dense ToSparse input

    def emit(self, ctx: LoweringContext, conv: ConvParts) -> None:
        """Append the nodes that write `conv.out_features` (bias included)."""

    def row_capacity(self, ctx: LoweringContext, coords: gs.Tensor) -> int | None:
        """The fixed row count of the sparse tensor on `coords` in this form (None: the frame's count): what
        the ops without weights (table_reduce.py) pad their rows and tables to."""

    def members(self, node: gs.Node) -> int:
        """The fixed number of rows one site of a Coalesce may hold, where rows have a capacity."""
