"""What the engines' calls (spconv_calls.py, minkowski_calls.py, torchsparse_calls.py) share while torch.onnx
traces a module: a call's results handed to the trace by an `autograd.Function` whose `symbolic` writes the
source op, the pause of the tracer while the engine computes, the user's line of a call, for messages, and
the origin that moves an engine's signed coordinates onto the source ops' grid.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import SparseLowerError
from ..onnx_conventions import SOURCE_DOMAIN

EXPORT_DOMAIN = "sparse_lower_export"  # the marks cleanup.py removes; never in an exported model
NAME_ATTRIBUTE = "export_name"  # a source op's module path, made its node name by cleanup.py
INT64, INT32 = 7, 6  # ONNX's element types, for the Casts around the source ops


@contextlib.contextmanager
def untraced():
    """torch's tracing paused inside: what the engine computes is not recorded."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


def _engine_folders() -> tuple[Path, ...]:
    """The folders of the sparse engines installed here (their frames are not the user's)."""
    folders = []
    for name in ENGINES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            folders.append(Path(spec.origin).parent)
    return tuple(folders)


ENGINES = ("spconv", "MinkowskiEngine", "torchsparse")
LIBRARY_FOLDERS = (Path(torch.__file__).parent, *_engine_folders(), Path(__file__).parents[1])


def user_line(frames) -> str | None:
    """`file:line` of the innermost of `frames` (a traceback's or a stack's) outside torch, the engines and
    sparse_lower: the line of the user's code, or None."""
    for frame in reversed(frames):
        if not any(Path(frame.filename).is_relative_to(folder) for folder in LIBRARY_FOLDERS):
            return f"{frame.filename}:{frame.lineno}"
    return None


def call_site() -> str:
    """The user's line that made the current call."""
    return user_line(traceback.extract_stack()) or "an unknown line"


# ---------------------------------------------------------------------------------------------------
# The trace's view of one engine call


@dataclass
class Call:
    """One source op as the symbolic writes it: its type, attributes, which inputs and outputs are
    coordinates (int32 in torch, int64 in the graph), and the engine's results with their declared sizes
    (None: the dynamic row count)."""

    op_type: str
    attrs: dict
    results: tuple
    sizes: tuple
    coords_inputs: tuple = (1,)
    coords_outputs: tuple = (1,)
    domain: str = SOURCE_DOMAIN


def onnx_attributes(attrs: dict) -> dict:
    """The keyword arguments of torch's `g.op` for ONNX attributes (suffix _i, _f, _s by type)."""
    spelled = {}
    for key, value in attrs.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        kind = "s" if isinstance(items[0], str) else "f" if isinstance(items[0], float) else "i"
        spelled[f"{key}_{kind}"] = value
    return spelled


class SourceOp(torch.autograd.Function):
    """The engine's results in the trace; the source op in the ONNX graph."""

    @staticmethod
    def forward(ctx, call: Call, *inputs):
        with untraced():
            results = tuple(result.clone() for result in call.results)
        return results if len(results) > 1 else results[0]

    @staticmethod
    def symbolic(g, call: Call, *inputs):
        inputs = [g.op("Cast", value, to_i=INT64) if index in call.coords_inputs else value
                  for index, value in enumerate(inputs)]
        outputs = g.op(f"{call.domain}::{call.op_type}", *inputs, outputs=len(call.results),
                       **onnx_attributes(call.attrs))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        written = []
        for index, (value, result, sizes) in enumerate(zip(outputs, call.results, call.sizes)):
            coords = index in call.coords_outputs
            value.setType(inputs[0].type().with_dtype(torch.int64 if coords else result.dtype).with_sizes(list(sizes)))
            written.append(g.op("Cast", value, to_i=INT32) if coords else value)
        return tuple(written) if len(written) > 1 else written[0]


@contextlib.contextmanager
def inference(module):
    """Run `module` for inference inside the block: eval mode, no gradients; modes restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


def onto_grid(grid, fine, kernel, stride, dilation, begins) -> dict:
    """The pads and output padding of a transposed conv from `grid` whose output extent is the finer level's
    `fine`: o = i·s − pb + k·d with S_out = s·(S − 1) + output_padding + d·(K − 1) + 1 − pb − pe."""
    ends, extra = [], []
    for S, F, K, s, d, pb in zip(grid, fine, kernel, stride, dilation, begins):
        over = s * (S - 1) + d * (K - 1) + 1 - pb - F
        ends.append(max(over, 0))
        extra.append(max(-over, 0))
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
        raise SparseLowerError(f"a transposed conv from grid {grid} cannot reach the finer grid {fine}",
                               fix="report it, with the network")
    return {"pads": begins + ends, "output_padding": extra}


@contextlib.contextmanager
def replaced_methods(replacements):
    """Inside: each `(cls, attribute, handler)` of `replacements` in place of the class's own method (or a
    module's function), called as `handler(original, self, *args, **kwargs)` (a function's arguments after
    `original`); the originals are restored afterwards."""
    originals = [(cls, attr, cls.__dict__[attr]) for cls, attr, _ in replacements]
    for (cls, attr, handler), (_, _, original) in zip(replacements, originals):
        setattr(cls, attr, lambda self, *args, _h=handler, _o=original, **kwargs: _h(_o, self, *args, **kwargs))
    try:
        yield
    finally:
        for cls, attr, original in originals:
            setattr(cls, attr, original)


def constant(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


@dataclass
class TracedCalls:
    """What every engine's export keeps: module names, the bound of grids that are not fixed, and the first
    result of every engine call, returned
    by the traced module after its own outputs (torch's dead-code elimination fails on a call none of
    whose results is read; cleanup.py drops them)."""

    names: dict
    max_spatial_shape: list | None = None
    results: list = field(default_factory=list)
    bounded: bool = False  # whether a grid was bounded (max_spatial_shape read)

    def apply(self, call: Call, *inputs):
        results = SourceOp.apply(call, *inputs)
        self.results.append(results[0] if isinstance(results, tuple) else results)
        return results

    def name(self, module) -> str:
        return self.names.get(id(module), type(module).__name__)

    def bound(self, example: list[int]) -> list[int]:
        """The static grid the source ops are written on where the grid is not fixed (`example`: the
        example's, found at the current call): max_spatial_shape, else `default_bound`."""
        site = call_site()
        self.bounded = True
        given = self.max_spatial_shape is not None
        bound = list(self.max_spatial_shape) if given else default_bound(len(example))
        if len(bound) != len(example):
            raise SparseLowerError(f"max_spatial_shape {bound} has {len(bound)} extents; the grid found at {site} "
                                   f"has {len(example)}", fix="give one extent per spatial dimension")
        if any(e > b for e, b in zip(example, bound)):
            what = f"max_spatial_shape {bound}" if given else f"the default bound {bound}"
            raise SparseLowerError(f"the example's grid {example}, found at {site}, exceeds {what}",
                                   fix="give a max_spatial_shape that holds every frame's grid")
        return bound


SITE_BITS = 48  # of a grid whose extent is not fixed, by default: 2^15 batches of it still number in int64


def default_bound(ndim: int) -> list[int]:
    """The grid a frame may have where the network computes it from the frame or its engine has none, unless
    the export is given one: 2^(48 / D) per axis (2^16 in 3-D, Pointcept's deepest serialization), which
    costs no memory where the index tables grow with the sites (the library's, the portable form's dynamic
    grids) and little time (tools/bound_cost.py), leaves 2^15 batches to int64 site numbers, and holds any frame a coordinate type of 16 bits or
    more quantizes. The static forms, whose grids span the bound, want a tight one."""
    return [2 ** (SITE_BITS // ndim)] * ndim


def frame_origin(spatial: torch.Tensor, deepest: list[int]) -> torch.Tensor:
    """Per dimension (int64 [D]), the largest multiple of the deepest stride at or below both 0 and the
    frame's smallest coordinate (`spatial`: [N, D], traced). The source ops take coordinates from 0; the
    engines without a grid (MinkowskiEngine, TorchSparse) take signed ones, as their users quantize metric
    points around the sensor (`floor(xyz / voxel)`): less this origin they start at 0, and since it is a
    multiple of every tensor stride, ⌊(c − o) / s⌋ = ⌊c / s⌋ − o / s at every level, so each level keeps
    the engine's sites, neighbours and row order, moved by o / s; the module's coordinates get o back. A
    frame of coordinates from 0 (and an empty one) has the origin 0."""
    step = torch.tensor(deepest, dtype=torch.int64)
    lowest = torch.cat([spatial.long(), torch.zeros(1, len(deepest), dtype=torch.int64)]).min(0).values
    return torch.div(lowest, step, rounding_mode="floor") * step


def deepest_strides(run, sparse_type, stride_of) -> dict:
    """{"deepest": per dimension, the least common multiple of the tensor strides (`stride_of(tensor)`) of
    every `sparse_type` the engine makes while `run()` runs the module eagerly}: the step of frame_origin,
    a multiple of every level's stride (a global pooling's stride 0 left out: its sites do not move)."""
    seen = []

    def record(original, tensor, *args, **kwargs):
        original(tensor, *args, **kwargs)
        seen.append([int(s) for s in stride_of(tensor)])

    with replaced_methods([(sparse_type, "__init__", record)]):
        try:
            run()
        except Exception:  # noqa: BLE001 - the trace that follows refuses it, naming the module and its line
            pass
    return {"deepest": [math.lcm(*(s for s in strides if s > 0)) for strides in zip(*seen)] if seen else None}


def index_add_symbolic(g, data, dim, index, source, alpha=None):
    """torch.index_add as ScatterElements with reduction "add" (torch.onnx's own writes a plain
    ScatterElements, which keeps one of the rows an index repeats instead of their sum)."""
    from torch.onnx import symbolic_helper

    axis = symbolic_helper._get_const(dim, "i", "dim")
    if axis != 0:
        raise SparseLowerError(f"index_add along dim {axis} cannot be exported", fix="add along the rows (dim 0)")
    if symbolic_helper._get_tensor_rank(source) == 1:
        return g.op("ScatterElements", data, index, source, axis_i=0, reduction_s="add")
    unsqueezed = g.op("Unsqueeze", index, g.op("Constant", value_t=torch.tensor([1], dtype=torch.int64)))
    expanded = g.op("Expand", unsqueezed, g.op("Shape", source))
    return g.op("ScatterElements", data, expanded, source, axis_i=0, reduction_s="add")
