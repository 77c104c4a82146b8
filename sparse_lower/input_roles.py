"""Which graph input of a model holds voxel features and which coordinates, and on which grid: read from
the source ops, or from what the lowering recorded (a lowered model's tables keep no grid the portable
form could give back). The frames a model runs are checked against these before onnxruntime sees them."""

from __future__ import annotations

import json

import onnx

from .onnx_conventions import GRIDS_KEY, SOURCE_DOMAIN
from .schemas import CONV_OPS, conv_geometry, to_dense_attributes


def input_roles(model: onnx.ModelProto) -> dict[str, tuple]:
    """For each graph input read by a source op, directly or through Casts and Identities (a model
    converted to float16 with keep_io_types casts its inputs first): (role, spatial shape, partner input)."""
    producer = {o: n for n in model.graph.node for o in n.output}

    def source(name: str) -> str:
        while name in producer and producer[name].op_type in ("Cast", "Identity"):
            name = producer[name].input[0]
        return name

    roles = {}
    for node in model.graph.node:
        if node.domain != SOURCE_DOMAIN or node.op_type == "ToSparse":
            continue
        if node.op_type in CONV_OPS:
            geometry = conv_geometry(node)
            grid, out_grid = geometry.spatial_shape, geometry.output_shape
        elif node.op_type == "ToDense":
            grid = out_grid = to_dense_attributes(node).spatial_shape
        else:  # the merge ops (SparseMaxPool, Coalesce) read what a conv wrote
            continue
        features, coords = source(node.input[0]), source(node.input[1])
        roles.setdefault(coords, ("coords", grid, features))
        roles.setdefault(features, ("features", grid, coords))
        if node.op_type == "SparseDeconv" and len(node.input) > 4 and node.input[4]:
            roles.setdefault(source(node.input[4]), ("coords", out_grid, None))
    return roles


def input_grids(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The grid (spatial shape) each coordinate input is read on: the source ops', or as the lowering
    recorded it ({} where neither says)."""
    recorded = next((p.value for p in model.metadata_props if p.key == GRIDS_KEY), None)
    if recorded is not None:
        return json.loads(recorded)
    inputs = {value.name for value in model.graph.input}
    return {name: list(grid) for name, (role, grid, _) in input_roles(model).items()
            if role == "coords" and name in inputs}
