"""`SpconvEmitter`: the reference networks built from real spconv modules, the oracle of the other forms.

It implements `sparse_lower.models.emitter.Emitter` with spconv 2.3.8's own modules, holding the
weights the network draws (eval mode, no gradients). `finish` returns a `SpconvNetwork`: call it on
`(features, coords)` to get the outputs as NumPy, sparse ones as `(features, coords)` pairs; its
`module` is an ordinary `torch.nn.Module` taking a `SparseConvTensor`, which `sparse_lower.export`
can trace. Needs torch and spconv (the `spconv` extra).
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import numpy as np
import spconv.pytorch as spconv
import torch
from spconv.pytorch.conv import SparseConvolution

from ..exporter.spconv_calls import spconv_inference
from ..spconv_rules import LEAKY_RELU_ALPHA, runs_as_matmul
from .emitter import Dense, Sparse, per_dim, spconv_output_shape, spconv_weight_memory

_ACTIVATIONS = {
    "ReLU": torch.relu,
    "LeakyReLU": partial(torch.nn.functional.leaky_relu, negative_slope=LEAKY_RELU_ALPHA),
    "Sigmoid": torch.sigmoid,
}


class ReplayModule(torch.nn.Module):
    """The network as a module: `forward(x: SparseConvTensor)` replays the recorded steps and returns
    the outputs (SparseConvTensor or dense torch.Tensor) as a tuple."""

    def __init__(self, convs: dict, steps: list, outputs: list[int]):
        super().__init__()
        self.convs = torch.nn.ModuleDict(convs)
        self.steps = steps
        self.output_ids = outputs

    def forward(self, x):
        values = {0: x}
        for op, out, inputs, arg in self.steps:
            if op == "conv":
                y = self.convs[arg[0]](values[inputs[0]])
                values[out] = y if arg[1] is None else y.replace_feature(_ACTIVATIONS[arg[1]](y.features))
            elif op == "relu":
                values[out] = values[inputs[0]].replace_feature(torch.relu(values[inputs[0]].features))
            elif op == "add":
                values[out] = values[inputs[0]] + values[inputs[1]]  # SparseConvTensor.__add__
            elif op == "bev_merge":
                values[out] = _bev_merge([values[i] for i in inputs], arg)
            elif op == "concat":
                parts = [values[i] for i in inputs]
                values[out] = parts[0].replace_feature(torch.cat([p.features for p in parts], dim=1))
            elif op == "dense":
                values[out] = values[inputs[0]].dense()
            elif op == "reshape":
                values[out] = values[inputs[0]].reshape(arg)
            elif op == "transpose":
                values[out] = values[inputs[0]].permute(*arg)
        return tuple(values[i] for i in self.output_ids)


def _bev_merge(parts: list, factors: tuple) -> spconv.SparseConvTensor:
    """VoxelNeXt's own code (OpenPCDet's VoxelResBackBone8xVoxelNeXt.forward and bev_out): the deeper
    levels' indices scaled in place, every level's rows concatenated, z dropped and coinciding sites
    summed by torch.unique + index_add_."""
    for x, factor in zip(parts, factors):
        if factor != 1:
            x.indices[:, 1:] *= factor
    first = parts[0]
    features = torch.cat([x.features for x in parts])
    indices = torch.cat([x.indices for x in parts])
    unique, inverse = torch.unique(indices[:, [0, *range(2, indices.shape[1])]], dim=0, return_inverse=True)
    merged = features.new_zeros((unique.shape[0], features.shape[1]))
    merged.index_add_(0, inverse, features)
    return spconv.SparseConvTensor(merged, unique, first.spatial_shape[1:], first.batch_size)


class SpconvNetwork:
    """The built network: `network(features, coords)` runs it single-threaded and returns a list of
    NumPy outputs, `(features, coords int64)` for a sparse output."""

    def __init__(self, module: ReplayModule, spatial_shape: tuple, batch_size: int):
        self.module = module
        self.spatial_shape = spatial_shape
        self.batch_size = batch_size

    def sparse_tensor(self, features: np.ndarray, coords: np.ndarray) -> spconv.SparseConvTensor:
        return spconv.SparseConvTensor(torch.from_numpy(np.ascontiguousarray(features, np.float32)),
                                       torch.from_numpy(np.ascontiguousarray(coords, np.int32)),
                                       list(self.spatial_shape), self.batch_size)

    def __call__(self, features: np.ndarray, coords: np.ndarray) -> list:
        with spconv_inference(self.module):
            results = self.module(self.sparse_tensor(features, coords))
        return [(r.features.numpy(), r.indices.numpy().astype(np.int64)) if isinstance(r, spconv.SparseConvTensor)
                else r.numpy() for r in results]


class SpconvEmitter:
    """Emitter (sparse_lower.models.emitter) building spconv modules.

    `weight_dtype` rounds the weights and biases through that type first: np.float16 gives the numbers
    a format with float16 initializers (NVIDIA's) holds, so that its import can be held to float32
    accuracy."""

    def __init__(self, weight_dtype=np.float32):
        self.weight_dtype = weight_dtype
        self.convs: dict[str, SparseConvolution] = {}
        self.steps: list = []
        self.forward_extents: dict[str, tuple] = {}  # indice_key of a SparseConv -> its input extent
        self.batch_size = 1
        self.input_shape: tuple = ()
        self._next = 0

    def _id(self) -> int:
        self._next += 1
        return self._next

    def input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        self.input_shape, self.batch_size = tuple(int(s) for s in spatial_shape), int(batch_size)
        return Sparse(0, channels, self.input_shape)

    def conv(self, x: Sparse, kind: str, weight: np.ndarray, bias: np.ndarray | None, *, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None,
             name: str | None = None) -> Sparse:
        ndim = len(x.spatial_shape)
        cout, *kernel, cin = weight.shape
        kernel = tuple(kernel)
        stride, padding, dilation, output_padding = (per_dim(v, ndim) for v in (stride, padding, dilation,
                                                                               output_padding))
        if kind == "inverse":
            module = getattr(spconv, f"SparseInverseConv{ndim}d")(cin, cout, kernel, indice_key=indice_key,
                                                                   bias=bias is not None)
            out_shape = self.forward_extents[indice_key]
        else:
            # SparseConvolution itself: the named SparseConvTransposeNd classes take no output_padding
            module = SparseConvolution(ndim, cin, cout, kernel, stride, padding, dilation, bias=bias is not None,
                                       subm=kind == "subm", transposed=kind == "deconv",
                                       output_padding=output_padding, indice_key=indice_key)
            out_shape = spconv_output_shape(kind, x.spatial_shape, kernel, stride, padding, dilation, output_padding)
            if kind == "conv" and indice_key is not None:
                self.forward_extents[indice_key] = x.spatial_shape
        if activation is not None and activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'")
        value, bias = (None if v is None else np.asarray(v, self.weight_dtype).astype(np.float32)
                       for v in (weight, bias))
        value = spconv_weight_memory(value, kind, stride)  # spconv's 1x1 fast path reads view(Cin, Cout)
        assert runs_as_matmul(kind, value.shape[1:-1], stride) == module.conv1x1
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(value))
            if bias is not None:
                module.bias.copy_(torch.from_numpy(bias))
        key = (name or f"conv{len(self.convs)}").replace(".", "_")  # a ModuleDict key has no dots
        if key in self.convs:
            key = f"{key}_{len(self.convs)}"
        self.convs[key] = module
        out = self._id()
        self.steps.append(("conv", out, (x.handle,), (key, activation)))
        return Sparse(out, cout, tuple(out_shape))

    def relu(self, x: Sparse) -> Sparse:
        out = self._id()
        self.steps.append(("relu", out, (x.handle,), None))
        return Sparse(out, x.channels, x.spatial_shape)

    def add(self, a: Sparse, b: Sparse) -> Sparse:
        out = self._id()
        self.steps.append(("add", out, (a.handle, b.handle), None))
        return Sparse(out, a.channels, a.spatial_shape)

    def bev_merge(self, parts: Sequence[tuple[Sparse, int]]) -> Sparse:
        """VoxelNeXt's bev_out over several levels (canonical.py says what)."""
        out = self._id()
        self.steps.append(("bev_merge", out, tuple(x.handle for x, _ in parts), tuple(f for _, f in parts)))
        first = parts[0][0]
        return Sparse(out, first.channels, tuple(first.spatial_shape[1:]))

    def concat_channels(self, parts: Sequence[Sparse]) -> Sparse:
        out = self._id()
        self.steps.append(("concat", out, tuple(x.handle for x in parts), None))
        return Sparse(out, sum(x.channels for x in parts), parts[0].spatial_shape)

    def dense(self, x: Sparse) -> Dense:
        out = self._id()
        self.steps.append(("dense", out, (x.handle,), None))
        return Dense(out, (self.batch_size, x.channels, *x.spatial_shape))

    def reshape(self, x: Dense, shape: Sequence[int]) -> Dense:
        out = self._id()
        shape = tuple(int(s) for s in shape)
        self.steps.append(("reshape", out, (x.handle,), shape))
        known = int(np.prod([s for s in shape if s != -1]))
        return Dense(out, tuple(int(np.prod(x.shape)) // known if s == -1 else s for s in shape))

    def transpose(self, x: Dense, perm: Sequence[int]) -> Dense:
        out = self._id()
        perm = tuple(int(p) for p in perm)
        self.steps.append(("transpose", out, (x.handle,), perm))
        return Dense(out, tuple(x.shape[p] for p in perm))

    def finish(self, outputs: Sequence[Sparse | Dense]) -> SpconvNetwork:
        module = ReplayModule(self.convs, self.steps, [o.handle for o in outputs])
        return SpconvNetwork(module, self.input_shape, self.batch_size)
