"""How many active sites a model is assumed to hold per sparse input when no frame says: the one
meaning of `--active` (convert's random inputs, inspect's and partition's cost tables) and its one
default, used by the commands and by `sparse_lower.partition(...).summary()` alike.

A model lowered with a row capacity (`max_active`) holds at most that many rows at its input level,
and its nna compute always runs that many, so its capacity is what its costs are at; any other model
is assumed to hold DEFAULT_ACTIVE, few enough that random inputs verify in a moment.
"""

from __future__ import annotations

import onnx

from .model_io import recorded_options

DEFAULT_ACTIVE = 500


def recorded_capacity(model: onnx.ModelProto) -> int | None:
    """The row capacity of the model's input level (its first `max_active`) where it was lowered with one."""
    capacity = recorded_options(model).get("max_active")
    return capacity[0] if isinstance(capacity, list) else capacity


def assumed_active(model: onnx.ModelProto) -> int:
    """The active sites per sparse input to assume for `model`: its capacity, else DEFAULT_ACTIVE."""
    return recorded_capacity(model) or DEFAULT_ACTIVE
