"""`quantize`: the gpu form's convs in 8 bits, calibrated on frames (docs/performance.md: int8 on the gpu target).

Why post-training, MinMax, per channel: a deployment has frames but rarely a training loop; MinMax keeps
every calibrated value representable, which on the real frames measured better than clipping at a
percentile (docs/performance.md, int8: accuracy of the alternatives); per channel costs nothing in the kernel (passes/quantize_convs.py).

A conv stays float when its input rows go below zero on some calibration frame: IndexedConvInt8 reads
u8 codes, which is what the rows a ReLU made need, and the first layer of a LiDAR network reads raw point
features (x, y in ±54 m beside a 0–0.5 s time channel), which 8 bits per channel would round away.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..api import lower
from ..errors import SparseLowerError
from ..importers import SOURCE_FORMAT, detect_format, import_model
from ..model_io import exposing, load
from ..onnx_conventions import CUSTOM_DOMAIN, SOURCE_DOMAIN
from ..passes.check import CheckModel
from ..passes.manager import PassManager
from ..passes.quantize_convs import QuantizeConvs
from ..runtime import create_session


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


def quantize(model: onnx.ModelProto | str | os.PathLike, calibration_frames: list[dict[str, np.ndarray]]
             ) -> tuple[onnx.ModelProto, Calibration]:
    """`model` for the gpu target with its convs in 8 bits (IndexedConvInt8) where the calibration allows,
    and the calibration (which convs stayed float, and why). `model`: lowered for the gpu target with the
    default (fused) strategy, a model of source ops (lowered here first) or an exporter's file (NVIDIA,
    AIMET, Autoware: imported first). `calibration_frames`: feeds of the model's inputs, e.g. real
    frames like the ones it will run on."""
    model = load(model)
    if detect_format(model) != SOURCE_FORMAT:
        model = import_model(model)
    if any(n.domain == SOURCE_DOMAIN for n in model.graph.node):
        model = lower(model, target="gpu")
    if not any(n.op_type == "IndexedConv" and n.domain == CUSTOM_DOMAIN for n in model.graph.node):
        raise SparseLowerError("the model has no IndexedConv to quantize",
                               fix="quantize a model of source ops, or one lowered for the gpu target with the "
                                   "default strategy (fused)")
    if not calibration_frames:
        raise SparseLowerError("no calibration frames", fix="give one or more frames of the model's inputs")
    found = calibrate(model, calibration_frames)
    quantized = PassManager([QuantizeConvs(found.tops), CheckModel()]).run(model)
    return quantized, found
