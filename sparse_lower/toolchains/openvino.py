"""OpenVINO: the segment converted to OpenVINO IR (`.xml` + `.bin`) and run by its CPU plugin in fp32.

Measured: every combine method and both layouts match onnxruntime to ~1e-7 (docs/toolchains.md); nothing
needs changing for it. With int16 activations it computes the rows layout's scatter and matmul combines
wrong, which is refused. With 8-bit activations its CPU plugin multiplies
u8 activations by s8 weights in pairs summed in 16 bits where the CPU has no VNNI (`vpmaddubsw`, which
saturates): 17-30 % off on the small models under AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2` on this machine) where
onnxruntime is 0.3-5 %. Its int8 segments therefore take 7-bit weights, whose pair sums cannot saturate:
OpenVINO then computes them as onnxruntime does on every CPU, at the cost of a bit of weight resolution
(the single SubM model: 0.53 % against 0.37 % with 8-bit weights).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from ..quantization.qdq import PartialQdq
from .base import Run, Toolchain, image_tensor
from .prepare import fed


class _OpenVinoQdq(PartialQdq):
    """onnxruntime's QDQ form, refused for int16 activations in the rows layout with the scatter or matmul
    combine: OpenVINO's numbers there are 5.5 % off on the head stack and 83 % on the patent 2-D stack,
    where the QDQ model in onnxruntime is 0.08 % and 3.0 % off (docs/toolchains.md)."""

    def refuses(self, model: onnx.ModelProto, activation_bits: int, wide: set[str]) -> tuple[str, str] | None:
        stored = {tensor.name for tensor in model.graph.initializer}
        combined_by = {node.op_type for node in model.graph.node if node.op_type == "ScatterElements"
                       or (node.op_type == "MatMul" and not stored & set(node.input))}
        if (activation_bits == 16 or wide) and combined_by and image_tensor(model) is None:
            return (f"OpenVINO computes the rows layout's {'/'.join(sorted(combined_by))} combine wrong with int16 "
                    f"activations (83 % off on the patent 2-D stack, measured)",
                    "lower with combine='gather' or layout='image', or quantize with 8-bit activations")
        return None


class OpenVino(Toolchain):
    name = "openvino"
    title = "OpenVINO"
    modules = ("openvino",)
    distribution = "openvino"
    suffix = ".xml"

    def int8_form(self) -> PartialQdq:
        return _OpenVinoQdq(seven_bit_weights=True)  # an IR may run on a CPU without VNNI (module docstring)

    def build(self, model: onnx.ModelProto, path: Path) -> None:
        import openvino as ov

        # writes path and its .bin; without compress_to_fp16=False it would store the weights in fp16
        ov.save_model(ov.convert_model(str(path.with_suffix(".onnx"))), str(path), compress_to_fp16=False)

    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        import openvino as ov

        # f32 on purpose: on CPUs with bf16 units the plugin would otherwise compute in bf16.
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        names = [value.name for value in model.graph.output]

        def run(inputs):
            results = compiled(fed(model, inputs))
            return {name: results[name] for name in names}

        return run
