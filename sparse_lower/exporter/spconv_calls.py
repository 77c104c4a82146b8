"""spconv's calls as source ops while torch.onnx traces a module (exporter/trace.py).

torch's own exporter writes everything a module computes with torch; what it cannot see into are the
sparse engine's calls. For the duration of an export (`engine_calls`), those are replaced:

* `SparseConvolution.forward` (every SubMConv, SparseConv, SparseConvTranspose and SparseInverseConv,
  1-D to 4-D): spconv computes the convolution, untraced, without its fused add and activation; an
  `autograd.Function` hands spconv's result to the trace, and its `symbolic` writes the source op
  (`SubmanifoldConv`, `SparseConv` or `SparseDeconv`, spconv_modules.py says which, with spconv's
  weights in the source layout as constants). The add of `forward(x, add_input)` and the fused
  activation are then applied with torch, so torch.onnx writes them (Add, Relu, LeakyRelu, Sigmoid);
* `SparseMaxPool.forward`: the `SparseMaxPool` source op, then `Relu` (spconv's pooling kernels
  start their maximum from 0, which is the Relu of the true maximum);
* `SparseConvTensor.dense()`: `ToDense` (then a Transpose where `channels_first=False`);
* `SparseConvTensor(...)` given a grid computed from the frame (a `spatial_shape` tensor, as
  mmdetection3d's MinkUNet writes `coors.max(0)[0][1:] + 1`): the grid stays a traced tensor; every
  layer's extent is computed from it in the graph (spconv's formulas, in torch), the source ops are
  written on a bound of it (`max_spatial_shape`, or traced_calls.default_bound) and each strided layer's rows
  outside the frame's own extent are dropped in the graph, as spconv drops them (docs/formats.md);
* `SparseConvTensor(features, indices, spatial_shape, …)` on indices that no spconv call wrote (the
  merged sites of a `torch.unique`) marks them with their declared grid (`Grid` in the export's own
  domain), which cleanup.py uses as the `Coalesce` bound and then removes.

Coordinates enter the source ops as int64 (a Cast the trace records) and leave them as spconv's int32;
cleanup.py removes each Cast pair that cancels. Average and global pooling are refused, naming
the module and its call.

`spconv_inference` runs an spconv module for inference, with the workarounds its CPU kernels need.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
from cumm import tensorview as tv
from spconv.pytorch import SparseConvTensor
from spconv.pytorch import conv as spconv_conv
from spconv.pytorch import pool as spconv_pool

from ..errors import SparseLowerError
from ..spconv_rules import inverse_output_padding
from .spconv_modules import conv_node, fused_activation
from .traced_calls import (EXPORT_DOMAIN, NAME_ATTRIBUTE, Call, TracedCalls, call_site, constant, replaced_methods,
                           untraced)


@contextlib.contextmanager
def spconv_inference(module):
    """Run an spconv `module` for inference inside the block: eval mode, no gradients, one thread.

    Two workarounds for spconv 2.3.8's CPU kernels: they return wrong sums with more than one torch
    thread, and they refuse a bias at inference ("cpu don't support act and bias"); convolutions with
    a bias therefore run in training mode, where spconv adds the bias after the kernel, which under
    no_grad gives the inference result. Modes and the thread count are restored afterwards.
    """
    modes = [(m, m.training) for m in module.modules()]
    threads = torch.get_num_threads()
    module.eval()
    for m in module.modules():
        if isinstance(m, spconv_conv.SparseConvolution) and m.bias is not None and not m.weight.is_cuda:
            m.train()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)
        for m, training in modes:
            m.training = training


# ---------------------------------------------------------------------------------------------------
# The replaced calls


@dataclass
class EngineCalls(TracedCalls):
    """The state of one spconv export: besides TracedCalls', the coordinate tensors engine calls wrote or
    marked (kept alive, so that ids stay unique) and, for a grid computed from the frame, each coordinate
    tensor's traced extent with the static bound its source ops are written on."""

    known: dict = field(default_factory=dict)  # id -> a coordinate tensor written by an engine call or marked
    grids: dict = field(default_factory=dict)  # id(indices) -> (traced extent, bound) of a frame-computed grid

    def remember(self, indices, grid=None):
        self.known[id(indices)] = indices
        if grid is not None:
            self.grids[id(indices)] = grid
        return indices

    def _output(self, real, features, coords, grid):
        """spconv's output `real` with the traced features and coords (built untraced: its indices are the
        engine's until replaced)."""
        with untraced():
            out = real.replace_feature(features)
        out.indices = self.remember(coords, grid)
        return out

    # ----- convolutions

    def conv(self, original, module, x, add_input=None):
        name = self.name(module)
        act = module.act_type
        module.act_type = tv.gemm.Activation.None_  # the activation is applied with torch, below
        try:
            with untraced():
                real = original(module, x)
        finally:
            module.act_type = act
        activation = fused_activation(module, add_input, name)
        node = conv_node(module, x, real, name)
        attrs = dict(node.attrs, **{NAME_ATTRIBUTE: name})
        grid = self.grids.get(id(x.indices))
        out_grid = None if grid is None else self._out_grid(node, module, x, grid)
        inputs = [x.features, x.indices, constant(node.weight), constant(node.bias)]
        coords_inputs = (1,)
        if node.coords == "target":
            target = x.find_indice_pair(module.indice_key).indices
            inputs.append(target)
            coords_inputs = (1, 4)
        if grid is not None:
            attrs["spatial_shape"] = grid[1]
            if node.coords == "target":  # back to the bound of the forward conv's input
                attrs["output_padding"] = inverse_output_padding(out_grid[1], *(node.attrs[k] for k in (
                    "kernel_shape", "strides")), node.attrs["pads"][:len(out_grid[1])], node.attrs["dilations"])
        call = Call(node.op_type, attrs, (real.features, real.indices),
                     ((None, int(real.features.shape[1])), (None, x.indices.shape[1])), coords_inputs)
        features, coords = self.apply(call, *inputs)
        if node.coords == "input":
            coords = x.indices
        elif node.coords == "target":
            coords = target
        if node.coords == "new":
            features, coords = _within(features, coords, out_grid)
        out = self._output(real, features, coords, out_grid)
        if add_input is not None:
            out = out.replace_feature(out.features + add_input.features)
        if activation is not None:
            op_type, options = activation
            functions = {"Relu": torch.relu, "Sigmoid": torch.sigmoid,
                         "LeakyRelu": lambda f: torch.nn.functional.leaky_relu(f, options["alpha"])}
            out = out.replace_feature(functions[op_type](out.features))
        return out

    def max_pool(self, original, module, x):
        name = self.name(module)
        with untraced():
            real = original(module, x)
        attrs = {"kernel_shape": [int(k) for k in module.kernel_size], "strides": [int(s) for s in module.stride],
                 "pads": [int(p) for p in module.padding] * 2, "dilations": [int(d) for d in module.dilation],
                 "spatial_shape": [int(s) for s in x.spatial_shape], NAME_ATTRIBUTE: name}
        if module.subm:
            attrs["submanifold"] = 1
        grid = self.grids.get(id(x.indices))
        out_grid = None
        if grid is not None:
            attrs["spatial_shape"] = grid[1]
            out_grid = grid if module.subm else _strided_grid(grid, module)
        results = (_in_order_of(real, x.indices) if module.subm else real.features, real.indices)
        call = Call("SparseMaxPool", attrs, results, ((None, int(real.features.shape[1])), (None, x.indices.shape[1])))
        features, coords = self.apply(call, x.features, x.indices)
        if module.subm:
            coords = x.indices
        else:
            features, coords = _within(features, coords, out_grid)
        return self._output(real, torch.relu(features), coords, out_grid)

    def refuse_pool(self, original, module, *args, **kwargs):
        raise SparseLowerError(f"{type(module).__name__} cannot be exported yet (called at {call_site()})",
                               self.name(module), fix="use SparseMaxPool or a strided SparseConv instead")

    def _out_grid(self, node, module, x, grid):
        """A conv's output (traced extent, bound) on the frame-computed input `grid`."""
        if node.coords == "input":
            return grid
        if node.coords == "target":
            forward = self.grids.get(id(x.find_indice_pair(module.indice_key).indices))
            if forward is None:
                raise SparseLowerError("an inverse conv returns to a grid the export does not know", self.name(module),
                                       fix="give the forward conv's input the grid computed from the frame")
            return forward
        if node.op_type == "SparseDeconv":
            kernel, stride, pads, dilation, extra = (node.attrs[k] for k in (
                "kernel_shape", "strides", "pads", "dilations", "output_padding"))
            ndim = len(kernel)

            def extent(s, i):
                return (s - 1) * stride[i] + extra[i] + dilation[i] * (kernel[i] - 1) + 1 - pads[i] - pads[ndim + i]

            return (torch.stack([extent(grid[0][i], i) for i in range(ndim)]),
                    [int(extent(b, i)) for i, b in enumerate(grid[1])])
        return _strided_grid(grid, module)

    # ----- tensors

    def construct(self, original, tensor, features, indices, spatial_shape, batch_size, *args, **kwargs):
        """A SparseConvTensor: its grid traced where the frame computes it, its indices marked with their
        declared grid where no engine call wrote them."""
        tracing = torch._C._get_tracing_state() is not None
        grid = None
        if tracing and isinstance(spatial_shape, torch.Tensor):
            with untraced():
                example = [int(v) for v in spatial_shape]
            grid = (spatial_shape, self.bound(example))
            spatial_shape = example
        if tracing and isinstance(indices, torch.Tensor) and id(indices) not in self.known:
            call = Call("Grid", {"spatial_shape": [int(s) for s in spatial_shape]}, (indices,),
                         ((None, indices.shape[1]),), coords_inputs=(), coords_outputs=(), domain=EXPORT_DOMAIN)
            indices = self.apply(call, indices)
        if tracing and isinstance(indices, torch.Tensor):
            self.remember(indices, grid or self.grids.get(id(indices)))
        original(tensor, features, indices, spatial_shape, batch_size, *args, **kwargs)

    def dense(self, original, x, channels_first: bool = True):
        if id(x.indices) in self.grids:
            raise SparseLowerError(f".dense() (at {call_site()}) of a tensor whose grid is computed from the frame: "
                                   "its shape would change from frame to frame",
                                   fix="give the SparseConvTensor a fixed spatial_shape before .dense()")
        with untraced():
            real = original(x, True)
        shape = [int(s) for s in x.spatial_shape]
        call = Call("ToDense", {"spatial_shape": shape, "batch_size": int(x.batch_size)}, (real,),
                     (tuple(real.shape),), coords_outputs=())
        result = self.apply(call, x.features, x.indices)
        if not channels_first:
            result = result.permute(0, *range(2, len(shape) + 2), 1)
        return result


def _in_order_of(real, indices) -> torch.Tensor:
    """The features of spconv's output `real` in the row order of `indices` (the same sites): spconv's
    submanifold pooling returns its sites in its own order, the source op in its input's."""
    have, want = real.indices.numpy().astype(np.int64), indices.detach().numpy().astype(np.int64)
    order_have, order_want = np.lexsort(have.T[::-1]), np.lexsort(want.T[::-1])
    if not np.array_equal(have[order_have], want[order_want]):
        raise SparseLowerError("spconv's submanifold pooling returned other sites than its input's",
                               fix="report it, with the spconv version")
    position = np.empty(len(want), np.int64)
    position[order_want] = order_have
    return real.features[torch.from_numpy(position)]


def _within(features, coords, grid):
    """The rows of a layer that makes new sites inside the frame's own extent (spconv drops those outside
    it): both selected by one mask, traced; unchanged on a static grid (None)."""
    if grid is None:
        return features, coords
    keep = (coords[:, 1:] < grid[0].to(coords.dtype)).all(dim=1)
    return features[keep], coords[keep]


def _strided_grid(grid, module):
    """A strided layer's output (traced extent, bound) by spconv's formula, per dimension:
    floor((S + 2p − d(K − 1) − 1) / s) + 1."""
    k, s, p, d = (np.array(list(v)) for v in (module.kernel_size, module.stride, module.padding, module.dilation))
    extent, bound = grid
    constants = [torch.tensor(v, dtype=extent.dtype) for v in (k, s, p, d)]
    traced = torch.div(extent + 2 * constants[2] - constants[3] * (constants[0] - 1) - 1, constants[1],
                       rounding_mode="floor") + 1
    return traced, [int(v) for v in (np.array(bound) + 2 * p - d * (k - 1) - 1) // s + 1]


@contextlib.contextmanager
def engine_calls(module, max_spatial_shape=None):
    """Inside: spconv's calls replaced as the module docstring says; yields the export's EngineCalls."""
    calls = EngineCalls({id(m): name or type(module).__name__ for name, m in module.named_modules()},
                        max_spatial_shape=max_spatial_shape)
    replaced = [(spconv_conv.SparseConvolution, "forward", calls.conv),
                (spconv_pool.SparseMaxPool, "forward", calls.max_pool),
                (spconv_pool.SparseAvgPool, "forward", calls.refuse_pool),
                (spconv_pool.SparseGlobalMaxOrAvgPool, "forward", calls.refuse_pool),
                (SparseConvTensor, "__init__", calls.construct),
                (SparseConvTensor, "dense", calls.dense)]
    with replaced_methods(replaced):
        yield calls
