"""TorchSparse 1.4's calls as source ops while torch.onnx traces a module (exporter/trace.py).

TorchSparse 1.4 (the version mmdetection3d installs) keeps a sparse tensor's coordinates as a tensor,
`(x, y, z, batch)` at the input's scale (a level-2 site is at even coordinates), and computes its kernel
maps in C++. For the duration of an export (`engine_calls`) `Conv3d.forward` is replaced: TorchSparse
computes the convolution, untraced, and an `autograd.Function` hands its result to the trace while its
`symbolic` writes the source op on the coordinates in the source ops' form (`(batch, x, y, z)` divided by
the tensor stride, traced from TorchSparse's own):

* a 1 × 1 × 1 convolution of stride 1 is TorchSparse's own matmul, which torch.onnx writes;
* stride 1, odd kernel: `SubmanifoldConv` (TorchSparse's outputs are its input rows, in their order);
* strided, every stride 1 or the kernel size: `SparseConv` under the floor rule (`output_sites="floor"`,
  docs/source_ops.md#the-floor-rule), TorchSparse's offsets `[−⌊K/2⌋ + 1, ⌊K/2⌋]`;
* strided otherwise (an odd kernel): `SparseConv` under spconv's rule, on a grid holding every site a
  row reaches, then the rows below the frame's smallest coordinate dropped, as TorchSparse drops them;
* `transposed=True`: `SparseDeconv` onto the finer level's coordinates (TorchSparse's `cmaps`) as
  `target_coords`.

TorchSparse's coordinates are signed (its users quantize metric points around the sensor, `floor(xyz /
voxel)`): the source ops read them less the frame's origin (traced_calls.frame_origin, computed in the graph
from the first coordinates a convolution reads, a multiple of the deepest tensor stride of an eager run),
which keeps TorchSparse's sites and row order at every level, and the module's coordinates get it back.

Weights are TorchSparse's `(K, Cin, Cout)`, the taps in x-fastest order for a kernel of odd volume and
z-fastest (the source ops' order) for an even one; they are re-laid out. Everything on features
(`spnn.BatchNorm`, `spnn.ReLU`, `torchsparse.cat`, `+`) is torch. Refused, naming the module and its line:
a dilation other than 1 (TorchSparse 1.4 ignores it in its kernel maps), a stride-1 convolution of an even
kernel, and an even kernel whose stride is neither 1 nor its size. Refused, naming the function and its
line: the point-voxel functions (`sphash`, `sphashquery`, `spcount`, `spvoxelize`, `spdevoxelize`, and
`calc_ti_weights` on their results), which TorchSparse computes in C++ out of the trace's sight, so that a
model would hold their results on the example as constants (SPVCNN's point branch calls them).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import numpy as np
import torch
import torchsparse
import torchsparse.backend
import torchsparse.nn as spnn
import torchsparse.nn.functional as spnn_functional

from ..errors import SparseLowerError
from .traced_calls import (NAME_ATTRIBUTE, Call, TracedCalls, call_site, constant, deepest_strides,
                           frame_origin, inference, onto_grid, replaced_methods, untraced)

torchsparse_inference = inference  # TorchSparse's CPU kernels need nothing more

_OURS = [3, 0, 1, 2]  # TorchSparse's (x, y, z, batch) columns as (batch, x, y, z)
_THEIRS = [1, 2, 3, 0]

# TorchSparse's C++ functions that the point-voxel functions call, by the function its users call.
_POINT_VOXEL = {"hash": "sphash", "kernel_hash": "sphash", "hash_query": "sphashquery", "count": "spcount",
                "voxelize_forward": "spvoxelize", "devoxelize_forward": "spdevoxelize"}


def _begins(kernel) -> list[int]:
    """TorchSparse's offsets start at −⌊K/2⌋ + 1: the begin pad of each dimension."""
    return [k // 2 - (1 - k % 2) for k in kernel]


def _weight(module, transposed: bool) -> np.ndarray:
    """TorchSparse's `(K, Cin, Cout)` kernel in the source ops' layout ([Cout, Cin, *K], or [Cin, Cout, *K]
    transposed): its taps run x fastest for a kernel of odd volume, z fastest for an even one."""
    kernel = list(module.kernel_size)
    weight = module.kernel.detach().numpy()
    cin, cout = weight.shape[-2], weight.shape[-1]
    if int(np.prod(kernel)) % 2:
        taps = weight.reshape(*kernel[::-1], cin, cout).transpose(2, 1, 0, 3, 4)
    else:
        taps = weight.reshape(*kernel, cin, cout)
    return np.ascontiguousarray(taps.transpose(3, 4, 0, 1, 2) if transposed else taps.transpose(4, 3, 0, 1, 2))


@dataclass
class EngineCalls(TracedCalls):
    """The state of one TorchSparse export: besides TracedCalls', the grid of each coordinates tensor met
    (kept alive, so that ids stay unique), the step of the frame's origin and the origin itself."""

    grids: dict = field(default_factory=dict)  # id(coords) -> (coords, grid)
    deepest: list | None = None  # per dimension, a multiple of every tensor stride the module reaches
    origin: torch.Tensor | None = None  # traced [4]: (the frame's origin, 0) in TorchSparse's (x, y, z, batch)

    def level(self, coords, stride):
        """TorchSparse's coordinates as the source ops read them: (batch, x, y, z) less the frame's origin,
        divided by the stride. The first coordinates read set the origin."""
        if self.origin is None:
            spatial = frame_origin(coords[:, :3], self.deepest or [1, 1, 1])
            self.origin = torch.cat([spatial, torch.zeros(1, dtype=torch.int64)])
        ours = (coords - self.origin.to(coords.dtype))[:, _OURS]
        if any(s != 1 for s in stride):
            ours = torch.div(ours, torch.tensor([1, *stride], dtype=ours.dtype), rounding_mode="floor")
        return ours

    def theirs(self, coords, stride):
        """The source ops' coordinates as TorchSparse holds them: (x, y, z, batch), times the stride, plus the
        frame's origin."""
        theirs = coords[:, _THEIRS]
        if any(s != 1 for s in stride):
            theirs = theirs * torch.tensor([*stride, 1], dtype=theirs.dtype)
        return theirs + self.origin.to(theirs.dtype)

    def grid(self, coords, stride) -> list:
        known = self.grids.get(id(coords))
        if known is not None:
            return known[1]
        with untraced():
            example = [int(v) + 1 for v in self.level(coords, stride)[:, 1:].max(0).values] \
                if len(coords) else [1, 1, 1]
        grid = self.bound(example)
        self.grids[id(coords)] = (coords, grid)
        return grid

    def conv(self, original, module, x):
        name = self.name(module)
        kernel, stride = list(module.kernel_size), list(module.stride)
        if kernel == [1, 1, 1] and stride == [1, 1, 1] and module.dilation == 1:
            return original(module, x)  # a matmul of the features, in torch
        if module.dilation != 1:
            raise SparseLowerError(f"Conv3d of dilation {module.dilation} (at {call_site()}): TorchSparse 1.4 ignores "
                                   "the dilation in its kernel maps", name, fix="use dilation 1")
        even = any(k % 2 == 0 for k in kernel)
        floor = all(s in (1, k) for s, k in zip(stride, kernel))
        if even and (all(s == 1 for s in stride) or not floor):
            raise SparseLowerError(f"Conv3d of kernel {kernel} and stride {stride} (at {call_site()}) cannot be "
                                   "exported yet", name, fix="use an odd kernel, or a stride equal to the kernel")
        before = set(x.cmaps)
        self.level(x.coords, x.stride)  # the frame's origin, traced from the first coordinates read
        with untraced():
            real = original(module, x)
        in_stride, out_stride = list(x.stride), list(real.stride)
        grid = self.grid(x.coords, in_stride)
        begins = _begins(kernel)
        attrs = {"kernel_shape": kernel, "strides": stride, "spatial_shape": grid, NAME_ATTRIBUTE: name}
        bias = torch.zeros(module.out_channels) if module.bias is None else module.bias.detach()
        inputs = [x.feats, self.level(x.coords, in_stride), constant(_weight(module, module.transposed)), bias]
        coords_inputs, keep = (1,), None
        if module.transposed:
            targets = x.cmaps[tuple(out_stride)]
            fine = self.grid(targets, out_stride)
            op_type = "SparseDeconv"
            attrs.update(onto_grid(grid, fine, kernel, stride, [1, 1, 1], begins))
            inputs.append(self.level(targets, out_stride))
            coords_inputs = (1, 4)
        elif all(s == 1 for s in stride):
            op_type = "SubmanifoldConv"
        elif floor:
            op_type = "SparseConv"
            attrs.update(pads=begins + [0, 0, 0], output_sites="floor")
        else:  # every site some row reaches, above the frame's smallest coordinate; the grid holds them all
            op_type = "SparseConv"
            attrs["pads"] = begins + [k - 1 for k in kernel]
            keep = self.level(x.coords, in_stride)[:, 1:].min(0).values
        with untraced():
            real_coords = self.level(real.coords, out_stride)
        call = Call(op_type, attrs, (real.feats, real_coords), ((None, int(real.feats.shape[1])), (None, 4)),
                    coords_inputs)
        features, coords = self.apply(call, *inputs)
        if keep is not None:
            inside = (coords[:, 1:] * torch.tensor(stride, dtype=coords.dtype) >= keep).all(dim=1)
            features, coords = features[inside], coords[inside]
        if module.transposed:
            theirs = targets
        elif op_type == "SubmanifoldConv":
            theirs = x.coords
        elif tuple(out_stride) in before:  # a level made before: the same sites, in the same (sorted) order
            theirs = x.cmaps[tuple(out_stride)]
        else:
            theirs = self.theirs(coords, out_stride)
            x.cmaps[tuple(out_stride)] = theirs  # the traced coordinates, for the transposed convs back
            extent = [-(-g // s) for g, s in zip(grid, stride)] if floor else \
                [(g + b - 1) // s + 1 for g, b, s in zip(grid, begins, stride)]  # pads (pb, K − 1)
            self.grids[id(theirs)] = (theirs, extent)
        output = torchsparse.SparseTensor(features, theirs, tuple(out_stride))
        output.cmaps, output.kmaps = x.cmaps, x.kmaps
        return output


    def point_voxel(self, original, *args, name):
        """A point-voxel function while the module is traced: refused (TorchSparse computes it in C++, and
        the trace would fix its result at the example's); outside the trace (the convolutions' own kernel
        maps, computed untraced), TorchSparse's."""
        if torch._C._get_tracing_state() is None:
            return original(*args)
        raise SparseLowerError(f"torchsparse.nn.functional.{name} (called at {call_site()}) cannot be exported yet: "
                               "TorchSparse computes it out of the trace's sight, and the model would hold its "
                               "result on the example", fix="voxelize the points before the exported module and "
                               "export it from a SparseTensor (the voxel branch), devoxelizing after it")


def torchsparse_deepest_strides(run) -> dict:
    """frame_origin's step: the least common multiple of the strides of every SparseTensor of an eager run."""
    return deepest_strides(run, torchsparse.SparseTensor, lambda tensor: tensor.stride)


@contextlib.contextmanager
def engine_calls(module, max_spatial_shape=None, deepest=None):
    """Inside: TorchSparse's Conv3d and point-voxel functions replaced as the module docstring says; yields
    the export's EngineCalls. `deepest`: torchsparse_deepest_strides' step of the origin."""
    calls = EngineCalls({id(m): name or type(module).__name__ for name, m in module.named_modules()},
                        max_spatial_shape=max_spatial_shape, deepest=deepest)
    backend = [(torchsparse.backend, f"{function}_{device}", functools.partial(calls.point_voxel, name=name))
               for function, name in _POINT_VOXEL.items() for device in ("cpu", "cuda")
               if hasattr(torchsparse.backend, f"{function}_{device}")]
    weights = (spnn_functional, "calc_ti_weights", functools.partial(calls.point_voxel, name="calc_ti_weights"))
    with replaced_methods([(spnn.Conv3d, "forward", calls.conv), *backend, weights]):
        yield calls
