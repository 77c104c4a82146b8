"""A sparse segmentation UNet (the shape of SECOND / MinkUNet-style LiDAR segmentation heads).

    stem      SubM 3³ in→base                                  indice_key subm0
    level l   SparseConv 3³ s2 p1 C(l−1)→C(l)   key down{l},  SubM 3³ C(l)→C(l)   key subm{l}
    up l      SparseInverseConv 3³ C(l)→C(l−1)  key down{l},  + encoder features of level l−1,
              SubM 3³ C(l−1)→C(l−1)                                                key subm{l−1}
    head      SubM 3³ base→classes (no activation)

with C(l) = base·2^l, BatchNorm folded and ReLU after every conv but the head's. Each inverse conv
reuses the rulebook of the down conv with its key, so its outputs sit exactly on that conv's input
rows, which is what makes the skip add well defined. The output is sparse (per-voxel class scores on
the input rows); on the 41×1440×1440 grid the extents go 41→21→11→6 and 1440→720→360→180, so the
up path exercises odd and even inverse output paddings.
"""

from __future__ import annotations

import numpy as np

from ..frames.sample import CENTERPOINT_GRID
from .emitter import Emitter
from .weights import conv_bn, he_weight, input_feature_scale


def sparse_unet(emitter: Emitter, rng: np.random.Generator, in_channels: int = 5, spatial_shape=CENTERPOINT_GRID,
                base: int = 16, batch_size: int = 1, levels: int = 3, classes: int = 16, feature_scale=None):
    """Build the UNet with `emitter`; returns `emitter.finish([scores])` (sparse, `classes` channels on the
    input rows). `feature_scale` as in `centerpoint.sp_middle_resnet_fhd`; 16 classes as nuScenes-lidarseg."""
    kernel = (3,) * len(spatial_shape)

    def conv(x, kind, cout, key, name, **geometry):
        w, b = conv_bn(rng, x.channels, cout, kernel)
        return emitter.conv(x, kind, w, b, indice_key=key, activation="ReLU", name=name, **geometry)

    x = emitter.input(in_channels, spatial_shape, batch_size)
    w, b = conv_bn(rng, in_channels, base, kernel, input_scale=input_feature_scale(in_channels, feature_scale))
    x = emitter.conv(x, "subm", w, b, padding=1, indice_key="subm0", activation="ReLU", name="stem")
    skips = []
    for level in range(1, levels + 1):
        skips.append(x)
        x = conv(x, "conv", base << level, f"down{level}", f"down{level}", stride=2, padding=1)
        x = conv(x, "subm", base << level, f"subm{level}", f"enc{level}", padding=1)
    for level in range(levels, 0, -1):
        x = conv(x, "inverse", base << (level - 1), f"down{level}", f"up{level}")
        x = emitter.add(x, skips[level - 1])
        x = conv(x, "subm", base << (level - 1), f"subm{level - 1}", f"dec{level - 1}", padding=1)
    head = he_weight(rng, base, classes, kernel, gain=1.0)
    scores = emitter.conv(x, "subm", head, rng.normal(0.0, 0.1, classes).astype(np.float32), padding=1,
                          indice_key="subm0", name="head")
    return emitter.finish([scores])
