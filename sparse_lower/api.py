"""The public compiler entry point, `lower` (DESIGN.md §7)."""

from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

from .errors import SparseLowerError
from .passes.check import CheckModel, check_model
from .passes.lower_gpu import LowerToGpu
from .passes.manager import PassManager
from .passes.validate import ValidateSourceOps

TARGETS = ("gpu", "nna", "hybrid")
COMBINES = ("gather", "scatter", "matmul")


def load(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """A ModelProto from a ModelProto or a path."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(os.fspath(model))
    except (OSError, DecodeError) as error:
        raise SparseLowerError(f"cannot read the model '{model}': {error}") from error


def lower(model: onnx.ModelProto | str | os.PathLike, target: str = "gpu", *, strategy: str = "auto",
          combine: str = "gather", max_active: int | None = None, dump_dir: str | os.PathLike | None = None,
          check_each_pass: bool = False) -> onnx.ModelProto:
    """Rewrite the sparse-convolution nodes of `model` for `target`.

    target "gpu": index-builder custom ops → IndexedUnfold → MatMul (→ IndexedFold), run with
    `create_session`. `strategy` picks the gpu compute form ("auto", "unfold", "rulebook").
    `combine` and `max_active` are the nna part's options (DESIGN.md §7); they are validated here and
    have no effect on the gpu target. `dump_dir` receives the model after every pass;
    `check_each_pass` runs the ONNX checker and shape inference after every pass (the tests do).
    """
    if target not in TARGETS:
        raise SparseLowerError(f"unknown target '{target}'", fix=f"use one of {', '.join(TARGETS)}")
    if combine not in COMBINES:
        raise SparseLowerError(f"unknown combine method '{combine}'", fix=f"use one of {', '.join(COMBINES)}")
    if max_active is not None and (not isinstance(max_active, int) or max_active < 1):
        raise SparseLowerError(f"max_active={max_active!r} is not a positive int", fix="give None or an int >= 1")
    if target != "gpu":
        raise SparseLowerError(f"target '{target}' is not implemented yet", fix="use target='gpu'")
    passes = [ValidateSourceOps(), LowerToGpu(strategy), CheckModel()]
    manager = PassManager(passes, verify=check_model if check_each_pass else None, dump_dir=dump_dir)
    return manager.run(load(model))
