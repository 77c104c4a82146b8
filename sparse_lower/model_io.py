"""Reading models: the one place that turns a path into a ModelProto, for every layer of the package."""

from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

from .errors import SparseLowerError


def load(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """A ModelProto from a ModelProto or a path."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(os.fspath(model))
    except (OSError, DecodeError) as error:
        raise SparseLowerError(f"cannot read the model '{model}': {error}") from error
