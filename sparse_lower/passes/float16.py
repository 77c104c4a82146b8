"""WidenFloat16: a source-op model converted to float16 (onnxconverter-common's float16 conversion,
with or without keep_io_types) computes in float32 from its float16 values, as an import does.

Why: the source ops are float32 throughout (docs/source_ops.md), and a lowered conv writes float32 rows;
left float16, the values the tool declared and the Casts it inserted would contradict them. The widened
model is the network the tool wrote (its weights rounded to half) computed in float32. Float16 feature
inputs alone are left as they are: the lowering casts them itself.
"""

from __future__ import annotations

import onnx

from ..errors import SparseLowerError
from ..float16 import holds_float16, to_float32


class WidenFloat16:
    """requires: any model. ensures: nothing but graph inputs is float16 (the graph inputs too, where
    something else was)."""

    name = "widen-float16"
    step = "computing a model converted to float16 in float32"

    def requires(self, model: onnx.ModelProto) -> None:
        """Any model: one without float16 passes unchanged."""

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        return to_float32(model)[0] if holds_float16(model) else model

    def ensures(self, model: onnx.ModelProto) -> None:
        if holds_float16(model):
            raise SparseLowerError("float16 values are left after widening the model to float32",
                                   fix="report this model: the widening missed a kind of float16 value")
