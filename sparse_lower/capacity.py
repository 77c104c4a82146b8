"""How many rows each level of a model holds on real frames: the `max_active` the nna lowering needs.

A fixed capacity must hold the most active sites any frame brings to a layer, and the levels of a
backbone differ several-fold (the CenterPoint frame: 79,745 input voxels, far fewer after each strided
conv). Guessing one number for all makes every deep layer as large as the input; guessing per level
risks a run-time refusal. This measures them: the model runs on the gpu target (any row count) with
every conv's output coords exposed, and the largest row count of each level is kept.
"""

from __future__ import annotations

import os

import onnx

from .api import lower
from .errors import SparseLowerError
from .model_io import exposing, load
from .onnx_conventions import SOURCE_DOMAIN
from .runtime import create_session
from .schemas import CONV_OPS, coords_levels


def level_rows(model: onnx.ModelProto | str | os.PathLike, frames: list[dict]) -> list[int]:
    """The most active sites at each level (0: the model's input sites; schemas.coords_levels) over
    `frames` (feeds by input name): `lower(model, "nna", max_active=level_rows(model, frames))` runs
    every one of them."""
    model = load(model)
    levels = coords_levels(model.graph)
    convs = [n for n in model.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS]
    if not convs:
        raise SparseLowerError("the levels are those of the model's sparse convs, and it has none (a lowered model, "
                               "or one not imported yet)", fix="give the model before lowering, imported if foreign")
    watched = list(dict.fromkeys([*(n.input[1] for n in convs), *(n.output[1] for n in convs)]))
    session = create_session(lower(exposing(model, watched, onnx.TensorProto.INT64), target="gpu"))
    rows = [0] * (1 + max([0, *levels.values()]))
    for feeds in frames:
        for name, value in zip(watched, session.run(watched, feeds)):
            level = levels.get(name, 0)
            rows[level] = max(rows[level], len(value))
    return rows
