"""Apache TVM: the segment imported by Relax's ONNX frontend, compiled for `llvm` (the host CPU) into a
shared library, and run by the Relax virtual machine in fp32."""

from __future__ import annotations

from pathlib import Path

import onnx

from .base import Run, Toolchain
from .prepare import fed


class Tvm(Toolchain):
    name = "tvm"
    title = "Apache TVM"
    modules = ("tvm",)
    distribution = "apache-tvm"
    suffix = ".so"

    def build(self, model: onnx.ModelProto, path: Path) -> None:
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx

        module = from_onnx(model, keep_params_in_input=False)
        module = relax.transform.DecomposeOpsForInference()(module)
        module = relax.transform.LegalizeOps()(module)
        relax.build(module, target=tvm.target.Target("llvm")).export_library(str(path))

    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        import tvm
        from tvm import relax

        machine = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        inputs_order = [value.name for value in model.graph.input]
        names = [value.name for value in model.graph.output]

        def run(inputs):
            arrays = fed(model, inputs)
            result = machine["main"](*(tvm.runtime.tensor(arrays[name]) for name in inputs_order))
            results = [result] if len(names) == 1 else list(result)
            return {name: value.numpy() for name, value in zip(names, results)}

        return run
