"""The index-table builders a conv rule requests (StridedMap, SubmanifoldMap, TransposedMap, TargetMap),
through the context's shared nodes: one table per coords and geometry, however many layers read it."""

from __future__ import annotations

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
    (nbr,) = ctx.shared_node("SubmanifoldMap", base, [coords], [_nbr(geometry)], _attrs(geometry, source))
    return nbr


def strided_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, source: str):
    out_coords, nbr = ctx.shared_node("StridedMap", base, [coords], [_coords(geometry), _nbr(geometry)],
                                      _attrs(geometry, source, "strides", "pads"))
    return out_coords, nbr


def transposed_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, source: str):
    out_coords, nbr = ctx.shared_node("TransposedMap", base, [coords], [_coords(geometry), _nbr(geometry)],
                                      _attrs(geometry, source, "strides", "pads", "output_padding"))
    return out_coords, nbr


def target_map(ctx: LoweringContext, base: str, geometry: ConvGeometry, coords: gs.Tensor, targets: gs.Tensor,
               source: str):
    (nbr,) = ctx.shared_node("TargetMap", base, [coords, targets], [_nbr(geometry)],
                             _attrs(geometry, source, "strides", "pads", "output_padding"))
    return nbr
