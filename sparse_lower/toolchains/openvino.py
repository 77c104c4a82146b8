"""OpenVINO: the segment converted to OpenVINO IR (`.xml` + `.bin`) and run by its CPU plugin in fp32.

Measured: every combine method and both layouts match onnxruntime to ~1e-7 (README: Accelerator
toolchains); nothing needs changing for it.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from .base import Run, Toolchain
from .prepare import fed


class OpenVino(Toolchain):
    name = "openvino"
    title = "OpenVINO"
    modules = ("openvino",)
    distribution = "openvino"
    suffix = ".xml"

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
