"""CenterPoint's sparse 3D backbone (det3d `SpMiddleResNetFHD`), the network the NVIDIA engine ships.

Layers (BatchNorm folded into every conv, ReLU after every BN as in det3d):

    conv_input  SubM 3³ in→16                                   indice_key res0
    conv1       2 × SparseBasicBlock(16)                        res0
    conv2       SparseConv 3³ s2 p1 16→32,  2 × block(32)       res1     41×1440² → 21×720²
    conv3       SparseConv 3³ s2 p1 32→64,  2 × block(64)       res2              → 11×360²
    conv4       SparseConv 3³ s2 p(0,1,1) 64→128, 2 × block(128) res3             → 5×180²
    extra_conv  SparseConv (3,1,1) s(2,1,1) 128→128                               → 2×180²
    dense, reshape [B, 128·D, H, W]                                               → [1, 256, 180, 180]

A SparseBasicBlock is SubM → ReLU → SubM, plus the block input, → ReLU; the blocks of one resolution
share its indice_key; the strided convs have none (as in det3d). Layer names follow det3d's modules.
"""

from __future__ import annotations

import numpy as np

from ..frames.sample import CENTERPOINT_GRID
from .emitter import Emitter, Sparse
from .weights import conv_bn, input_feature_scale


def basic_block(emitter: Emitter, rng: np.random.Generator, x: Sparse, key: str, name: str) -> Sparse:
    """det3d's SparseBasicBlock: SubM 3³ → ReLU → SubM 3³, + identity, → ReLU (one indice_key)."""
    c = x.channels
    w, b = conv_bn(rng, c, c, (3,) * len(x.spatial_shape))
    y = emitter.conv(x, "subm", w, b, padding=1, indice_key=key, activation="ReLU", name=f"{name}.conv1")
    w, b = conv_bn(rng, c, c, (3,) * len(x.spatial_shape))
    y = emitter.conv(y, "subm", w, b, padding=1, indice_key=key, name=f"{name}.conv2")
    return emitter.relu(emitter.add(y, x))


def input_layer(emitter: Emitter, rng: np.random.Generator, in_channels: int, spatial_shape, batch_size: int,
                feature_scale, indice_key: str) -> Sparse:
    """The network input and `conv_input`: SubM 3³ in→16 + BN + ReLU, dividing out the input features'
    spread (`feature_scale`: one value per channel; by default nuScenes' for 5 channels, else 1)."""
    scale = input_feature_scale(in_channels, feature_scale)
    x = emitter.input(in_channels, spatial_shape, batch_size)
    w, b = conv_bn(rng, in_channels, 16, (3, 3, 3), input_scale=scale)
    return emitter.conv(x, "subm", w, b, padding=1, indice_key=indice_key, activation="ReLU", name="conv_input")


def _down(emitter, rng, x, cout, kernel, stride, padding, name):
    w, b = conv_bn(rng, x.channels, cout, kernel)
    return emitter.conv(x, "conv", w, b, stride=stride, padding=padding, activation="ReLU", name=name)


def sp_middle_resnet_fhd(emitter: Emitter, rng: np.random.Generator, in_channels: int = 5,
                         spatial_shape=CENTERPOINT_GRID, batch_size: int = 1,
                         feature_scale=None):
    """Build the backbone with `emitter`; returns `emitter.finish([bev])`, bev = [B, 128·D_out, H/8, W/8].

    `feature_scale` (one value per input channel) is the spread of the input features, which the
    first layer divides out; by default nuScenes' for 5 input channels, else 1."""
    x = input_layer(emitter, rng, in_channels, spatial_shape, batch_size, feature_scale, "res0")
    for i in range(2):
        x = basic_block(emitter, rng, x, "res0", f"conv1.{i}")
    for stage, (cout, padding) in enumerate(((32, 1), (64, 1), (128, (0, 1, 1))), start=2):
        x = _down(emitter, rng, x, cout, (3, 3, 3), 2, padding, f"conv{stage}.0")
        for i in range(2):
            x = basic_block(emitter, rng, x, f"res{stage - 1}", f"conv{stage}.{i + 3}")
    x = _down(emitter, rng, x, 128, (3, 1, 1), (2, 1, 1), 0, "extra_conv")
    bev = emitter.dense(x)
    batch, channels, depth, height, width = bev.shape
    return emitter.finish([emitter.reshape(bev, (batch, channels * depth, height, width))])
