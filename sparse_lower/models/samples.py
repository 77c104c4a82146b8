"""Sample networks."""

from __future__ import annotations

import numpy as np
import onnx

from .builder import SparseModelBuilder

CENTERPOINT_GRID = (41, 1440, 1440)


def centerpoint_head_stack(seed: int = 0, spatial_shape=CENTERPOINT_GRID) -> onnx.ModelProto:
    """The first layers of CenterPoint's sparse backbone on its 5 voxel features (x, y, z, intensity,
    time): SubM 3³ 5→16, SubM 3³ 16→16 (with ReLUs), then a strided 3³ SparseConv 16→32 (stride 2,
    pad 1)."""
    builder = SparseModelBuilder(3, 5, np.random.default_rng(seed))
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), spatial_shape).relu()
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), spatial_shape).relu()
    builder.conv("SparseConv", 32, (3, 3, 3), spatial_shape, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    return builder.build("centerpoint_head_stack")
