"""The toolchains by name."""

from __future__ import annotations

from ..errors import SparseLowerError
from .base import Toolchain
from .litert import LiteRt
from .onnx_runtime import OnnxRuntime
from .openvino import OpenVino
from .qnn import Qnn
from .rknn import Rknn
from .tvm import Tvm

TOOLCHAINS: dict[str, type[Toolchain]] = {
    "onnxruntime": OnnxRuntime, "openvino": OpenVino, "tvm": Tvm, "rknn": Rknn, "tflite": LiteRt,
    "qnn": Qnn}


def toolchain(name: str) -> Toolchain:
    if name not in TOOLCHAINS:
        raise SparseLowerError(f"unknown toolchain '{name}'", fix=f"use one of {', '.join(TOOLCHAINS)}")
    return TOOLCHAINS[name]()
