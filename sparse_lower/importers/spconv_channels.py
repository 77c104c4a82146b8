"""Arithmetic within the rows of sparse features, as the tracer (spconv_tracer.py) writes it: each row
is one site, so whatever keeps the rows apart keeps the sparse tensor a sparse tensor, and translates to
standard ops on `[N, …]` whose first axis stays the rows (N is dynamic: shapes are written with 0,
"this axis as it is", for it).

The torch patterns recognised:

* a `view` / `reshape` / `flatten` / `unsqueeze` / `squeeze` that splits or merges the channels of each
  row (`features.view(n, out_channels, -1)`, UNetV2's channel reduction) becomes `Reshape` to
  `[0, …]`; a `permute` / `transpose` that leaves the rows first becomes `Transpose`. The result is a
  *row view* (kind "row_view") until it is `[N, C]` again;
* `sum` / `mean` / `amax` / `max(dim)` over axes other than the rows become `ReduceSum` /
  `ReduceMean` / `ReduceMax`;
* channel slices, `features[:, a:b]` (with a step) or `features[:, c]`, become `Slice` (then a
  `Squeeze` for a single channel), and `split` / `chunk` along the channels one `Slice` per piece.

Anything that would move values between rows (a reshape of the row count, a reduction over the rows,
indexing rows) is refused with the pattern that works.
"""

from __future__ import annotations

import numpy as np

from ..errors import SparseLowerError
from .spconv_merges import _Value

ROW_KINDS = ("features", "row_view")
_FIX = ("keep the rows (sites) apart: reshape only within a row (features.view(n, groups, -1)), reduce over "
        "axes other than the first, slice channels (features[:, a:b]); mix sites with spconv convolutions")


def _refuse(what: str):
    raise SparseLowerError(f"{what} mixes the rows (sites) of sparse features and cannot be exported", fix=_FIX)


def _axes(dims, rank: int) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted(int(d) % rank for d in dims)


class ChannelOps:
    """Handlers of the patterns above, mixed into the tracer (which supplies `values`, `_track`, `_node`,
    `_input`, `writer`, `torch` and `cannot_translate`)."""

    def _channel_handlers(self, torch) -> dict:
        T = torch.Tensor
        handlers = {}
        for functions, handler in (((T.sum, torch.sum), "ReduceSum"), ((T.mean, torch.mean), "ReduceMean"),
                                   ((T.amax, torch.amax, T.max, torch.max), "ReduceMax")):
            for function in functions:
                handlers[function] = lambda func, args, kwargs, result, op_type=handler: self._reduce(
                    op_type, func, args, kwargs, result)
        for function in (T.split, torch.split, T.chunk, torch.chunk):
            handlers[function] = self._split
        return handlers

    def _row_value(self, tensor) -> _Value | None:
        value = self.values.get(id(tensor)) if isinstance(tensor, self.torch.Tensor) else None
        return value if value is not None and value.kind in ROW_KINDS else None

    def _track_rows(self, result, name: str, value: _Value) -> None:
        """`result` as features again where it is [N, C], else as a row view, on `value`'s coords."""
        self._track(result, _Value(name, "features" if result.dim() == 2 else "row_view", value.coords))

    def reshape_rows(self, func, args, result, value: _Value) -> None:
        """A reshape of features that keeps each row's values in its row."""
        if result.dim() < 2 or result.shape[0] != args[0].shape[0]:
            _refuse(f"{func.__name__} of features [{', '.join(map(str, args[0].shape))}] to "
                    f"[{', '.join(map(str, result.shape))}]")
        shape = self.writer.constant(f"{value.name}.row_shape", np.array([0, *result.shape[1:]], np.int64))
        self._track_rows(result, self._node("Reshape", [value.name, shape], f"{value.name}.rows", "RowReshape"), value)

    def transpose_rows(self, func, perm: list[int], result, value: _Value) -> None:
        """A permutation of the axes of a row view that leaves the rows first."""
        if perm[0] != 0:
            _refuse(f"{func.__name__} that moves the rows off the first axis")
        self._track_rows(result, self._node("Transpose", [value.name], f"{value.name}.permuted", "RowTranspose",
                                            perm=perm), value)

    def _reduce(self, op_type: str, func, args, kwargs, result):
        value = self._row_value(args[0])
        if value is None:
            self.cannot_translate(func)
        rank = args[0].dim()
        dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dims is None or isinstance(dims, self.torch.Tensor):
            _refuse(f"{func.__name__} over every axis")
        axes = _axes(dims, rank)
        if 0 in axes:
            _refuse(f"{func.__name__} over the rows")
        keep = int(bool(kwargs.get("keepdim", args[2] if len(args) > 2 and isinstance(args[2], bool) else False)))
        if op_type == "ReduceSum":  # axes an input since opset 13, an attribute of the others until opset 18
            inputs = [value.name, self.writer.constant(f"{value.name}.axes", np.array(axes, np.int64))]
            output = self._node(op_type, inputs, f"{value.name}.{op_type[6:].lower()}", op_type, keepdims=keep)
        else:
            output = self._node(op_type, [value.name], f"{value.name}.{op_type[6:].lower()}", op_type, axes=axes,
                                keepdims=keep)
        values = result[0] if isinstance(result, tuple) else result  # max(dim) also returns the indices
        self._track_rows(values, output, value)

    def _slice(self, value: _Value, start: int, stop: int, step: int) -> str:
        """Channels [start, stop) by step (axis 1) of every row."""
        constants = [self.writer.constant(f"{value.name}.slice_{what}", np.array([number], np.int64))
                     for what, number in (("start", start), ("stop", stop), ("axis", 1), ("step", step))]
        return self._node("Slice", [value.name, *constants], f"{value.name}.channels", "ChannelSlice")

    def channel_slice(self, func, tensor, key, result, value: _Value) -> None:
        """features[:, a:b:s] or features[:, c]."""
        if not isinstance(key, tuple) or len(key) != 2 or key[0] != slice(None):
            _refuse("indexing the rows of features (other than [:, channels])")
        columns, width = key[1], int(tensor.shape[1])
        if isinstance(columns, int):
            sliced = self._slice(value, columns % width, columns % width + 1, 1)
            axis = self.writer.constant(f"{sliced}.axis", np.array([1], np.int64))
            self._track(result, _Value(self._node("Squeeze", [sliced, axis], f"{sliced}.channel", "Squeeze"),
                                       "row_view", value.coords))
            return
        if not isinstance(columns, slice):
            _refuse("choosing channels of features by a list or a tensor")
        self._track_rows(result, self._slice(value, *columns.indices(width)), value)

    def _split(self, func, args, kwargs, result):
        value = self._row_value(args[0])
        if value is None:
            self.cannot_translate(func)
        dim = int(kwargs.get("dim", args[2] if len(args) > 2 else 0)) % args[0].dim()
        if dim == 0:
            _refuse(f"{func.__name__} of the rows")
        if dim != 1:
            self.cannot_translate(func)
        start = 0
        for piece in result:
            stop = start + int(piece.shape[1])
            self._track_rows(piece, self._slice(value, start, stop, 1), value)
            start = stop
