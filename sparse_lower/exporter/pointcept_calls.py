"""Pointcept's point transformers (Point Transformer V3, `PT-v3m1`) while torch.onnx traces them
(exporter/trace.py): the calls of theirs that the trace would fix to the example, or that
torch.onnx cannot write, replaced for the duration of an export by computations of the same values that
stay in the graph. Their sparse convolutions (the embedding's and every block's positional encoding,
`SubMConv3d`) are spconv's and spconv_calls.py makes them source ops, as for any spconv network.

What is replaced, each by torch operations the trace keeps (standard ONNX ops) or by a source op:

* serialization `encode` (z-order, Hilbert and their transposed orders): Pointcept packs bits through
  `view(torch.uint8)`, which ONNX has no form of, with a depth that the trace would fix. Here the codes are
  computed with integer division and remainders: the z-order interleaves the coordinates' 16 bits; the
  Hilbert code is Skilling's transform of the bits as Pointcept computes it, at 16 bits on coordinates
  turned by the frame's own depth (each leading zero level of a 16-bit transform turns the axes once:
  x, y, z -> z, x, y), which gives Pointcept's code at that depth. The batch is put above bit 48 rather
  than above 3 x depth, which sorts and groups alike.
* `torch_scatter.segment_csr` (the pooling's max of features and mean of coordinates): a `Coalesce` of
  each row onto its segment, by maximum or sum (the mean: the sum over the segment's count).
* `SerializedAttention.forward`: its patch size is min(points of the smallest batch element,
  `patch_size`), read as a Python number, and its padding to whole patches is a loop over the batch;
  both are computed here from the frame's offsets in the graph, and the attention within patches is the
  same products and softmax in torch. flash-attn's kernel has no ONNX form and is refused.
* `offset2batch` / `batch2offset` (a `repeat_interleave` over the batch count and a `bincount`),
  `torch.randperm` (the shuffled orders: drawn from torch's generator as the module draws them, and fixed
  into the model), and `Point.sparsify`'s grid (the frame's extent plus its margin, traced, so that
  `max_spatial_shape` bounds it).
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..errors import SparseLowerError
from .traced_calls import NAME_ATTRIBUTE, Call, SourceOp, TracedCalls, call_site, replaced_methods, untraced

CODE_BITS = 16  # Pointcept's deepest serialization: 16 bits per coordinate
BATCH_SHIFT = 3 * CODE_BITS


def uses_pointcept(module) -> bool:
    return any(type(m).__module__.startswith("pointcept.") for m in module.modules())


def _standard(op_type: str, result: torch.Tensor, *inputs, **attrs):
    """`result`, computed eagerly, in the trace as the ONNX op `op_type` of `inputs`: for a reshape by a
    computed size and a range to a computed count, which torch's own calls would fix to the example's."""
    call = Call(op_type, attrs, (result,), (tuple(None for _ in result.shape),), coords_inputs=(),
                coords_outputs=(), domain="onnx")
    return SourceOp.apply(call, *inputs)


def _scalar(value) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int64)


def _arange(count: torch.Tensor) -> torch.Tensor:
    """0, 1, ..., count - 1 for a traced 0-d `count`."""
    with untraced():
        result = torch.arange(int(count))
    return _standard("Range", result, _scalar(0), count.long().reshape(()), _scalar(1))


def _reshape(x: torch.Tensor, shape: list) -> torch.Tensor:
    """`x` reshaped to `shape`, whose items may be traced 0-d tensors."""
    with untraced():
        result = x.reshape([int(s) for s in shape])
    spelled = torch.stack([s.long().reshape(()) if isinstance(s, torch.Tensor) else _scalar(s) for s in shape])
    return _standard("Reshape", result, x, spelled)


# ---------------------------------------------------------------------------------------------------
# Serialization codes


def _bits(coords: torch.Tensor) -> torch.Tensor:
    """[N, 3, 16] the coordinates' bits, most significant first, as 0/1 int64."""
    powers = torch.from_numpy(2 ** np.arange(CODE_BITS - 1, -1, -1, dtype=np.int64))
    return torch.remainder(torch.div(coords.long().unsqueeze(-1), powers, rounding_mode="trunc"), 2)


def z_order(coords: torch.Tensor) -> torch.Tensor:
    """Each row's z-order code: bit i of x, y, z at 3i + 2, 3i + 1, 3i."""
    places = 3 * np.arange(CODE_BITS - 1, -1, -1)[None, :] + np.array([2, 1, 0])[:, None]
    return (_bits(coords) * torch.from_numpy((2 ** places).astype(np.int64))).sum(dim=(1, 2))


def _depth(coords: torch.Tensor) -> torch.Tensor:
    """Pointcept's serialization depth, the bit length of the largest coordinate plus one, traced."""
    powers = torch.from_numpy(2 ** np.arange(CODE_BITS + 1, dtype=np.int64))
    return (coords.long().max() + 1 >= powers).sum()


def hilbert(coords: torch.Tensor) -> torch.Tensor:
    """Each row's Hilbert code at the frame's depth (Skilling's transform, see the module docstring)."""
    turns = torch.remainder(CODE_BITS - _depth(coords), 3)
    axes = torch.tensor([[0, 1, 2], [1, 2, 0], [2, 0, 1]])[turns]
    bits = _bits(coords.long().index_select(1, axes)) > 0
    gray = [bits[:, axis] for axis in range(3)]
    for bit in range(CODE_BITS):
        low = torch.from_numpy(np.arange(CODE_BITS) > bit)
        for axis in range(3):
            mask = gray[axis][:, bit:bit + 1]
            gray[0] = gray[0] ^ (mask & low)
            if axis:
                flip = ~mask & low & (gray[0] ^ gray[axis])
                gray[axis] = gray[axis] ^ flip
                gray[0] = gray[0] ^ flip
    interleaved = torch.stack(gray, dim=2).reshape(-1, 3 * CODE_BITS).long()
    binary = torch.remainder(torch.cumsum(interleaved, dim=1), 2)
    places = torch.from_numpy(2 ** np.arange(3 * CODE_BITS - 1, -1, -1, dtype=np.int64))
    return (binary * places).sum(dim=1)


def encode(grid_coord, batch=None, depth=16, order="z"):
    """Pointcept's `encode` as the graph computes it (`depth` is the frame's own, see the module docstring)."""
    codes = {"z": z_order, "z-trans": lambda c: z_order(c[:, [1, 0, 2]]),
             "hilbert": hilbert, "hilbert-trans": lambda c: hilbert(c[:, [1, 0, 2]])}
    if order not in codes:
        raise SparseLowerError(f"serialization order {order!r} is not one of Pointcept's", fix=f"use one of {list(codes)}")
    code = codes[order](grid_coord)
    return code if batch is None else batch.long() * (1 << BATCH_SHIFT) + code


# ---------------------------------------------------------------------------------------------------
# Batches, segments, the shuffled orders


def offset2batch(offset: torch.Tensor) -> torch.Tensor:
    """Each row's batch element: how many batch ends lie at or before it."""
    rows = _arange(offset[-1])
    return (rows.unsqueeze(1) >= offset.long().unsqueeze(0)).sum(dim=1)


def batch2offset(batch: torch.Tensor) -> torch.Tensor:
    """The end of each batch element's rows (rows grouped by batch, as Pointcept's are)."""
    elements = _arange(batch.max() + 1)
    return (batch.long().unsqueeze(1) <= elements.unsqueeze(0)).sum(dim=0)


def randperm(original, n, *args, **kwargs):
    """torch's permutation, drawn from its generator as the module draws it, fixed into the model."""
    with untraced():
        return original(int(n), *args, **kwargs)


class SegmentCalls:
    """`torch_scatter.segment_csr` as a `Coalesce` per call (see the module docstring)."""

    def __init__(self, calls: TracedCalls):
        self.calls, self.count = calls, 0

    def segment_csr(self, original, src, indptr, reduce="sum", out=None):
        if out is not None or src.dim() != 2 or reduce not in ("sum", "mean", "max", "min"):
            raise SparseLowerError(f"torch_scatter.segment_csr(reduce={reduce!r}) of a {src.dim()}-d tensor"
                                   f"{' into out' if out is not None else ''} cannot be exported (called at {call_site()})",
                                   fix="reduce rows of a 2-d tensor by sum, mean, max or min")
        with untraced():
            real = original(src, indptr, reduce=reduce)
            summed = original(src, indptr, reduce="sum") if reduce == "mean" else None
        indptr = indptr.long()
        starts = torch.zeros_like(src[:, 0], dtype=torch.int64).index_add(0, indptr[1:-1], torch.ones_like(indptr[1:-1]))
        segment = torch.cumsum(starts, dim=0)
        coords = torch.stack([segment, torch.zeros_like(segment)], dim=1)
        reduction = "sum" if reduce in ("sum", "mean") else "max"
        sign = -1.0 if reduce == "min" else 1.0
        with untraced():
            result = {"mean": summed, "min": -real}.get(reduce, real)
            sites = torch.stack([torch.arange(len(real)), torch.zeros(len(real), dtype=torch.int64)], dim=1).int()
        self.count += 1
        call = Call("Coalesce", {"spatial_shape": [1], "reduction": reduction,
                                 NAME_ATTRIBUTE: f"segment_csr_{self.count}"},
                    (result, sites), ((None, src.shape[1]), (None, 2)))
        features, _ = self.calls.apply(call, src * sign if sign < 0 else src, coords.int())
        if reduce == "mean":
            counts = (indptr[1:] - indptr[:-1]).clamp(min=1).unsqueeze(1)
            return features / counts.to(features.dtype)
        return features * sign if sign < 0 else features


# ---------------------------------------------------------------------------------------------------
# Attention within patches


def _patches(point, patch_size_max: int):
    """(patch size, pad, unpad) of Pointcept's SerializedAttention, from the frame's offsets: each batch
    element of n points is padded to whole patches where n exceeds the patch size, the padding rows
    repeating the points one patch before them; `unpad` maps each point to its padded row."""
    offset = point.offset.long()
    counts = offset - torch.cat([torch.zeros_like(offset[:1]), offset[:-1]])
    size = counts.min().clamp(max=patch_size_max)
    padded = torch.where(counts > size, torch.div(counts + size - 1, size, rounding_mode="trunc") * size, counts)
    starts = offset - counts
    padded_starts = torch.cumsum(padded, dim=0) - padded
    unpad = _arange(offset[-1]) + (padded_starts - starts)[point.batch.long()]
    slots = _arange(padded.sum())
    element = (slots.unsqueeze(1) >= (padded_starts + padded).unsqueeze(0)).sum(dim=1)
    local = slots - padded_starts[element]
    pad = starts[element] + torch.where(local < counts[element], local, local - size)
    return size, pad, unpad


def attention(original, self, point):
    """SerializedAttention.forward with the patch size and padding in the graph (see the module docstring)."""
    if self.enable_flash:
        raise SparseLowerError(f"SerializedAttention with enable_flash=True calls flash_attn."
                               f"flash_attn_varlen_qkvpacked_func (at {call_site()}), which has no ONNX form",
                               fix="build the model with enable_flash=False (the same weights: attention in torch, "
                                   "upcast_attention and upcast_softmax as trained)")
    heads, channels = self.num_heads, self.channels
    size, pad, unpad = _patches(point, self.patch_size_max)
    order = point.serialized_order[self.order_index][pad]
    inverse = unpad[point.serialized_inverse[self.order_index]]
    qkv = self.qkv(point.feat)[order]
    q, k, v = _reshape(qkv, [-1, size, 3, heads, channels // heads]).permute(2, 0, 3, 1, 4).unbind(dim=0)
    if self.upcast_attention:
        q, k = q.float(), k.float()
    attn = (q * self.scale) @ k.transpose(-2, -1)
    if self.enable_rpe:
        grid = _reshape(point.grid_coord[order], [-1, size, 3])
        attn = attn + self.rpe(grid.unsqueeze(2) - grid.unsqueeze(1))
    if self.upcast_softmax:
        attn = attn.float()
    attn = self.attn_drop(self.softmax(attn)).to(qkv.dtype)
    feat = (attn @ v).transpose(1, 2).reshape(-1, channels)[inverse]
    point.feat = self.proj_drop(self.proj(feat))
    return point


def serialization(original, self, order="z", depth=None, shuffle_orders=False):
    """Point.serialization at Pointcept's deepest depth where it would read the frame's as a Python number:
    the codes are the frame's own anyway (`encode`), and the depth left is then only the pooling's guard,
    which skips a level's pooling where the frame's coordinates all lie below 2^levels."""
    return original(self, order, CODE_BITS if depth is None else depth, shuffle_orders)


class PackedBits(TorchFunctionMode):
    """GridPooling's packing of the batch above the grid coordinates (`grid | batch << 48`, then `& (2^48 - 1)`)
    as arithmetic, which ONNX has for int64 before opset 18: `a << k` is a·2^k, `a | b` is a + b where no
    bit is set in both (checked on the example; Pointcept's grid coordinates lie in [0, 2^48)), `a & (2^k - 1)`
    is the remainder by 2^k of a non-negative `a`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "").strip("_")
        if name in ("lshift", "bitwise_left_shift") and isinstance(args[1], int):
            return args[0] * (1 << args[1])
        if name in ("or", "bitwise_or") and all(isinstance(a, torch.Tensor) for a in args[:2]):
            with untraced():
                overlapping = bool((func(*args) != args[0] + args[1]).any())
            if overlapping:
                raise SparseLowerError(f"a bitwise or of values that share bits (at {call_site()}) cannot be exported",
                                       fix="keep the packed values in separate bits")
            return args[0] + args[1]
        if name in ("and", "bitwise_and") and isinstance(args[1], int) and args[1] & (args[1] + 1) == 0:
            return torch.remainder(args[0], args[1] + 1)
        return func(*args, **(kwargs or {}))


def grid_pooling(original, self, point):
    """GridPooling.forward (Sonata's PT-v3m2) with its packed bits as arithmetic (PackedBits)."""
    with PackedBits():
        return original(self, point)


def sparsify(original, self, pad=96):
    """Point.sparsify with its grid traced from the frame (Pointcept reads it as a Python list)."""
    if "sparse_shape" not in self.keys():
        self["sparse_shape"] = self.grid_coord.max(dim=0).values + pad
    return original(self, pad)


# ---------------------------------------------------------------------------------------------------


def _lines(function, text: str) -> set:
    """(file, line) of `text` in `function`'s source: a value the trace fixes that no output depends on
    (a batch count in an assertion, a batch size the source ops do not read), not worth a warning."""
    lines, first = inspect.getsourcelines(function)
    return {(inspect.getsourcefile(function), first + i) for i, line in enumerate(lines) if text in line}


@contextlib.contextmanager
def pointcept_calls(module, calls: TracedCalls):
    """Inside: Pointcept's calls replaced as the module docstring says (for the Pointcept modules of
    `module`); yields the (file, line) of the values the trace fixes that no output depends on."""
    import torch_scatter

    structure = sys.modules["pointcept.models.utils.structure"]
    segments = SegmentCalls(calls)
    attentions = {type(m) for m in module.modules() if type(m).__name__ == "SerializedAttention"}
    poolings = {type(m) for m in module.modules() if type(m).__name__ == "GridPooling"}
    replaced = [(cls, "forward", attention) for cls in attentions] + [(cls, "forward", grid_pooling) for cls in poolings]
    replaced += [(structure.Point, "serialization", serialization), (structure.Point, "sparsify", sparsify)]
    understood = (_lines(structure.Point.serialization, "len(self.offset).bit_length()")
                  | _lines(structure.Point.sparsify, "self.batch[-1].tolist()"))
    replaced += [(owner, name, lambda original, *args, _f=function, **kwargs: _f(*args, **kwargs))
                 for owner, name, function in ((structure, "encode", encode), (structure, "offset2batch", offset2batch),
                                               (structure, "batch2offset", batch2offset))]
    replaced += [(torch, "randperm", randperm), (torch_scatter, "segment_csr", segments.segment_csr)]
    with replaced_methods(replaced):
        yield understood
