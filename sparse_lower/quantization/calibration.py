"""Calibration of the int8 accelerator segments: what each segment of a partition reads on calibration
frames, and the MinMax ranges of its tensors over those samples.

Why MinMax, one sample at a time: MinMax keeps every calibrated value representable, and a real frame's
segment holds tensors of `[capacity, C]` per tap: onnxruntime's own calibrator, which keeps every tensor
of every sample, would hold tens of GB.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx

from ..model_io import exposing
from ..partition import Partition
from ..partition.devices import ACCELERATOR
from ..runtime import create_session
from .products import activations_read


def run_segments(parts: Partition, sessions: Mapping[int, object], feeds: Mapping[str, np.ndarray]) -> dict:
    """Every value at a segment boundary on `feeds` (the graph inputs and outputs among them): the
    segments run in order, each in `sessions[index]` (an onnxruntime session, or one with a quantized
    segment in its place)."""
    values = dict(feeds)
    for segment in parts.segments:
        inputs = {name: values[name] for name in segment.inputs}
        values.update(zip(segment.outputs, sessions[segment.index].run(list(segment.outputs), inputs)))
    return values


def segment_sessions(parts: Partition) -> dict[int, object]:
    """An onnxruntime session of every segment of `parts`, by index: what `run_segments` runs."""
    return {s.index: create_session(parts.segment_model(s.index)) for s in parts.segments}


def accelerator_inputs(parts: Partition, values: Mapping[str, np.ndarray]) -> dict[int, dict]:
    """What each accelerator segment of `parts` reads, from one run's `run_segments` values."""
    return {s.index: {name: values[name] for name in s.inputs} for s in parts.segments if s.device == ACCELERATOR}


def segment_samples(parts: Partition, calibration: Iterable[Mapping[str, np.ndarray]]) -> dict[int, list[dict]]:
    """For every accelerator segment of `parts`, its inputs on each calibration feed (in onnxruntime)."""
    sessions = segment_sessions(parts)
    samples: dict[int, list[dict]] = {s.index: [] for s in parts.segments if s.device == ACCELERATOR}
    for feeds in calibration:  # one frame's values at a time
        for index, inputs in accelerator_inputs(parts, run_segments(parts, sessions, feeds)).items():
            samples[index].append(inputs)
    return samples


def tensor_ranges(model: onnx.ModelProto, samples: list[dict], names: list[str]) -> dict[str, tuple]:
    """MinMax over `samples` (the model's inputs) of the float tensors `names`, each range holding 0,
    one sample's values at a time."""
    session = create_session(exposing(model, names, onnx.TensorProto.FLOAT))
    ranges: dict[str, tuple] = {}
    for sample in samples:
        for name, value in zip(names, session.run(names, sample)):
            low, high = np.float32(value.min(initial=0.0)), np.float32(value.max(initial=0.0))
            if name in ranges:
                low, high = min(low, ranges[name][0]), max(high, ranges[name][1])
            ranges[name] = (low, high)
    return ranges


def activation_ranges(model: onnx.ModelProto, samples: list[dict], products: list[str]) -> dict[str, tuple]:
    """MinMax over `samples` of the activations that `products` read: the only ranges a QDQ model whose
    products keep float outputs needs. onnxruntime's own calibrator would also keep every product's
    output, 27 partials of `[capacity, Cout]` per layer: tens of GB on a real frame."""
    return tensor_ranges(model, samples, activations_read(model, products))
