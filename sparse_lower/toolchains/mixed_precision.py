"""Deprecated: the mixed-precision search moved to sparse_lower.quantization (this name goes in the next
release). `chain=` becomes `form=chain.int8_form()`."""

from __future__ import annotations

import warnings

from ..quantization.mixed_precision import Plan, QuantizedRuns as _QuantizedRuns, choose_wide_layers as _choose

warnings.warn("sparse_lower.toolchains.mixed_precision is deprecated: use sparse_lower.quantization "
              "(choose_wide_layers(..., form=toolchain.int8_form()))", DeprecationWarning, stacklevel=2)

__all__ = ["Plan", "QuantizedRuns", "choose_wide_layers"]


def QuantizedRuns(parts, frames, chain=None):  # noqa: N802 (the class name it stands for)
    return _QuantizedRuns(parts, frames, chain.int8_form() if chain is not None else None)


def choose_wide_layers(parts, calibration, limit=None, log=lambda line: None, chain=None):
    return _choose(parts, calibration, limit, log, chain.int8_form() if chain is not None else None)
