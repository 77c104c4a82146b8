"""`quantize`: the gpu form's convs in 8 bits, calibrated on frames (docs/performance.md: int8 on the gpu target).

Why post-training, MinMax, per channel: a deployment has frames but rarely a training loop; MinMax keeps
every calibrated value representable, which on the real frames measured better than clipping at a
percentile (docs/performance.md, int8: accuracy of the alternatives); per channel costs nothing in the kernel (passes/quantize_convs.py).

A conv stays float when its input rows go below zero on some calibration frame: IndexedConvInt8 reads
u8 codes, which is what the rows a ReLU made need, and the first layer of a LiDAR network reads raw point
features (x, y in ±54 m beside a 0–0.5 s time channel), which 8 bits per channel would round away.

With a `limit`, the convs that take the network's output past it on the calibration frames stay float
too, chosen by measurement as the nna segments' wide layers are (mixed_precision.widened): each conv alone
at 8 bits, then every one, then the most sensitive kept float one by one until the frames are within the
limit, then each put back where they stay within it. Every conv at 8 bits is 4.4 % / 27 dB off on the
real frames (docs/performance.md, int8), one layer alone 0.1–2.7 %: the error is the layers' sum.
`headroom` widens every input range by a factor: a frame outside calibration whose rows exceed the
calibrated tops is clipped at 255, which costs far more than the resolution headroom gives up.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..api import lower
from ..errors import SparseLowerError
from ..frames.files import feeds_given
from ..importers import SOURCE_FORMAT, detect_format, import_model
from ..model_io import exposing, load
from ..onnx_conventions import CUSTOM_DOMAIN, SOURCE_DOMAIN
from ..passes.check import CheckModel
from ..passes.manager import PassManager
from ..passes.quantize_convs import QuantizeConvs, check_weight_bits
from ..runtime import create_session
from ..verify import relative_error
from .mixed_precision import widened


@dataclass
class Calibration:
    """Per IndexedConv (by node name), over the calibration frames: the largest value of each input
    channel (`tops`), and the convs left float with the reason (`float_convs`)."""

    tops: dict[str, np.ndarray] = field(default_factory=dict)
    float_convs: dict[str, str] = field(default_factory=dict)


def calibrate(lowered: onnx.ModelProto, frames: list[dict[str, np.ndarray]]) -> Calibration:
    """The input ranges of every IndexedConv of `lowered` over `frames` (feeds of the model's inputs)."""
    convs = [n for n in lowered.graph.node if n.op_type == "IndexedConv" and n.domain == CUSTOM_DOMAIN]
    rows = sorted({conv.input[0] for conv in convs})
    session = create_session(exposing(lowered, rows, onnx.TensorProto.FLOAT))
    top: dict[str, np.ndarray] = {}
    low: dict[str, float] = {}
    for feeds in frames:
        for name, value in zip(rows, session.run(rows, feeds)):
            if len(value):
                most = value.max(axis=0)
                top[name] = np.maximum(top[name], most) if name in top else most
                low[name] = min(low.get(name, 0.0), float(value.min()))
    found = Calibration()
    for conv in convs:
        name = conv.input[0]
        if name not in top:
            found.float_convs[conv.name] = "its input had no rows on any calibration frame"
        elif not np.isfinite(top[name]).all() or not np.isfinite(low[name]):
            found.float_convs[conv.name] = "its input holds NaN or Inf on a calibration frame"
        elif low[name] < 0:
            found.float_convs[conv.name] = f"its input goes below zero ({low[name]:.3g}): u8 codes hold rows >= 0"
        else:
            found.tops[conv.name] = top[name]
    return found


def quantize(model: onnx.ModelProto | str | os.PathLike, calibration_frames: list[dict[str, np.ndarray]], *,
             limit: float | None = None, headroom: float = 1.0, convs: Collection[str] | None = None,
             weight_bits: int = 7, log=lambda line: None) -> tuple[onnx.ModelProto, Calibration]:
    """`model` for the gpu target with its convs in 8 bits (IndexedConvInt8) where the calibration allows,
    and the calibration (which convs stayed float, and why). `model`: lowered for the gpu target with the
    default (fused) strategy, a model of source ops (lowered here first) or an exporter's file (NVIDIA,
    AIMET, Autoware: imported first). `calibration_frames`: feeds of the model's inputs, e.g. real
    frames like the ones it will run on. `limit`: the largest relative error of the outputs against float
    on those frames; the convs that would take them past it stay float (module docstring; `log` receives
    the search's steps). `headroom` ≥ 1: each input channel's range, its calibrated top times this.
    `convs`: the IndexedConv nodes (by name) that may take 8 bits, the others stay float (`tune` passes
    those that ran faster at 8 bits); by default every one. `weight_bits`: 7 (±63) or 8 (±127: more
    accurate, and as fast on VNNI, AMX and ARM, but AVX2 without VNNI runs it on its portable loop;
    passes/quantize_convs.py)."""
    model = load(model)
    if detect_format(model) != SOURCE_FORMAT:
        model = import_model(model)
    if any(n.domain == SOURCE_DOMAIN for n in model.graph.node):
        model = lower(model, target="gpu")
    if not any(n.op_type == "IndexedConv" and n.domain == CUSTOM_DOMAIN for n in model.graph.node):
        raise SparseLowerError("the model has no IndexedConv to quantize",
                               fix="quantize a model of source ops, or one lowered for the gpu target with the "
                                   "default strategy (fused)")
    calibration_frames = feeds_given(model, calibration_frames, "calibration_frames")
    if not calibration_frames:
        raise SparseLowerError("no calibration frames", fix="give one or more frames of the model's inputs")
    if not headroom >= 1.0:
        raise SparseLowerError(f"headroom {headroom} would clip the calibration frames' own rows",
                               fix="give a headroom of 1 (the calibrated ranges) or more")
    check_weight_bits(weight_bits)
    found = calibrate(model, calibration_frames)
    found.tops = {name: headroom * top for name, top in found.tops.items()}
    if convs is not None:
        allowed = set(convs)
        unknown = sorted(allowed - set(found.tops) - set(found.float_convs))
        if unknown:
            raise SparseLowerError(f"no IndexedConv named {unknown[0]!r} to quantize",
                                   fix="name the model's IndexedConv nodes in convs")
        for name in [name for name in found.tops if name not in allowed]:
            found.float_convs[name] = "left float by the caller"
            del found.tops[name]
    if limit is not None and found.tops:
        for name in kept_float(model, found.tops, calibration_frames, limit, weight_bits, log):
            found.float_convs[name] = f"kept float: at 8 bits it takes the calibration frames past {limit:g}"
            del found.tops[name]
    quantized = PassManager([QuantizeConvs(found.tops, weight_bits), CheckModel()]).run(model)
    return quantized, found


def kept_float(model: onnx.ModelProto, tops: dict[str, np.ndarray], frames: list[dict[str, np.ndarray]],
               limit: float, weight_bits: int = 7, log=lambda line: None) -> list[str]:
    """The convs of `tops` (conv: input ranges) to keep float for `model`'s outputs to stay within `limit`
    of float on `frames`, the most sensitive first (mixed_precision.widened); all of them where even that
    misses the limit."""
    reference = create_session(model)
    expected = [reference.run(None, feeds) for feeds in frames]

    def error(quantized, wide=()) -> float:
        chosen = {name: tops[name] for name in quantized if name not in wide}
        session = create_session(PassManager([QuantizeConvs(chosen, weight_bits)]).run(model))
        return max(relative_error(got, want) for feeds, wants in zip(frames, expected)
                   for got, want in zip(session.run(None, feeds), wants) if want.dtype.kind == "f")

    kept, errors, _ = widened(list(tops), error, limit, log, wider="float")
    return kept if errors[-1] <= limit else list(tops)
