"""The interface the reference networks are written against, once, for every form they are built in.

A network (centerpoint.py, unet.py, patent2d.py) is a function of an `Emitter` and a NumPy random
generator: it draws its weights from the generator in a fixed order, in spconv 2.x layout, and calls
the emitter for every layer. Each emitter turns the same calls into one form:

* `CanonicalEmitter` (canonical.py): source ops + standard ONNX ops (docs/source_ops.md);
* `NvidiaEmitter` / `AimetEmitter` (formats.py): the sparse-conv ONNX found in the wild, as NVIDIA's
  and AIMET's exporters write it, for testing the importers;
* `SpconvEmitter` (tests, needs torch + spconv): real spconv modules with the same weights, the oracle.

So the four forms of a network hold the same weights and topology by construction.

Conventions, spconv's (docs/formats.md):
* weights are `[Cout, *kernel, Cin]` (KRSC), float32; bias `[Cout]` or None;
* kernel, stride, padding, dilation, output_padding are per spatial dimension (ints are broadcast);
  padding is symmetric;
* `kind` is "subm" (SubMConv: centred, ignores padding, output coords = input coords), "conv"
  (SparseConv), "deconv" (SparseConvTranspose: output extent (S − 1)·s − 2p + k + output_padding,
  dilation ignored) or "inverse" (SparseInverseConv: output coords and extent are those of the input of
  the forward conv registered under the same `indice_key`);
* `activation` is None, "ReLU", "LeakyReLU" or "Sigmoid", applied after the bias (the NVIDIA export
  fuses it into the conv); LeakyReLU has slope 0.01 (torch.nn.LeakyReLU's default; no format carries
  it; `spconv_rules.LEAKY_RELU_ALPHA`);
* coords are `(batch, d0, d1, d2)` with the spatial order of `spatial_shape` (zyx for LiDAR);
* `indice_key`: submanifold convs of one geometry on the same rows may share a key; a strided or
  transposed conv owns its key, which an inverse conv names (layers.ConvPlanner checks this).

Optional: `dense_input(channels, spatial_shape, batch_size) -> Sparse`, the network input as a dense
[B, C, *S] tensor, active where any channel is non-zero (the source ops' ToSparse, spconv's
`SparseConvTensor.from_dense`). CanonicalEmitter has it; the wild formats cannot (their engines take
voxels), so only networks built with `dense_io=True` (patent2d.py) call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..spconv_rules import matmul_memory, runs_as_matmul


@dataclass(frozen=True)
class Sparse:
    """A sparse tensor inside an emitter: an opaque handle plus what every emitter must track."""

    handle: object
    channels: int
    spatial_shape: tuple[int, ...]


@dataclass(frozen=True)
class Dense:
    """A dense tensor (after `dense`), with its shape."""

    handle: object
    shape: tuple[int, ...]


class Emitter(Protocol):
    def input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        """The network's sparse input (features [N, channels], coords [N, 1 + D])."""

    def conv(self, x: Sparse, kind: str, weight: np.ndarray, bias: np.ndarray | None, *, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None,
             name: str | None = None) -> Sparse:
        """One sparse convolution (kernel and channels read off `weight`)."""

    def relu(self, x: Sparse) -> Sparse: ...

    def add(self, a: Sparse, b: Sparse) -> Sparse:
        """Element-wise sum of two sparse tensors on the same coords (a residual connection)."""

    def dense(self, x: Sparse) -> Dense:
        """The dense [B, C, *spatial_shape] tensor (spconv's `.dense()`, NVIDIA's ScatterDense)."""

    def reshape(self, x: Dense, shape: Sequence[int]) -> Dense: ...

    def transpose(self, x: Dense, perm: Sequence[int]) -> Dense:
        """A permutation of the dense tensor's axes (torch's `permute`)."""

    def finish(self, outputs: Sequence[Sparse | Dense]) -> object:
        """The built network (an onnx.ModelProto, or a torch module for spconv)."""


def spconv_output_shape(kind: str, spatial_shape, kernel, stride, padding, dilation, output_padding):
    """The output extent spconv gives each kind of conv (for "inverse" the caller knows it)."""
    if kind == "subm":
        return tuple(spatial_shape)
    if kind == "conv":
        return tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                     for s, k, st, p, d in zip(spatial_shape, kernel, stride, padding, dilation))
    if kind == "deconv":
        return tuple((s - 1) * st - 2 * p + k + op
                     for s, k, st, p, op in zip(spatial_shape, kernel, stride, padding, output_padding))
    raise ValueError(f"spconv_output_shape has no rule for kind '{kind}'")


def per_dim(value, ndim: int) -> tuple[int, ...]:
    """An int or a sequence as one int per spatial dimension."""
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple, np.ndarray)) else (int(value),) * ndim


def spconv_weight_memory(weight: np.ndarray, kind: str, stride) -> np.ndarray:
    """What a spconv module's `weight` must hold for it to compute `weight` ([Cout, *K, Cin]).

    The same array, except for the 1×1 fast path: spconv reads that memory as `view(Cin, Cout)`, a
    reinterpretation rather than a transpose, so a trained module's (and its export's) 1×1 weights
    are the transposed matrix stored in the [Cout, *K, Cin] shape.
    """
    return matmul_memory(weight) if runs_as_matmul(kind, weight.shape[1:-1], stride) else weight
