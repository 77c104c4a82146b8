"""VoxelNeXt (CVPR 2023), the fully sparse detector: OpenPCDet's `VoxelResBackBone8xVoxelNeXt` and the
convolutions of its `VoxelNeXtHead`, with the nuScenes configuration (cbgs_voxel0075_voxelnext: 5 input
channels, grid 41×1440×1440, six heads). Nothing is densified, from the voxels to the box heads.

    conv_input  SubM 3³ 5→16                                 indice_key subm1
    conv1       2 × SparseBasicBlock(16)                     res1          41×1440²
    conv2..6    SparseConv 3³ s2 p1 → 32, 64, 128, 128, 128, each + 2 × SparseBasicBlock
                                                               21×720², 11×360², 6×180², 3×90², 2×45²
    bev_out     conv5's coords ×2 and conv6's ×4 onto conv4's grid, the three row sets concatenated,
                z dropped and the rows that share a (batch, y, x) summed          → 180×180 (sparse)
    conv_out    SparseConv2d 3² s1 p1 128→128 (it dilates the sites)
    shared_conv SubM2d 3² 128→128
    heads       per class group (car | truck, construction_vehicle | bus, trailer | barrier |
                motorcycle, bicycle | pedestrian, traffic_cone), per branch (center 2, center_z 1, dim 3,
                rot 2, vel 2, hm one per class): SubM2d 1² 128→128 + ReLU, then SubM2d 1² 128→out

BatchNorm is folded into every conv (weights.py), ReLU follows every BN as in OpenPCDet. The network
returns one sparse tensor on the shared_conv sites whose channels are every head's branches side by side,
in `HEAD_CHANNELS` order (70 channels): what OpenPCDet's heads return as one dict per head.

The merge is emitted through the emitters' optional `bev_merge` (canonical: `Mul` of coords, `Concat` of
rows, `Gather` of columns and a `Coalesce`; spconv: VoxelNeXt's own torch code, which
`sparse_lower.export` traces into the same ops) and the branches through `concat_channels`; the wild
formats have neither (no exporter of theirs writes this network).
"""

from __future__ import annotations

import numpy as np

from ..frames.sample import CENTERPOINT_GRID
from .centerpoint import basic_block, input_layer
from .emitter import Emitter, Sparse
from .weights import conv_bn, he_weight

CLASS_GROUPS = (("car",), ("truck", "construction_vehicle"), ("bus", "trailer"), ("barrier",),
                ("motorcycle", "bicycle"), ("pedestrian", "traffic_cone"))
BRANCHES = (("center", 2), ("center_z", 1), ("dim", 3), ("rot", 2), ("vel", 2))
# (head index, branch, channels) in the order of the output's channels
HEAD_CHANNELS = tuple((head, branch, channels) for head, group in enumerate(CLASS_GROUPS)
                      for branch, channels in (*BRANCHES, ("hm", len(group))))
HM_BIAS = -2.19  # OpenPCDet's init_bias of the heatmap branch


def _down(emitter, rng, x, cout, name):
    w, b = conv_bn(rng, x.channels, cout, (3,) * len(x.spatial_shape))
    return emitter.conv(x, "conv", w, b, stride=2, padding=1, activation="ReLU", name=name)


def _branch(emitter: Emitter, rng, x: Sparse, branch: str, channels: int, name: str) -> Sparse:
    """SeparateHead's branch at KERNEL_SIZE_HEAD 1: SubM 1² + BN + ReLU, then SubM 1² with its own bias."""
    w, b = conv_bn(rng, x.channels, x.channels, (1, 1))
    y = emitter.conv(x, "subm", w, b, indice_key=branch, activation="ReLU", name=f"{name}.0")
    w = he_weight(rng, x.channels, channels, (1, 1), gain=1.0)
    b = np.full(channels, HM_BIAS, np.float32) if branch == "hm" else np.zeros(channels, np.float32)
    return emitter.conv(y, "subm", w, b, indice_key=f"{branch}out", name=f"{name}.1")


def voxelnext(emitter: Emitter, rng: np.random.Generator, in_channels: int = 5, spatial_shape=CENTERPOINT_GRID,
              batch_size: int = 1, feature_scale=None):
    """Build VoxelNeXt with `emitter` (which must have `bev_merge` and `concat_channels`); returns
    `emitter.finish([heads])`, heads: the sparse [M, 70] tensor described above."""
    x = input_layer(emitter, rng, in_channels, spatial_shape, batch_size, feature_scale, "subm1")
    for i in range(2):
        x = basic_block(emitter, rng, x, "res1", f"conv1.{i}")
    levels = []
    for stage, cout in enumerate((32, 64, 128, 128, 128), start=2):
        x = _down(emitter, rng, x, cout, f"conv{stage}.0")
        for i in range(2):
            x = basic_block(emitter, rng, x, f"res{stage}", f"conv{stage}.{i + 1}")
        levels.append(x)
    bev = emitter.bev_merge([(levels[2], 1), (levels[3], 2), (levels[4], 4)])
    w, b = conv_bn(rng, bev.channels, 128, (3, 3))
    bev = emitter.conv(bev, "conv", w, b, stride=1, padding=1, activation="ReLU", name="conv_out.0")
    w, b = conv_bn(rng, 128, 128, (3, 3))
    shared = emitter.conv(bev, "subm", w, b, padding=1, activation="ReLU", name="shared_conv.0")
    branches = [_branch(emitter, rng, shared, branch, channels, f"heads_list.{head}.{branch}")
                for head, branch, channels in HEAD_CHANNELS]
    return emitter.finish([emitter.concat_channels(branches)])
