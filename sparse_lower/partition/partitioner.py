"""`partition(model, …) -> Partition`: assign every node to a device and cut the graph into segments
(docs/partitioning.md), standing on the device predicates (devices.py) and the graph alone.

What the caller knows of how the graph was made (sparse_lower.partition passes the lowering's cost
table) comes in as `layer_table`, which the result's summary appends unread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import onnx

from ..errors import SparseLowerError
from ..model_io import load
from .devices import Predicate, device_table
from .result import LayerTable, Partition
from .segments import NodeGraph, assign, cut
from .value_types import ValueTypes

DEFAULT_DEVICES = ("nna", "gpu", "cpu")


def partition(model: onnx.ModelProto | str | os.PathLike, devices: Sequence[str] = DEFAULT_DEVICES,
              support: Mapping[str, Predicate] | None = None, static_shapes: bool = True,
              layer_table: LayerTable | None = None) -> Partition:
    """Assign every node of `model` to the first of `devices` that can run it and cut the graph into
    segments that run in order (segments.py says how).

    `support` maps device names to predicates (devices.py) that replace the built-in table of that
    device or add a device. `static_shapes=False` lets the nna take symbolic shapes. `layer_table`
    (active sites -> text or None) is appended to the summary (Partition.summary).
    """
    model = load(model)
    devices = tuple(devices)
    predicates = {**device_table(static_shapes), **(support or {})}
    if not devices or len(set(devices)) != len(devices):
        raise SparseLowerError(f"devices {list(devices)} must be a non-empty list of distinct names",
                               fix="name each device once, the preferred first, e.g. nna,gpu,cpu")
    unknown = [device for device in devices if device not in predicates]
    if unknown:
        raise SparseLowerError(f"unknown devices {unknown}",
                               fix=f"use {', '.join(sorted(predicates))} (a device of your own needs its predicate: "
                                   "sparse_lower.partition(..., support={name: predicate}))")
    graph = NodeGraph(model)
    types = ValueTypes.of(model)
    by_index, reasons = assign(graph, types, devices, predicates)
    segments = cut(graph, by_index)
    assignment = {graph.names[i]: device for i, device in sorted(by_index.items())}
    return Partition(model, graph, types, segments, reasons, assignment, devices, static_shapes, layer_table)
