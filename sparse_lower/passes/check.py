"""CheckModel: the model is valid ONNX, shape inference runs through it, and the lowered custom ops'
outputs carry their types. The pass manager runs it after every pass in tests."""

from __future__ import annotations

import onnx

from ..errors import SparseLowerError
from ..onnx_conventions import CUSTOM_DOMAIN


def check_model(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise SparseLowerError(f"the model is not valid ONNX: {error}") from error
    typed = {v.name for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
             if v.type.tensor_type.elem_type}
    typed |= {t.name for t in inferred.graph.initializer}
    for node in inferred.graph.node:
        if node.domain == CUSTOM_DOMAIN:
            missing = [o for o in node.output if o and o not in typed]
            if missing:
                raise SparseLowerError(f"custom-op outputs {missing} have no type", node.name)


class CheckModel:
    """requires: nothing. ensures: `check_model` passes."""

    name = "check"
    step = "checking the lowered model"

    def requires(self, model: onnx.ModelProto) -> None:
        """Any model."""

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        check_model(model)
        return model

    def ensures(self, model: onnx.ModelProto) -> None:
        """Checking changes nothing."""
