"""Where a target's index tables come from: the neighbour table of each conv (SubmanifoldMap,
StridedMap, TransposedMap, TargetMap), the active sites of a dense input (ToSparse), the placing of
rows into a dense output (ToDense), and the nna combines' own tables and row capacities (CapacityPads,
InverseMap, ScatterMatrices, PairLists: docs/custom_ops.md).

`IndexTables` is the interface the rules and compute forms call; `CustomOpTables` builds them with the
library's custom ops (gpu, nna, hybrid), `portable.StandardOpTables` with standard ONNX ops inside the
graph (portable), and `nna.StandardNnaTables` adds the nna combines' tables to those (nna and hybrid
with `tables="standard"`, for runtimes without the library). Tables go through the context's shared
nodes: one table per coords and geometry, however many layers read it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx_graphsurgeon as gs

from ..schemas import ConvGeometry, DenseBoundary
from .context import FLOAT, INT64, DenseSource, LoweringContext
from .nna.pair_lists import PairTables, pair_lists


class IndexTables(Protocol):
    """The index part of a target. Every `*_map` returns the neighbour table `nbr [M, K]` (taps in the
    kernel's row-major order, docs/custom_ops.md) and, where the conv makes new sites, their coords."""

    def submanifold_map(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor,
                        source: str) -> gs.Tensor: ...

    def strided_map(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor,
                    source: str) -> tuple[gs.Tensor, gs.Tensor]: ...

    def transposed_map(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor,
                       source: str) -> tuple[gs.Tensor, gs.Tensor]: ...

    def target_map(self, ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor,
                   targets: gs.Tensor, source: str) -> gs.Tensor: ...

    def coalesce_map(self, ctx: LoweringContext, base: str, spatial_shape: tuple, coords: gs.Tensor,
                     width: int | None) -> tuple[gs.Tensor, gs.Tensor]:
        """(distinct sites sorted, the rows at each `[M, R]`) of coords whose rows may repeat a site; R is
        `width` where given (a site with more rows fails), else the most rows any site has."""

    first_row: int  # what a table holds for input row 0 (a missing row: first_row − 1)

    def paired_rows(self, ctx: LoweringContext, base: str, features: gs.Tensor, coords: gs.Tensor,
                    table: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor | None]:
        """`features` checked to pair with `coords` where no sparse layer computed them (the user's feeds),
        and the flag (bool [1]) of a frame that broke a rule, where the tables flag instead of failing."""

    def to_sparse(self, ctx: LoweringContext, base: str, dense: gs.Tensor, features: gs.Variable,
                  coords: gs.Variable) -> None:
        """Write `features` and `coords` (sorted) of the active sites of `dense [B, C, *S]`."""

    def to_dense(self, ctx: LoweringContext, base: str, features: gs.Tensor, coords: gs.Tensor,
                 boundary: DenseBoundary, output: gs.Variable) -> None:
        """Write the rows into the zero-initialised `output [batch_size, C, *spatial_shape]`."""

    # The nna form's own tables and row capacities, which read the neighbour table as the custom ops hold
    # it (nna/sites.zero_based); `capacity` is a row capacity (max_active), None for none.

    def capacity_pads(self, ctx: LoweringContext, tensor: gs.Tensor, capacity: int, rank: int) -> gs.Tensor:
        """The `pads [2·rank]` of a `Pad` that gives `tensor` exactly `capacity` rows."""

    def flag_overflow(self, ctx: LoweringContext, invalid: gs.Tensor | None,
                      *rows: tuple[gs.Tensor, int | None]) -> gs.Tensor | None:
        """`invalid`, and whether a `(tensor, capacity)` of `rows` holds more rows than its capacity, where
        the tables flag such a frame (capacity_pads cuts it) rather than refuse it."""

    def within(self, ctx: LoweringContext, table: gs.Tensor, capacity: int | None) -> gs.Tensor:
        """`table` with every entry of an input row at or past `capacity` reading as none, where
        capacity_pads may cut rows: every gather by it then stays in bounds."""

    def inverse_map(self, ctx: LoweringContext, nbr: gs.Tensor, like: gs.Tensor, columns: int | None) -> gs.Tensor:
        """InverseMap's `inv [K, N]`: the output each input row feeds per tap, −1 for none (N: `like`'s rows)."""

    def scatter_matrices(self, ctx: LoweringContext, base: str, nbr: gs.Tensor, like: gs.Tensor,
                         outputs: int | None, columns: int | None) -> gs.Tensor:
        """ScatterMatrices' `S` float `[K, M, N]`: 1 where output m reads input n through tap k."""

    def pair_lists(self, ctx: LoweringContext, nbr: gs.Tensor, inputs: gs.Tensor,
                   capacities: tuple[int, ...] | None, option: str) -> PairTables:
        """The pairs combine's per-tap lists (nna/pair_lists.py)."""


def _attrs(geometry: ConvGeometry, source: str, *extra: str) -> dict:
    attrs = {"kernel_shape": list(geometry.kernel_shape), "dilations": list(geometry.dilations),
             "spatial_shape": list(geometry.spatial_shape), "source": source}
    for name in extra:
        attrs[name] = list(getattr(geometry, name))
    return attrs


def _nbr(geometry: ConvGeometry) -> tuple:
    return ("nbr", INT64, [None, geometry.volume])


def _coords(geometry: ConvGeometry) -> tuple:
    return ("out_coords", INT64, [None, 1 + geometry.ndim])


class CustomOpTables:
    """The library's index builders (docs/custom_ops.md), which check every coordinate at run time."""

    first_row = 0

    def submanifold_map(self, ctx, base, geometry, coords, source):
        (nbr,) = ctx.shared_node("SubmanifoldMap", base, [coords], [_nbr(geometry)], _attrs(geometry, source))
        return nbr

    def strided_map(self, ctx, base, geometry, coords, source):
        if geometry.floor:
            return self._floor_map(ctx, base, geometry, coords, source)
        out_coords, nbr = ctx.shared_node("StridedMap", base, [coords], [_coords(geometry), _nbr(geometry)],
                                          _attrs(geometry, source, "strides", "pads"))
        return out_coords, nbr

    def _floor_map(self, ctx, base, geometry, coords, source):
        """The floor rule: the distinct `floor(i / s)` (a Div, then CoalesceMap's sorted distinct sites),
        and their neighbour table as a TargetMap on the convolution's geometry (`transposed=0`)."""
        strides = [1, *geometry.strides]
        divisor = ctx.shared_constant(f"floor divisor {strides}", np.array(strides, np.int64))
        (floors,) = ctx.shared_node("Div", base, [coords, divisor], [("floors", INT64, coords.shape)], {}, domain="")
        out_coords, _ = self.coalesce_map(ctx, base, geometry.output_shape, floors, None)
        (nbr,) = ctx.shared_node("TargetMap", base, [coords, out_coords], [_nbr(geometry)],
                                 {**_attrs(geometry, source, "strides", "pads"), "transposed": 0})
        return out_coords, nbr

    def transposed_map(self, ctx, base, geometry, coords, source):
        out_coords, nbr = ctx.shared_node("TransposedMap", base, [coords], [_coords(geometry), _nbr(geometry)],
                                          _attrs(geometry, source, "strides", "pads", "output_padding"))
        return out_coords, nbr

    def target_map(self, ctx, base, geometry, coords, targets, source):
        (nbr,) = ctx.shared_node("TargetMap", base, [coords, targets], [_nbr(geometry)],
                                 _attrs(geometry, source, "strides", "pads", "output_padding"))
        return nbr

    def coalesce_map(self, ctx, base, spatial_shape, coords, width):
        attrs = {"spatial_shape": list(spatial_shape), **({"members": width} if width else {})}
        out_coords, members = ctx.shared_node("CoalesceMap", base, [coords],
                                              [("out_coords", INT64, [None, 1 + len(spatial_shape)]),
                                               ("members", INT64, [None, width])], attrs)
        return out_coords, members

    def paired_rows(self, ctx, base, features, coords, table):
        """PairRows refuses rows that do not pair with the coords (an error, never a flag)."""
        if not ctx.after_a_sparse_layer(features):
            (features,) = ctx.shared_node("PairRows", features.name, [features, coords],
                                          [("paired", FLOAT, features.shape)], {})
        return features, None

    def to_sparse(self, ctx, base, dense, features, coords):
        """ActiveSites(X) gives the coords and the linear sites; the features are a gather of those sites.
        A conv reading these features unfolds straight from X instead (the patent's dense-format method),
        and then the gather is unused and cleanup drops it."""
        (_, sites) = ctx.add("ActiveSites", base, [dense], [coords, ("sites", INT64, [None, 1])])
        # The sites come from X itself, so its extent needs no check here.
        ctx.add("IndexedUnfold", base, [dense, sites], [features])
        ctx.dense_sources[features.name] = DenseSource(dense, coords)

    def to_dense(self, ctx, base, features, coords, boundary, output):
        """SiteIndex(coords) → IndexedFold in dense mode: the rows are written straight into the output.
        Features that no sparse layer computed (the user's feeds) pass PairRows first, which refuses rows
        that do not pair with the coords in the user's terms."""
        if not ctx.after_a_sparse_layer(features):
            (features,) = ctx.shared_node("PairRows", features.name, [features, coords],
                                          [("paired", FLOAT, features.shape)], {})
        grid = {"spatial_shape": list(boundary.spatial_shape), "batch_size": boundary.batch_size}
        (sites,) = ctx.shared_node("SiteIndex", base, [coords], [("sites", INT64, [None])], grid)
        ctx.add("IndexedFold", base, [features, sites], [output], {"mode": "dense", **grid})

    def capacity_pads(self, ctx, tensor, capacity, rank):
        """CapacityPads, which refuses more rows than `capacity` (naming both): nothing is cut."""
        (pads,) = ctx.shared_node("CapacityPads", tensor.name, [tensor], [("pads", INT64, [2 * rank])],
                                  {"capacity": capacity})
        return pads

    def flag_overflow(self, ctx, invalid, *rows):
        """Nothing to flag: CapacityPads refuses the frame."""
        return invalid

    def within(self, ctx, table, capacity):
        """Every entry is within: CapacityPads refused any frame with more rows."""
        return table

    def inverse_map(self, ctx, nbr, like, columns):
        (inverse,) = ctx.shared_node("InverseMap", nbr.name, [nbr, like], [("inverse", INT64, [nbr.shape[1], columns])],
                                     {})
        return inverse

    def scatter_matrices(self, ctx, base, nbr, like, outputs, columns):
        """ScatterMatrices refuses matrices over 1 GiB at run time."""
        (matrices,) = ctx.shared_node("ScatterMatrices", nbr.name, [nbr, like],
                                      [("S", FLOAT, [nbr.shape[1], outputs, columns])], {})
        return matrices

    def pair_lists(self, ctx, nbr, inputs, capacities, option):
        return pair_lists(ctx, nbr, inputs, capacities, option)
