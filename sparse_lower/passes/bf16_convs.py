"""Bf16Convs: every `IndexedConv` computes at precision "bfloat16": its input rows and weights rounded to
bfloat16, their products summed in float32 (docs/custom_ops.md).

Why an attribute rather than a new op or bfloat16 tensors: the model's tensors stay float32, so its
inputs, outputs and every other op are unchanged, and the conv rounds its operands where its products
are formed: on AMX tiles (tdpbf16ps) where the CPU has them, on tensor cores in CUDA, and elsewhere by
the float32 kernel on the rounded values (the same products, summed in another order). Outputs stay
within 1e-2 of float32 (tests/test_custom_ops.py, the real frames in tests/test_bf16.py).
"""

from __future__ import annotations

import onnx

from ..errors import SparseLowerError
from ..onnx_conventions import CUSTOM_DOMAIN

PRECISIONS = ("float32", "bf16")  # lower(precision=...): "bf16" runs this pass


def _convs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "IndexedConv" and n.domain == CUSTOM_DOMAIN]


class Bf16Convs:
    """requires: the model holds an IndexedConv (the gpu target's fused form). ensures: every IndexedConv
    has precision "bfloat16"."""

    name = "bf16-convs"
    step = "setting the convs' precision to bfloat16"

    def requires(self, model: onnx.ModelProto) -> None:
        if not _convs(model):
            raise SparseLowerError("precision bf16 sets the precision of the gpu target's fused convs "
                                   "(IndexedConv), and the model has none",
                                   fix="lower for target 'gpu' with strategy 'auto' or 'fused'")

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        for node in _convs(model):
            kept = [a for a in node.attribute if a.name != "precision"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("precision", "bfloat16")])
        return model

    def ensures(self, model: onnx.ModelProto) -> None:
        for node in _convs(model):
            if onnx.helper.get_node_attr_value(node, "precision") != b"bfloat16":
                raise SparseLowerError("a conv was left at float32", node.name)
