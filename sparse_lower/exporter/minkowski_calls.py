"""MinkowskiEngine's calls as source ops while torch.onnx traces a module (exporter/trace.py).

MinkowskiEngine keeps a sparse tensor's coordinates in its coordinate manager, out of torch's sight, and
computes every kernel map in C++. For the duration of an export (`engine_calls`) each coordinate map key
the module meets is given a traced coordinates tensor in the graph, at its own level (MinkowskiEngine's
coordinates less the frame's origin, divided by the key's tensor stride, so that a level-2 site at (4, 6)
is (2, 3)), on a grid (`max_spatial_shape`, or traced_calls.default_bound, divided by the stride, rounded
up). MinkowskiEngine's coordinates are signed (users quantize metric points around the sensor,
`floor(xyz / voxel)`), the source ops' start at 0: the origin, computed in the graph from each frame, is
per dimension the largest multiple of the deepest tensor stride at or below both 0 and the frame's
smallest coordinate (traced_calls.frame_origin; the strides come from an eager run of the module,
`deepest_strides`), so every level keeps MinkowskiEngine's sites, and the module's coordinates get it back.
Then:

* `SparseTensor(features, coordinates)` gives the key of the input its traced coordinates and keeps the
  features as given (MinkowskiEngine gathers the rows it keeps by an index that the trace would fix to
  the example's); rows that repeat a site, which MinkowskiEngine merges, are refused;
* `MinkowskiConvolution`: a stride-1 convolution of an odd kernel is a `SubmanifoldConv` (outputs on the
  input rows, in their order, as MinkowskiEngine's share the input's key); a strided one is a
  `SparseConv` under the floor rule (`output_sites="floor"`: outputs at the distinct floor(c / s),
  offsets centred for odd kernels and [0, K) for even ones, docs/source_ops.md#the-floor-rule);
* `MinkowskiConvolutionTranspose` returns to the key of the finer level, which the module made on its
  way down: a `SparseDeconv` with that level's coordinates as `target_coords`;
* `MinkowskiMaxPooling`: `SparseMaxPool` under the same rules;
* global max, sum and average pooling: `Coalesce` of the rows onto (batch, 0, …), by maximum or sum (the
  average: the sum over a `Coalesce` of ones), one row per batch;
* `MinkowskiInstanceNorm`: each batch's mean and variance in torch (`index_add_` by the batch column, which
  the export writes as a ScatterElements add), gathered back by each row's batch;
* `SparseTensor.C` (and `.coordinates`) is the traced coordinates times the tensor stride plus the
  origin, as MinkowskiEngine gives them, so the module's outputs and anything it computes from them are
  traced.

Everything else MinkowskiEngine's modules do on features alone (batch norms, activations, `MinkowskiLinear`,
`ME.cat` and `+` of tensors on one key) is torch, and torch.onnx writes it. Weights are MinkowskiEngine's
`(K, Cin, Cout)` with the first dimension's offset varying fastest; the source ops take ONNX's layout, the
last dimension fastest, so they are re-laid out. The modules whose calls have no source op yet are refused,
naming the module, its call and what would work.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import MinkowskiEngine as ME
import torch

from ..errors import SparseLowerError
from .traced_calls import (NAME_ATTRIBUTE, Call, TracedCalls, call_site, constant, frame_origin, inference,
                           onto_grid, replaced_methods, untraced)
from .traced_calls import deepest_strides as shared_deepest_strides

# MinkowskiEngine puts its own folder on sys.path and imports its files as top-level modules
# (MinkowskiConvolution, MinkowskiPooling, ...): its classes are those modules', not MinkowskiEngine.*'s.
me_conv = sys.modules[ME.MinkowskiConvolution.__module__]
me_pool = sys.modules[ME.MinkowskiMaxPooling.__module__]
_TENSOR = next(c for c in ME.SparseTensor.__mro__ if "C" in c.__dict__)  # where .C and .coordinates live

# Modules whose calls have no source op yet, with what would work instead.
_REFUSED = {
    "MinkowskiGenerativeConvolutionTranspose": "a MinkowskiConvolutionTranspose back onto a level the network "
                                               "made on its way down",
    "MinkowskiAvgPooling": "MinkowskiMaxPooling or a strided MinkowskiConvolution",
    "MinkowskiSumPooling": "MinkowskiMaxPooling or a strided MinkowskiConvolution",
    "MinkowskiPoolingTranspose": "a MinkowskiConvolutionTranspose",
    "MinkowskiStableInstanceNorm": "MinkowskiBatchNorm",
    "MinkowskiUnion": "ME.cat or + of tensors on one coordinate map key",
    "MinkowskiPruning": "keeping every row (prune after the exported part)",
    "MinkowskiBroadcastBase": "torch on the features",
    "MinkowskiBroadcast": "torch on the features",
    "MinkowskiBroadcastConcatenation": "torch on the features",
    "MinkowskiInterpolation": "interpolating outside the exported part",
    "MinkowskiChannelwiseConvolution": "a MinkowskiConvolution",
}


minkowski_inference = inference  # MinkowskiEngine's CPU kernels need nothing more


def _key(tensor) -> tuple:
    """A coordinate map key as a dict key: MinkowskiEngine compares keys by stride and tag."""
    stride, tag = tensor.coordinate_map_key.get_key()
    return tuple(stride), tag


@dataclass
class Level:
    """One coordinate map key in the graph: its traced coordinates (int32, less the frame's origin and
    divided by `stride`), the grid its source ops are written on, its tensor stride, and whether its sites
    are the frame's (a global pooling's (b, 0, …) are not moved by the origin)."""

    coords: torch.Tensor
    grid: list
    stride: list
    moved: bool = True


@dataclass
class EngineCalls(TracedCalls):
    """The state of one MinkowskiEngine export: besides TracedCalls', the level of every key met."""

    levels: dict = field(default_factory=dict)  # _key -> Level
    deepest: list | None = None  # per dimension, a multiple of every tensor stride the module reaches
    origin: torch.Tensor | None = None  # traced [1 + D]: (0, the frame's origin), set by the input's SparseTensor

    def level(self, tensor, module=None) -> Level:
        level = self.levels.get(_key(tensor))
        if level is None:
            raise SparseLowerError(f"a SparseTensor (at {call_site()}) whose coordinates the export did not see made",
                                   None if module is None else self.name(module),
                                   fix="build the input SparseTensor from the example's coordinates, inside the "
                                       "exported module or as its example")
        return level

    # ----- tensors

    def construct(self, original, tensor, features, coordinates=None, *args, **kwargs):
        original(tensor, features, coordinates, *args, **kwargs)
        if coordinates is None or torch._C._get_tracing_state() is None:
            return
        with untraced():
            repeated = len(tensor.inverse_mapping) != len(coordinates) or not torch.equal(
                tensor.unique_index, torch.arange(len(coordinates)))
        if repeated:
            raise SparseLowerError(f"the coordinates of the SparseTensor made at {call_site()} repeat a site: "
                                   "MinkowskiEngine keeps one row per site, chosen on the example",
                                   fix="give each site once (ME.utils.sparse_quantize the points beforehand)")
        tensor._F = features  # not MinkowskiEngine's gather of the rows it keeps: all of them, in order
        stride = [int(s) for s in tensor.tensor_stride]
        if self.origin is None:
            spatial = frame_origin(coordinates[:, 1:], self.deepest or [1] * len(stride))
            self.origin = torch.cat([torch.zeros(1, dtype=torch.int64), spatial])
        coordinates = coordinates - self.origin.to(coordinates.dtype)
        with untraced():
            example = [int(v) // s + 1 for v, s in zip(coordinates[:, 1:].max(0).values, stride)] \
                if len(coordinates) else [1] * len(stride)
        grid = self.bound(example)
        if any(s != 1 for s in stride):
            scale = torch.tensor([1, *stride], dtype=coordinates.dtype)
            coordinates = torch.div(coordinates, scale, rounding_mode="floor")
        self.levels[_key(tensor)] = Level(coordinates, grid, stride)

    def coordinates(self, original, tensor):
        """MinkowskiEngine's coordinates of `tensor`: traced where the export knows its key."""
        level = self.levels.get(_key(tensor)) if torch._C._get_tracing_state() is not None else None
        if level is None:
            return original.fget(tensor)
        coords = level.coords * torch.tensor([1, *level.stride], dtype=level.coords.dtype)
        return coords + self.origin.to(coords.dtype) if level.moved else coords

    # ----- convolutions and pooling

    def conv(self, original, module, x, coordinates=None):
        name = self.name(module)
        if coordinates is not None:
            raise SparseLowerError(f"{type(module).__name__} given output coordinates (at {call_site()}) cannot be "
                                   "exported yet", name, fix="let the convolution make its own outputs")
        kind = type(module).__name__
        if kind in _REFUSED:
            self.refuse(original, module, x)
        with untraced():
            real = original(module, x)
        generator = module.kernel_generator
        _check_region(generator, name)
        kernel = [int(k) for k in generator.kernel_size]
        weight = module.kernel.detach().numpy().reshape(*kernel[::-1], module.kernel.shape[-2], module.kernel.shape[-1])
        channels = module.kernel.shape[-1]
        bias = torch.zeros(channels) if module.bias is None else module.bias.detach().reshape(-1)
        if module.is_transpose:
            weight = weight.transpose(len(kernel), len(kernel) + 1, *range(len(kernel) - 1, -1, -1))  # [Cin, Cout, *K]
        else:
            weight = weight.transpose(len(kernel) + 1, len(kernel), *range(len(kernel) - 1, -1, -1))  # [Cout, Cin, *K]
        return self._source_op(module, x, real, kernel, generator, [constant(weight), bias])

    def pool(self, original, module, x, coordinates=None):
        if not isinstance(module, me_pool.MinkowskiMaxPooling):
            self.refuse(original, module, x)
        if coordinates is not None:
            raise SparseLowerError(f"{type(module).__name__} given output coordinates (at {call_site()}) cannot be "
                                   "exported yet", self.name(module), fix="let the pooling make its own outputs")
        with untraced():
            real = original(module, x)
        _check_region(module.kernel_generator, self.name(module))
        return self._source_op(module, x, real, [int(k) for k in module.kernel_generator.kernel_size],
                               module.kernel_generator, None)

    def _source_op(self, module, x, real, kernel, generator, weights):
        """The source op of a convolution (weights: [W, B]) or a max pooling (None) on `x`, MinkowskiEngine's
        output `real` handed to the trace, and the output as a SparseTensor on real's key."""
        name = self.name(module)
        level = self.level(x, module)
        stride = [int(s) for s in generator.kernel_stride]
        dilation = [int(d) for d in generator.kernel_dilation]
        begins = [(k - 1) // 2 * d if k % 2 else 0 for k, d in zip(kernel, dilation)]
        attrs = {"kernel_shape": kernel, "strides": stride, "dilations": dilation, "spatial_shape": level.grid,
                 NAME_ATTRIBUTE: name}
        inputs = [x.F, level.coords, *(weights or [])]
        coords_inputs, out = (1,), self.levels.get(_key(real))
        transposed = weights is not None and module.is_transpose
        if transposed:
            if out is None:
                raise SparseLowerError(f"{type(module).__name__} at {call_site()} returns to a level the network did "
                                       "not make", name, fix="use it to return to a level made on the way down")
            op_type = "SparseDeconv"
            attrs.update(onto_grid(level.grid, out.grid, kernel, stride, dilation, begins))
            inputs.append(out.coords)
            coords_inputs = (1, 4)
        elif all(s == 1 for s in stride):
            if any(k % 2 == 0 for k in kernel):
                raise SparseLowerError(f"{type(module).__name__} of stride 1 and an even kernel {kernel} (at "
                                       f"{call_site()}) cannot be exported yet", name,
                                       fix="use an odd kernel, or a stride equal to the kernel")
            op_type = "SubmanifoldConv" if weights else "SparseMaxPool"
            if not weights:
                attrs["submanifold"] = 1
            out = level
        else:
            op_type = "SparseConv" if weights else "SparseMaxPool"
            attrs.update(pads=begins + [0] * len(kernel), output_sites="floor")
        with untraced():
            real_coords = torch.div(real.C - self.origin.to(real.C.dtype),  # its value on the example
                                    torch.tensor([1, *real.tensor_stride], dtype=real.C.dtype), rounding_mode="floor")
        call = Call(op_type, attrs, (real.F, real_coords), ((None, int(real.F.shape[1])), (None, real.C.shape[1])),
                    coords_inputs)
        features, coords = self.apply(call, *inputs)
        if out is None:
            out_stride = [int(s) for s in real.tensor_stride]
            out = Level(coords, [-(-g // s) for g, s in zip(level.grid, stride)], out_stride)
            self.levels[_key(real)] = out
        return ME.SparseTensor(features, coordinate_map_key=real.coordinate_map_key,
                               coordinate_manager=real.coordinate_manager)

    def global_pool(self, original, module, x, coordinates=None):
        """One row per batch: `Coalesce` of the rows on (batch, 0, …), by their maximum or sum, the average
        their sum divided by the row count (a Coalesce of ones). Its sites (b, 0, …) are a level of their own."""
        name = self.name(module)
        if coordinates is not None:
            raise SparseLowerError(f"{type(module).__name__} given output coordinates (at {call_site()}) cannot be "
                                   "exported yet", name, fix="pool onto the origin of each batch (no coordinates)")
        with untraced():
            real = original(module, x)
        level = self.level(x, module)
        mode = str(module.pooling_mode).split(".")[-1]
        origin = level.coords * torch.tensor([1] + [0] * (level.coords.shape[1] - 1), dtype=level.coords.dtype)
        grid = [1] * len(level.grid)
        average = "AVG" in mode
        with untraced():  # (b, 0, …) at tensor stride 0; each output's row count, for an average's sum and count
            real_coords = real.C
            counts = (level.coords[:, :1].T == real_coords[:, :1]).sum(dim=1, keepdim=True).to(real.F.dtype)
        sizes = ((None, int(real.F.shape[1])), (None, real.C.shape[1]))
        attrs = {"spatial_shape": grid, "reduction": "max" if "MAX" in mode else "sum", NAME_ATTRIBUTE: name}
        features, coords = self.apply(Call("Coalesce", attrs, (real.F * counts if average else real.F, real_coords),
                                           sizes), x.F, origin)
        if average:
            count, _ = self.apply(Call("Coalesce", {"spatial_shape": grid, NAME_ATTRIBUTE: f"{name}.count"},
                                       (counts, real_coords), ((None, 1), sizes[1])), torch.ones_like(x.F[:, :1]), origin)
            features = features / count
        self.levels[_key(real)] = Level(coords, grid, [int(s) for s in real.tensor_stride], moved=False)
        return ME.SparseTensor(features, coordinate_map_key=real.coordinate_map_key,
                               coordinate_manager=real.coordinate_manager)

    def instance_norm(self, original, module, x):
        """(x − mean) / sqrt(var + 1e-8) · weight + bias with each batch's mean and (biased) variance, as
        MinkowskiEngine computes them: per-batch sums of the rows (`index_add_`, a ScatterElements add in
        ONNX) gathered back by each row's batch."""
        batch = self.level(x, module).coords[:, 0].long()
        count = torch.zeros(batch.max() + 1, 1).index_add_(0, batch, torch.ones_like(x.F[:, :1]))

        def mean(values):
            return (torch.zeros(count.shape[0], values.shape[1]).index_add_(0, batch, values) / count)[batch]

        centred = x.F - mean(x.F)
        normed = centred / torch.sqrt(mean(centred * centred) + 1e-8) * module.weight + module.bias
        return ME.SparseTensor(normed, coordinate_map_key=x.coordinate_map_key, coordinate_manager=x.coordinate_manager)

    def refuse(self, original, module, *args, **kwargs):
        kind = next(c.__name__ for c in type(module).__mro__ if c.__name__ in _REFUSED)
        raise SparseLowerError(f"{type(module).__name__} (called at {call_site()}) cannot be exported yet",
                               self.name(module), fix=f"use {_REFUSED[kind]}")


def _check_region(generator, name):
    if generator.region_type != ME.RegionType.HYPER_CUBE:
        raise SparseLowerError(f"kernel region {generator.region_type} cannot be exported yet", name,
                               fix="use the default region (RegionType.HYPER_CUBE)")


def deepest_strides(run) -> dict:
    """frame_origin's step: the least common multiple of the strides of every SparseTensor of an eager run."""
    return shared_deepest_strides(run, ME.SparseTensor, lambda tensor: tensor.tensor_stride)


@contextlib.contextmanager
def engine_calls(module, max_spatial_shape=None, deepest=None):
    """Inside: MinkowskiEngine's calls replaced as the module docstring says; yields the export's EngineCalls.
    `deepest`: deepest_strides' step of the origin."""
    calls = EngineCalls({id(m): name or type(module).__name__ for name, m in module.named_modules()},
                        max_spatial_shape=max_spatial_shape, deepest=deepest)
    replaced = [(me_conv.MinkowskiConvolutionBase, "forward", calls.conv),
                (me_pool.MinkowskiPoolingBase, "forward", calls.pool),
                (me_pool.MinkowskiGlobalPooling, "forward", calls.global_pool),
                (me_pool.MinkowskiGlobalMaxPooling, "forward", calls.global_pool),
                (ME.MinkowskiInstanceNorm, "forward", calls.instance_norm),
                (ME.SparseTensor, "__init__", calls.construct)]
    for kind in _REFUSED:
        cls = getattr(ME, kind, None)
        if cls is not None and "forward" in cls.__dict__ and not issubclass(
                cls, (me_conv.MinkowskiConvolutionBase, me_pool.MinkowskiPoolingBase)):
            replaced.append((cls, "forward", calls.refuse))
    properties = {attr: _TENSOR.__dict__[attr] for attr in ("C", "coordinates")}
    for attr, original in properties.items():
        setattr(_TENSOR, attr, property(lambda self, _o=original: calls.coordinates(_o, self)))
    try:
        with replaced_methods(replaced):
            yield calls
    finally:
        for attr, original in properties.items():
            setattr(_TENSOR, attr, original)
