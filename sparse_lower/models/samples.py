"""Sample networks."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from ..frames.sample import CENTERPOINT_GRID
from .builder import SparseModelBuilder
from .canonical import CanonicalEmitter
from .patent2d import patent_2d_stack


def centerpoint_head_stack(seed: int = 0, spatial_shape=CENTERPOINT_GRID) -> onnx.ModelProto:
    """The first layers of CenterPoint's sparse backbone on its 5 voxel features (x, y, z, intensity,
    time): SubM 3³ 5→16, SubM 3³ 16→16 (with ReLUs), then a strided 3³ SparseConv 16→32 (stride 2,
    pad 1)."""
    builder = SparseModelBuilder(3, 5, np.random.default_rng(seed))
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), spatial_shape).relu()
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), spatial_shape).relu()
    builder.conv("SparseConv", 32, (3, 3, 3), spatial_shape, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    return builder.build("centerpoint_head_stack")


class SmallNetwork(NamedTuple):
    name: str
    model: onnx.ModelProto
    active: int  # the active sites it is run at
    capacity: int  # a max_active that every layer's rows fit at those sites


def small_networks() -> list[SmallNetwork]:
    """One network per layer kind, the patent's 2-D stack and the head stack: the models the toolchains
    are measured on (tools/toolchain_table.py) and tested with."""
    rng = np.random.default_rng(3)
    single = SparseModelBuilder(3, 4, rng).conv("SubmanifoldConv", 16, (3, 3, 3), (10, 12, 14)).build()
    strided = (SparseModelBuilder(3, 4, rng)
               .conv("SparseConv", 16, (3, 3, 3), (10, 12, 14), strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]).build())
    transposed = SparseModelBuilder(3, 4, rng).conv("SparseDeconv", 16, (2, 2, 2), (5, 6, 7), strides=[2, 2, 2]).build()
    patent = patent_2d_stack(CanonicalEmitter(), rng, in_channels=8, channels=(16, 16), spatial_shape=(40, 40),
                             dense_io=False)
    return [SmallNetwork("single SubM", single, 300, 1700), SmallNetwork("strided", strided, 300, 1700),
            SmallNetwork("transposed", transposed, 150, 1300), SmallNetwork("patent 2D stack", patent, 300, 400),
            SmallNetwork("head stack", centerpoint_head_stack(spatial_shape=(10, 40, 40)), 150, 1200)]
