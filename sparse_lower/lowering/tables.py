"""Requests for the index-builder custom ops, through the context's shared table cache."""

from __future__ import annotations

from dataclasses import replace

import onnx_graphsurgeon as gs

from ..schemas import ConvGeometry
from .context import INT64, LoweringContext


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


def submanifold_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, source: str):
    (nbr,) = ctx.table("SubmanifoldMap", base, [coords], [_nbr(geometry)], _attrs(geometry, source))
    return nbr


def strided_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, source: str):
    out_coords, nbr = ctx.table("StridedMap", base, [coords], [_coords(geometry), _nbr(geometry)],
                                _attrs(geometry, source, "strides", "pads"))
    return out_coords, nbr


def transposed_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, source: str):
    out_coords, nbr = ctx.table("TransposedMap", base, [coords], [_coords(geometry), _nbr(geometry)],
                                _attrs(geometry, source, "strides", "pads", "output_padding"))
    return out_coords, nbr


def target_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, targets: gs.Tensor,
               source: str):
    (nbr,) = ctx.table("TargetMap", base, [coords, targets], [_nbr(geometry)],
                       _attrs(geometry, source, "strides", "pads", "output_padding"))
    return nbr


def forward_inverse_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor,
                        targets: gs.Tensor, source: str) -> gs.Tensor | None:
    """The TargetMap of an inverse conv read off its forward conv's StridedMap, or None when there is none.

    An inverse conv (spconv's SparseInverseConv: a SparseDeconv with the forward geometry whose targets
    are the forward input coords and whose coords are the forward output coords) pairs the same rows
    through the same taps as its forward conv, in the other direction: its nbr is the forward nbr
    inverted, which `InverseMap` builds in O(K·(M + N)) without a lookup ([K, N], then transposed).
    spconv reuses the forward pairs the same way. The match is exact: same geometry, the forward output
    grid equal to this conv's input grid, and `coords` the forward's own out_coords tensor, so every
    check TargetMap would make was made by the StridedMap on the same tensors.
    """
    fine_grid = geometry.output_shape
    forward = replace(geometry, op_type="SparseConv", spatial_shape=fine_grid, output_padding=(0,) * geometry.ndim)
    if source != "rows" or min(forward.output_shape) < 1 or forward.output_shape != geometry.spatial_shape:
        return None
    found = ctx.shared("StridedMap", [targets], _attrs(forward, source, "strides", "pads"))
    if found is None or found[0].name != coords.name:
        return None
    (inverse,) = ctx.table("InverseMap", base, [found[1], targets], [("inverse", INT64, [geometry.volume, None])], {})
    (nbr,) = ctx.table("Transpose", base, [inverse], [_nbr(geometry)], {"perm": [1, 0]}, domain="")
    return nbr
