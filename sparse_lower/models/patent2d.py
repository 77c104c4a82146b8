"""The patent's 2D examples: submanifold convolutions on a sparse image.

* `patent_example`: its worked example, a 4×4 one-channel image with three active pixels p1 (1, 1),
  p2 (1, 2), p3 (2, 2) and one 3×3 submanifold conv with the weights w1..w9 in row-major tap order
  (no bias), so every output is a hand-checkable sum of partial outputs.
* `patent_2d_stack`: a stack of 3×3 submanifold convs (ReLU between them) on a sparse image, by
  default the patent's 128 → 256 channels on a 100×100 image.

Dense input and output (the patent's "input tensor in dense format") do not fit the sparse-only
Emitter protocol, because the formats in the wild have no dense input (their engines take voxels). So
`dense_io=True` asks the emitter for an optional `dense_input(channels, spatial_shape, batch_size)`
(CanonicalEmitter has it: a graph input `X` [B, C, H, W] through ToSparse, active where any channel is
non-zero, as spconv's `SparseConvTensor.from_dense`), and ends with `emitter.dense` (ToDense). With
`dense_io=False` the same layers take and return a sparse tensor, which every emitter can build.
"""

from __future__ import annotations

import numpy as np

from .emitter import Emitter, Sparse
from .weights import he_weight

PATENT_GRID = (4, 4)
PATENT_SITES = np.array([[0, 1, 1], [0, 1, 2], [0, 2, 2]], np.int64)  # (batch, row, column) of p1, p2, p3


def _input(emitter: Emitter, channels: int, spatial_shape, batch_size: int, dense_io: bool) -> Sparse:
    if not dense_io:
        return emitter.input(channels, spatial_shape, batch_size)
    if not hasattr(emitter, "dense_input"):
        raise ValueError(f"{type(emitter).__name__} has no dense input; build with dense_io=False")
    return emitter.dense_input(channels, spatial_shape, batch_size)


def _finish(emitter: Emitter, x: Sparse, dense_io: bool):
    return emitter.finish([emitter.dense(x) if dense_io else x])


def patent_example(emitter: Emitter, dense_io: bool = False):
    """The worked example (module docstring); its sparse input is `PATENT_SITES` with one feature each."""
    x = _input(emitter, 1, PATENT_GRID, 1, dense_io)
    weight = np.arange(1, 10, dtype=np.float32).reshape(1, 3, 3, 1)  # [Cout, 3, 3, Cin]: w1..w9
    x = emitter.conv(x, "subm", weight, None, indice_key="patent", name="patent")
    return _finish(emitter, x, dense_io)


def patent_2d_stack(emitter: Emitter, rng: np.random.Generator, in_channels: int = 128, channels=(256,),
                    spatial_shape=(100, 100), batch_size: int = 1, dense_io: bool = True, bias: bool = False):
    """SubM 3×3 in_channels → channels[0] → channels[1] …, ReLU between layers (not after the last),
    all on one indice_key; dense input and output when `dense_io` (see the module docstring)."""
    x = _input(emitter, in_channels, spatial_shape, batch_size, dense_io)
    for index, cout in enumerate(channels):
        last = index == len(channels) - 1
        weight = he_weight(rng, x.channels, cout, (3, 3), gain=1.0 if last else 2.0)
        b = rng.normal(0.0, 0.1, cout).astype(np.float32) if bias else None
        x = emitter.conv(x, "subm", weight, b, indice_key="subm", activation=None if last else "ReLU",
                         name=f"subm{index}")
    return _finish(emitter, x, dense_io)
