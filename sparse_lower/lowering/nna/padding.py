"""Fixed capacity (`max_active`): accelerator compilers need static shapes, so the nna part sees every
sparse tensor as `[capacity, C]` rows, the real rows first.

Padding happens once, where rows enter the nna part (the tables' pads + `Pad`, outside the accelerator:
the library's `CapacityPads` fails when the rows exceed the capacity, so nothing is truncated silently;
standard-op tables cut them and flag the frame, whose outputs are then NaN: standard_tables.py). A padded
version, once made, is reused: element-wise ops between sparse layers (Relu, a residual Add, a folded
BatchNorm's Mul/Add) are repeated on the padded rows, so consecutive nna layers hand padded rows to
each other and only the model's sparse outputs are sliced back to the real row count. Padding rows
never reach an output: index tables point only at real rows (or at the zero column), and outputs
are sliced.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...onnx_conventions import is_standard
from ..context import FLOAT, INT64, LoweringContext
from ..graph import constant_value

# Element-wise float ops that act row by row, so they commute with padding rows at the end.
ROWWISE = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "Identity", "Add", "Sub", "Mul", "Div", "Neg"}


def broadcasts_over_rows(value: np.ndarray) -> bool:
    """A constant operand that does not depend on the row (a per-channel vector or a scalar)."""
    return value.ndim <= 1 or (value.ndim == 2 and value.shape[0] == 1)


def _propagated(ctx: LoweringContext, rows: gs.Tensor, capacity: int) -> gs.Tensor | None:
    """A padded version of `rows` made by repeating element-wise ops on padded inputs, or None."""
    if rows.name in ctx.padded:
        return ctx.padded[rows.name]
    producer = rows.inputs[0] if len(rows.inputs) == 1 else None
    if producer is None or not is_standard(producer.domain) or producer.op not in ROWWISE:
        return None
    inputs = []
    for tensor in producer.inputs:
        value = constant_value(tensor)
        if not tensor.name or (value is not None and broadcasts_over_rows(value)):
            inputs.append(tensor)
            continue
        padded = None if value is not None else _propagated(ctx, tensor, capacity)
        if padded is None:
            return None
        inputs.append(padded)
    channels = rows.shape[1] if rows.shape and len(rows.shape) == 2 else None
    (padded,) = ctx.standard(producer.op, producer.name or rows.name, inputs,
                             [("padded", FLOAT, [capacity, channels])], dict(producer.attrs))
    ctx.padded[rows.name] = padded
    return padded


def padded_rows(ctx: LoweringContext, rows: gs.Tensor, capacity: int) -> gs.Tensor:
    """`rows [N, C]` as `[capacity, C]` with zero rows after the real ones."""
    found = _propagated(ctx, rows, capacity)
    if found is not None:
        return found
    channels = rows.shape[1] if rows.shape and len(rows.shape) == 2 else None
    padded = pad_to_capacity(ctx, rows, capacity, np.float32(0), [capacity, channels])
    ctx.padded[rows.name] = padded
    return padded


def pad_to_capacity(ctx: LoweringContext, tensor: gs.Tensor, capacity: int, fill, shape: list) -> gs.Tensor:
    """`tensor` grown along axis 0 to `capacity` rows of `fill`; shared per (tensor, capacity)."""
    pads = ctx.tables.capacity_pads(ctx, tensor, capacity, len(shape))
    dtype = FLOAT if np.asarray(fill).dtype == np.float32 else INT64
    fill_value = ctx.shared_constant(f"fill_{np.asarray(fill).dtype}_{fill}", np.asarray(fill))
    (padded,) = ctx.shared_node("Pad", tensor.name, [tensor, pads, fill_value], [("padded", dtype, shape)], {}, domain="")
    return padded
