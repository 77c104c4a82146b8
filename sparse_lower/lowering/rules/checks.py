"""Refusals several rules share: what the features, coords and constant inputs of a source node must
be. Each is a generator of `Refusal`s (a rule reports the first), checking only what the model
declares statically; what only the data can tell (coordinates outside the grid, duplicates) the
custom ops check at run time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import constant_value
from .rule import Refusal

_FLOATS = (np.float32, np.float16)


def declared_shape(tensor: gs.Tensor | None) -> list | None:
    """The static shape a tensor declares (constant value, graph input or value_info), if any."""
    if tensor is None:
        return None
    value = constant_value(tensor)
    if value is not None:
        return list(value.shape)
    return list(tensor.shape) if tensor.shape is not None else None


def features_refusals(tensor: gs.Tensor, channels: int | None) -> Iterator[Refusal]:
    if tensor.dtype is not None and tensor.dtype not in _FLOATS:
        yield Refusal(f"features '{tensor.name}' are {np.dtype(tensor.dtype).name}", "feed float32 (or float16) features")
        return
    shape = declared_shape(tensor)
    if shape is None:
        return
    if len(shape) != 2:
        yield Refusal(f"features '{tensor.name}' have rank {len(shape)}", "feed features as [N, C]")
    elif channels is not None and isinstance(shape[1], int) and shape[1] != channels:
        yield Refusal(f"features '{tensor.name}' have {shape[1]} channels but the weights expect {channels}",
                      "make the weights' input channels match the features")


def coords_refusals(tensor: gs.Tensor, ndim: int, role: str = "coords") -> Iterator[Refusal]:
    layout = f"feed {role} as [N, {1 + ndim}] (batch, then {ndim} spatial indices)"
    if tensor.dtype is not None and tensor.dtype != np.int64:
        yield Refusal(f"{role} '{tensor.name}' are {np.dtype(tensor.dtype).name}",
                      f"feed int64 {role} [N, {1 + ndim}] (insert a Cast to int64)")
        return
    shape = declared_shape(tensor)
    if shape is None:
        return
    if len(shape) != 2:
        yield Refusal(f"{role} '{tensor.name}' have rank {len(shape)}", layout)
    elif isinstance(shape[1], int) and shape[1] != 1 + ndim:
        yield Refusal(f"{role} '{tensor.name}' have {shape[1]} columns, expected {1 + ndim}", layout)


def constant_refusals(tensor: gs.Tensor | None, role: str) -> Iterator[Refusal]:
    """A weight or bias input must be a float constant: the lowering re-lays it out at compile time, and
    integer values would be converted to float as they are, silently dropping the scales a quantised
    layer needs."""
    if tensor is None:
        return
    value = constant_value(tensor)
    if value is None:
        yield Refusal(f"the {role} '{tensor.name}' are computed at run time",
                      f"store the {role} as an initializer or a Constant node (the lowering re-lays them out at "
                      f"compile time)")
    elif not np.issubdtype(value.dtype, np.floating):
        yield Refusal(f"the {role} '{tensor.name}' are {value.dtype.name}",
                      f"store float32 {role} (dequantise integer {role} first)")
