"""A terse way to write the portable target's index arithmetic: `e("Add", a, b)` appends a standard
node and returns its output, `e.const(v)` is a constant shared by the whole graph. The index part is
dozens of small int64 ops per table; written through `LoweringContext.standard` one by one, their
output specs would drown what they compute."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..context import INT64, LoweringContext
from ..nna.sites import row_count

INT32 = np.int32
BOOL = np.bool_

# `to` of a Cast, by element type.
_ONNX_TYPES = {INT64: onnx.TensorProto.INT64, INT32: onnx.TensorProto.INT32, np.float32: onnx.TensorProto.FLOAT,
               BOOL: onnx.TensorProto.BOOL}


class Emit:
    """Standard nodes named under `base` (the table or layer they belong to)."""

    def __init__(self, ctx: LoweringContext, base: str):
        self.ctx = ctx
        self.base = base

    def __call__(self, op: str, *inputs: gs.Tensor, dtype=INT64, shape: list | None = None, name: str | None = None,
                 **attrs) -> gs.Variable:
        (out,) = self.ctx.standard(op, self.base, list(inputs), [(name or op[0].lower() + op[1:], dtype, shape)], attrs)
        return out

    def const(self, value, dtype=INT64) -> gs.Constant:
        """A constant of this value and type, one initializer per distinct value in the graph."""
        array = np.asarray(value, dtype)
        key = f"{np.dtype(dtype).name}_{'x'.join(map(str, array.shape))}_{'_'.join(map(str, array.ravel().tolist()))}"
        return self.ctx.shared_constant(key, array)

    def cast(self, tensor: gs.Tensor, dtype, shape: list | None = None) -> gs.Variable:
        return self("Cast", tensor, dtype=dtype, shape=shape, to=int(_ONNX_TYPES[dtype]))

    def rows(self, tensor: gs.Tensor) -> gs.Tensor:
        """The row count of `tensor` as int64 [1] (one Shape node per tensor, however many ask), through
        a Cast and a Reshape to [1]: TVM's importer reads a `Shape` as a shape, which no arithmetic op
        takes, a Cast of it as a tensor of unknown length, and the Reshape gives it its length back
        (onnxruntime drops both)."""
        (wide,) = self.ctx.shared_node("Cast", self.base, [row_count(self.ctx, tensor)], [("rows", INT64, [1])],
                                       {"to": int(_ONNX_TYPES[INT64])}, domain="")
        (count,) = self.ctx.shared_node("Reshape", self.base, [wide, self.const([1])], [("rows", INT64, [1])], {},
                                        domain="")
        return count

    def zeros(self, size: gs.Tensor, dtype) -> gs.Variable:
        """A 1-D tensor of `size` zeros, as an `Expand` of one zero rather than a `ConstantOfShape`: TVM's
        importer builds an Expand to a run-time shape, and no ConstantOfShape of one."""
        return self("Expand", self.const([0], dtype), size, dtype=dtype, shape=[None], name="zeros")

    def poison(self, invalid: gs.Tensor) -> gs.Variable:
        """float [1]: NaN where `invalid` (a frame broke a rule of sparse tensors), else 0: added to
        features, it makes a broken frame's outputs NaN in any runtime."""
        return self("Where", invalid, self.const([np.nan], np.float32), self.const([0], np.float32), dtype=np.float32,
                    shape=[1], name="poison")

    def flat(self, tensor: gs.Tensor, dtype=INT64) -> gs.Variable:
        """`tensor` as one axis, written without a −1 in a Reshape (which TVM's importer refuses where it
        cannot infer the input's shape, as after a NonZero)."""
        return self("Squeeze", self("Flatten", tensor, dtype=dtype, axis=0), self.const([0]), dtype=dtype, shape=[None],
                    name="flat")

    def gather_like(self, data: gs.Tensor, indices: gs.Tensor, dtype, shape: list | None = None,
                    name: str = "gather") -> gs.Variable:
        """`Gather(data, indices)` on axis 0 of a 1-D `data`, reshaped to the indices' shape: the same
        tensor, but TVM's importer knows its shape (it loses it when `data`'s size is computed at run
        time, as a grid's is, and then refuses the Flatten or Reshape after it)."""
        found = self("Gather", data, indices, dtype=dtype, shape=shape, name=name, axis=0)
        return self("Reshape", found, self("Shape", indices, shape=[None]), dtype=dtype, shape=shape, name=name)

    def column(self, table: gs.Tensor, index: int, length=None) -> gs.Variable:
        """Column `index` of a 2-D table, as [N]."""
        return self("Gather", table, self.const(index), shape=[length], name=f"column{index}", axis=1)

    def count_true(self, flags: gs.Tensor, axes: list[int] | None = None, shape: list | None = None) -> gs.Variable:
        """How many of `flags` are true: over all of it as [1], or over `axes`. (ReduceMax/ReduceMin take
        their axes as an attribute before opset 18 and as an input after; ReduceSum as an input since 13,
        so this one form is valid at every opset the target accepts.)"""
        as_int = self.cast(flags, INT64, shape=None)
        if axes is None:
            return self("ReduceSum", as_int, shape=[1], name="count", keepdims=1)
        return self("ReduceSum", as_int, self.const(axes), shape=shape, name="count", keepdims=0)

    def any(self, flags: gs.Tensor) -> gs.Variable:
        """bool [1]: whether any of `flags` is true (false for an empty tensor)."""
        return self("Greater", self.count_true(flags), self.const([0]), dtype=BOOL, shape=[1], name="any")

    def all_of_row(self, flags: gs.Tensor, shape: list) -> gs.Variable:
        """bool: whether every flag along the last axis is true (`shape`: the result's)."""
        wrong = self.count_true(self("Not", flags, dtype=BOOL), axes=[-1], shape=shape)
        return self("Equal", wrong, self.const(0), dtype=BOOL, shape=shape, name="all")

    def either(self, *flags: gs.Tensor | None) -> gs.Tensor | None:
        """The Or of the flags given (None: none given)."""
        given = [f for f in flags if f is not None]
        if not given:
            return None
        result = given[0]
        for flag in given[1:]:
            if flag is not result:
                result = self("Or", result, flag, dtype=BOOL, shape=[1], name="either")
        return result
