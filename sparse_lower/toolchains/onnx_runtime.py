"""onnxruntime itself as the accelerator's runtime (CPU execution provider): the baseline every other
toolchain is compared with, and the runtime of the int8 QDQ segments as onnxruntime executes them.
The artifact is the segment's ONNX file."""

from __future__ import annotations

from pathlib import Path

import onnx

from ..runtime import create_session
from .base import Run, Toolchain
from .prepare import fed


class OnnxRuntime(Toolchain):
    name = "onnxruntime"
    title = "onnxruntime"
    modules = ("onnxruntime",)
    distribution = "onnxruntime"
    suffix = ".onnx"

    def missing(self) -> str | None:
        return None  # a dependency of sparse_lower itself

    def build(self, model: onnx.ModelProto, path: Path) -> None:
        """Nothing to do: the prepared segment is already at `path`."""

    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        session = create_session(str(path))
        names = [value.name for value in model.graph.output]
        return lambda inputs: dict(zip(names, session.run(names, fed(model, inputs))))
