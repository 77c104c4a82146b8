"""Mixed precision for the int8 nna segments: which layers read 16-bit activations so that the network
stays within an error limit while the rest run at 8 bits, chosen by measurement.

Why: 8-bit activations take the CenterPoint backbone 4.7 % and 2.4 % off on the two real frames, 16-bit
ones everywhere 1.3 % and 1.5 % (docs/toolchains.md, int8), but NPUs are fastest at w8a8 and some (the
RK3588) have no 16-bit activations at all; the error comes from a few layers, so only those need widening.

`choose_wide_layers` (pre: a partition of a lowered model whose nna segments have static shapes, and
calibration feeds; post: a `Plan` whose `wide` layers, given to `compile_partition(wide_layers=...)`
with the toolchain whose form was measured, keep every calibration frame within `limit` in that form run
by onnxruntime, or every layer is wide and the last error says by how much it misses):

1. sensitivity: each layer quantized alone with 8-bit activations (every other product float), its
   largest error over the frames;
2. every layer at 8 bits (the first and last layers float, as `compile_partition` keeps them), then
   the most sensitive layer widened to 16 bits, then the next, until every frame is within `limit`;
3. the layers' errors interact (widening one can raise the total), so each wide layer, the least
   sensitive first, goes back to 8 bits where the frames stay within `limit` without it.

The form is the one a toolchain names (`Toolchain.int8_form`, forms.py): onnxruntime's quantizes the
products only (qdq.py; OpenVINO's with 7-bit weights at 8-bit activations); QNN's HTP quantizes every
tensor, a wide layer's weights to 16 bits as well, and has no float: what stays float elsewhere is wide
there (htp.py). Where onnxruntime cannot run the form (rknn quantizes by itself) onnxruntime's stands in.
A layer is a source conv (`products.layer_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import SparseLowerError
from ..frames.files import feeds_given
from ..partition import Partition
from ..runtime import create_session
from ..verify import relative_error
from .calibration import accelerator_inputs, run_segments, segment_sessions
from .forms import QuantizedForm
from .products import first_and_last_products, layer_products, weight_products
from .qdq import PartialQdq


@dataclass
class Plan:
    wide: list[str]  # the layers that keep 16-bit activations, the most sensitive first
    errors: list[float]  # the largest error over the frames: every layer at 8 bits, then after each widening
    # and each layer put back to 8 bits
    sensitivity: dict[str, float]  # each layer alone at 8 bits, every other float; the most sensitive first
    samples: dict[int, list[dict]]  # what each nna segment read on the frames: compile_partition(samples=...)


class QuantizedRuns:
    """A partition's nna segments quantized in `form` (a toolchain's `int8_form()`; by default, and where
    onnxruntime cannot run the form, onnxruntime's PartialQdq), run in onnxruntime on frames beside the
    float run. `layers`: the products by layer, but the first and last layers' (float, or wide where a
    form has no float). `calibration`: the frames the ranges come from, by default `frames`; others than
    those measured say whether the ranges hold on a frame outside calibration, as a deployment meets it.
    `samples`: what each nna segment read on the calibration frames (compile_partition(samples=...))."""

    def __init__(self, parts: Partition, frames: Iterable[Mapping[str, np.ndarray]],
                 form: QuantizedForm | None = None, calibration: Iterable[Mapping[str, np.ndarray]] | None = None):
        self.parts, self.frames = parts, feeds_given(parts.model, frames)
        if not self.frames:
            raise SparseLowerError("no frames to measure the quantized segments on",
                                   fix="give one or more frames of the model's inputs")
        calibration = None if calibration is None else feeds_given(parts.model, calibration, "calibration")
        self.form = (form.measured if form is not None else None) or PartialQdq()
        self.sessions = segment_sessions(parts)
        self.expected = [run_segments(parts, self.sessions, feeds) for feeds in self.frames]  # every segment's inputs too
        calibrated = self.expected if calibration is None else [
            run_segments(parts, self.sessions, feeds) for feeds in calibration]
        runs = [accelerator_inputs(parts, values) for values in calibrated]
        self.samples = {index: [run[index] for run in runs] for index in runs[0]} if runs else {}
        self.segments = {index: parts.segment_model(index) for index in self.samples}
        self.products = {index: weight_products(model) for index, model in self.segments.items()}
        self.ranges = {index: self.form.ranges(self.segments[index], self.samples[index]) for index in self.segments}
        edges = first_and_last_products(parts.graph)
        self.layers = layer_products([p for index in self.segments for p in self.products[index] if p not in edges])

    def errors(self, quantized: Iterable[str], wide: Iterable[str] = ()) -> list[float]:
        """Per frame, the largest error over the float outputs with the layers `quantized` at 8 bits
        (every other product float), those in `wide` at 16."""
        chosen = {p for layer in quantized for p in self.layers[layer]}
        widened = {p for layer in wide for p in self.layers[layer]}
        for index, model in self.segments.items():
            self.sessions[index] = create_session(self.form.quantized(
                model, self.samples[index], set(self.products[index]) - chosen, 8, widened, self.ranges[index]))
        outputs = list(self.parts.graph.graph_outputs)
        errors = []
        for feeds, want in zip(self.frames, self.expected):
            got = run_segments(self.parts, self.sessions, feeds)
            errors.append(max([0.0, *(relative_error(got[name], want[name]) for name in outputs
                                      if want[name].dtype.kind == "f")]))
        return errors


def choose_wide_layers(parts: Partition, calibration: Iterable[Mapping[str, np.ndarray]], limit: float | None = None,
                       log: Callable[[str], None] = lambda line: None, form: QuantizedForm | None = None,
                       runs: QuantizedRuns | None = None) -> Plan:
    """The fewest layers, most sensitive first, that must read 16-bit activations for the partition's
    int8 nna segments to stay within `limit` on every calibration frame (module docstring), in `form`
    (`QuantizedRuns`). `limit`: by default what the form is held to (`QuantizedForm.search_limit`: 2 %,
    QNN's HTP 1.5 %, as it computes further off). `runs`: the QuantizedRuns of these, where the caller
    has made one (its float run and ranges are then not made again)."""
    runs = runs if runs is not None else QuantizedRuns(parts, calibration, form)
    limit = limit if limit is not None else runs.form.search_limit
    wide, errors, sensitivity = widened(list(runs.layers), lambda quantized, wide=(): max(runs.errors(quantized, wide)),
                                        limit, log)
    return Plan(wide, errors, sensitivity, runs.samples)


def widened(layers: list[str], error: Callable[..., float], limit: float, log: Callable[[str], None] = lambda line: None,
            wider: str = "wide") -> tuple[list[str], list[float], dict[str, float]]:
    """(wide, errors, sensitivity): steps 1-3 of the module docstring on `layers`, where `error(quantized,
    wide=())` is the network's largest error with the layers `quantized` at 8 bits but those of `wide`
    (`wider`: what a wide layer is called in the log lines). `errors`: every layer at 8 bits, then after
    each widening and each layer put back; `sensitivity`: each layer alone at 8 bits, the most sensitive
    first."""
    sensitivity = {}
    for layer in layers:
        sensitivity[layer] = error([layer])
        log(f"{layer} alone at 8 bits: {100 * sensitivity[layer]:.2f} %")
    ranked = sorted(sensitivity, key=sensitivity.get, reverse=True)
    errors = [error(layers)]
    log(f"every layer at 8 bits: {100 * errors[-1]:.2f} %")
    wide: list[str] = []
    while errors[-1] > limit and len(wide) < len(ranked):
        wide.append(ranked[len(wide)])
        errors.append(error(layers, wide))
        log(f"{len(wide)} {wider} ({wide[-1]} added): {100 * errors[-1]:.2f} %")
    if errors[-1] <= limit:
        for layer in reversed(list(wide)):
            fewer = [other for other in wide if other != layer]
            without = error(layers, fewer)
            log(f"without {layer}: {100 * without:.2f} %{' (back to 8 bits)' if without <= limit else ''}")
            if without <= limit:
                wide, errors = fewer, [*errors, without]
    return wide, errors, {layer: sensitivity[layer] for layer in ranked}
