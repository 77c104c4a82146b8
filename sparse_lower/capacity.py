"""How many rows each level of a model holds on real frames: the `max_active` the nna lowering needs.

A fixed capacity must hold the most active sites any frame brings to a layer, and the levels of a
backbone differ several-fold (the CenterPoint frame: 79,745 input voxels, far fewer after each strided
conv). Guessing one number for all makes every deep layer as large as the input; guessing per level
risks a run-time refusal. This measures them: the model runs on the gpu target (any row count) with
every conv's output coords exposed, and the largest row count of each level is kept.

The pairs combine needs one more measure: how many (input, output) pairs each tap of each conv has,
which `pair_rows` counts on the same exposed coords with the reference's definition of the pairs. A
Coalesce under a capacity needs another: the most rows one of its sites merges (`most_members`).
"""

from __future__ import annotations

import os

import numpy as np
import onnx

from .api import lower
from .errors import SparseLowerError
from .frames.files import feeds_given
from .model_io import exposing, load
from .onnx_conventions import SOURCE_DOMAIN
from .reference import conv_pairs
from .runtime import create_session
from .schemas import CONV_OPS, MERGE_OPS, coords_levels


def sparse_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The sparse convs of the model, and its SparseMaxPool and Coalesce nodes (which make new levels too)."""
    nodes = [n for n in model.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS + MERGE_OPS]
    if not nodes:
        raise SparseLowerError("the levels are those of the model's sparse convs, and it has none (a lowered model, "
                               "or one not imported yet)", fix="give the model before lowering, imported if foreign")
    return nodes


def coords_runs(model: onnx.ModelProto, nodes: list[onnx.NodeProto], frames: list[dict]):
    """Per frame, every coords tensor the sparse nodes read or write, by name (the model run on the gpu
    target)."""
    watched = list(dict.fromkeys([*(n.input[1] for n in nodes), *(n.output[1] for n in nodes),
                                  *(n.input[4] for n in nodes if len(n.input) > 4 and n.input[4])]))
    session = create_session(lower(exposing(model, watched, onnx.TensorProto.INT64), target="gpu"))
    for feeds in frames:
        yield dict(zip(watched, session.run(watched, feeds)))


def level_rows(model: onnx.ModelProto | str | os.PathLike, frames: list[dict]) -> list[int]:
    """The most active sites at each level (0: the model's input sites; schemas.coords_levels) over
    `frames` (feeds by input name): `lower(model, "nna", max_active=level_rows(model, frames))` runs
    every one of them."""
    return _measured(model, frames, pairs=False)[0]


def pair_rows(model: onnx.ModelProto | str | os.PathLike, frames: list[dict]) -> dict[str, list[int]]:
    """The most pairs each kernel tap of each sparse conv has over `frames`, by conv name:
    `lower(model, "nna", combine="pairs", max_active=level_rows(...), max_pairs=pair_rows(...))` runs
    every one of them with no more products than they need. Convs without a name are left out (they
    hold every row per tap)."""
    return _measured(model, frames, pairs=True)[1]


def most_members(model: onnx.ModelProto | str | os.PathLike, frames: list[dict]) -> int | None:
    """The most rows any site of any Coalesce of the model merges over `frames` (None: it has no Coalesce):
    the `max_members` of `lower(..., max_active=level_rows(...), max_members=...)`."""
    model = load(model)
    frames = feeds_given(model, frames)
    merges = [n for n in sparse_nodes(model) if n.op_type == "Coalesce"]
    if not merges:
        return None
    most = 1
    for coords in coords_runs(model, merges, frames):
        for node in merges:
            rows = coords[node.input[1]]
            if len(rows):
                most = max(most, int(np.unique(rows, axis=0, return_counts=True)[1].max()))
    return most


def level_and_pair_rows(model: onnx.ModelProto | str | os.PathLike,
                        frames: list[dict]) -> tuple[list[int], dict[str, list[int]]]:
    """`level_rows` and `pair_rows` from one run of the model over the frames, for callers that need both."""
    return _measured(model, frames, pairs=True)


def _measured(model, frames: list[dict], pairs: bool) -> tuple[list[int], dict[str, list[int]]]:
    """The most rows per level and, with `pairs`, the most pairs per tap of every named conv."""
    model = load(model)
    frames = feeds_given(model, frames)
    nodes = sparse_nodes(model)
    levels = coords_levels(model.graph)
    rows = [0] * (1 + max([0, *levels.values()]))
    most: dict[str, list[int]] = {}
    for coords in coords_runs(model, nodes, frames):
        for name, value in coords.items():
            level = levels.get(name, 0)
            rows[level] = max(rows[level], len(value))
        if pairs:
            for name, counts in _pair_counts([n for n in nodes if n.name and n.op_type in CONV_OPS], coords).items():
                most[name] = [max(a, b) for a, b in zip(most.get(name, counts), counts)]
    return rows, most


def _pair_counts(convs: list[onnx.NodeProto], coords: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Per conv, the pairs of each tap on one frame's coords (the reference's pairs)."""
    counted = {}  # layers with the same coords and attributes have the same pairs
    found = {}
    for node in convs:
        targets = coords[node.input[4]] if len(node.input) > 4 and node.input[4] else None
        key = (node.op_type, node.input[1], node.input[4] if targets is not None else "",
               tuple(a.SerializeToString() for a in node.attribute))
        if key not in counted:
            pairs, _ = conv_pairs(node, coords[node.input[1]], targets)
            counted[key] = [len(rows) for _, rows, _ in pairs]
        found[node.name] = counted[key]
    return found
