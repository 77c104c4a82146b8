"""Accelerator toolchains for the nna segments of a partition: OpenVINO, Apache TVM, rknn-toolkit2,
LiteRT (through onnx2tf) and Qualcomm's QNN HTP (through onnxruntime-qnn), each an optional extra
(docs/toolchains.md).

    from sparse_lower.toolchains import compile_partition
    parts = sparse_lower.partition(sparse_lower.lower(model, target="nna", max_active=20_000))
    compiled = compile_partition(parts, "openvino", "segments/")
    outputs = compiled.run({"features": features, "coords": coords})

One module per toolchain (base.py says what each provides); prepare.py changes a segment into the
form toolchains take, runner.py compiles and runs across runtimes. int8 segments are made in
sparse_lower.quantization, in the form each toolchain names (`Toolchain.int8_form`).
"""

from .base import Toolchain
from .registry import TOOLCHAINS, toolchain
from .runner import CompiledPartition, compile_partition

__all__ = ["TOOLCHAINS", "CompiledPartition", "Toolchain", "compile_partition", "toolchain"]
