"""Trained-looking weights for the reference networks: a He-scaled conv with a BatchNorm folded in.

The networks draw every layer from here so that the four forms of a network (emitter.py) hold the same
numbers, and so that outputs stay O(1) through a deep stack (comparisons at 1e-3 mean nothing on
outputs that explode or vanish). The He scale uses the full kernel as fan-in although a sparse conv
sees only its active taps (about a third of a 3³ kernel on a LiDAR scan, so each conv shrinks the
signal); the residual adds make up for it. Measured on the CenterPoint frame, every ReLU output of
`sp_middle_resnet_fhd` has an rms between 0.2 and 1.2 (tests/test_models.py checks the final one).
The BatchNorm statistics are drawn so that the fold scales each channel by a factor near 1
(gamma/sqrt(var + eps) within [0.6, 1.6]) and shifts it slightly, as a trained BN does.
"""

from __future__ import annotations

import numpy as np

BN_EPS = 1e-3  # det3d's BatchNorm1d(eps=1e-3)
# Per-channel spread of nuScenes voxel features (x, y, z in metres, intensity 0–255, time in s), which
# a trained first layer absorbs; measured on the shared frames, rounded.
NUSCENES_FEATURE_SCALE = (10.0, 10.0, 1.5, 20.0, 0.15)


def input_feature_scale(in_channels: int, feature_scale=None) -> np.ndarray:
    """The first layer's per-channel input spread (one value per input channel): by default nuScenes' for 5
    input channels, else 1."""
    if feature_scale is None:
        feature_scale = NUSCENES_FEATURE_SCALE if in_channels == len(NUSCENES_FEATURE_SCALE) else (1.0,) * in_channels
    if len(feature_scale) != in_channels:
        raise ValueError(f"feature_scale has {len(feature_scale)} values for {in_channels} input channels")
    return np.asarray(feature_scale, np.float32)


def he_weight(rng: np.random.Generator, cin: int, cout: int, kernel, gain: float = 2.0) -> np.ndarray:
    """[Cout, *kernel, Cin] float32 with variance gain / (cin · kernel volume)."""
    kernel = tuple(kernel)
    std = np.sqrt(gain / (cin * np.prod(kernel)))
    return (rng.standard_normal((cout, *kernel, cin)) * std).astype(np.float32)


def fold_batch_norm(rng: np.random.Generator, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draw BN parameters (gamma, beta, running mean, running var) and fold them into a bias-free conv:
    W' = W · gamma / sqrt(var + eps), b' = beta − mean · gamma / sqrt(var + eps)."""
    cout = weight.shape[0]
    gamma = rng.uniform(0.8, 1.2, cout)
    beta = rng.normal(0.0, 0.1, cout)
    mean = rng.normal(0.0, 0.1, cout)
    var = rng.uniform(0.6, 1.6, cout)
    scale = gamma / np.sqrt(var + BN_EPS)
    folded = weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))
    return folded.astype(np.float32), (beta - mean * scale).astype(np.float32)


def conv_bn(rng: np.random.Generator, cin: int, cout: int, kernel,
            input_scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A conv + BN pair folded into (weight [Cout, *kernel, Cin], bias [Cout]).

    `input_scale` (per input channel) divides the weights of each input channel, as a trained first
    layer does for raw inputs of very different magnitudes (metres, intensity 0–255, seconds)."""
    weight = he_weight(rng, cin, cout, kernel)
    if input_scale is not None:
        weight = weight / np.asarray(input_scale, np.float32)
    return fold_batch_norm(rng, weight)
