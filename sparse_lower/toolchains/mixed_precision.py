"""Mixed precision for the int8 nna segments: which layers read 16-bit activations so that the network
stays within an error limit while the rest run at 8 bits, chosen by measurement.

Why: 8-bit activations take the CenterPoint backbone 4.7 % and 2.4 % off on the two real frames, 16-bit
ones everywhere 1.3 % and 1.5 % (docs/toolchains.md, int8), but NPUs are fastest at w8a8 and some (the
RK3588) have no 16-bit activations at all; the error comes from a few layers, so only those need widening.

`choose_wide_layers` (pre: a partition of a lowered model whose nna segments have static shapes, and
calibration feeds; post: a `Plan` whose `wide` layers, given to `compile_partition(wide_layers=...)`,
keep every calibration frame within `limit` in onnxruntime's QDQ, or every layer is wide and the last
error says by how much it misses):

1. sensitivity: each layer quantized alone with 8-bit activations (every other product float), its
   largest error over the frames;
2. every layer at 8 bits (the first and last layers float, as `compile_partition` keeps them), then
   the most sensitive layer widened to 16 bits, then the next, until every frame is within `limit`;
3. the layers' errors interact (widening one can raise the total), so each wide layer, the least
   sensitive first, goes back to 8 bits where the frames stay within `limit` without it.

A layer is a source conv: the lowering names its products `LAYER/tapK/…`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..partition import Partition
from ..runtime import create_session
from ..verify import relative_error
from .segment_int8 import (accelerator_inputs, activation_ranges, first_and_last_products, layer_products,
                           quantize_qdq, run_segments, segment_sessions, weight_products)

LIMIT = 0.02  # the largest error relative to an output's magnitude that int8 is held to (base.TOLERANCE)


@dataclass
class Plan:
    wide: list[str]  # the layers that keep 16-bit activations, the most sensitive first
    errors: list[float]  # the largest error over the frames: every layer at 8 bits, then after each widening
    # and each layer put back to 8 bits
    sensitivity: dict[str, float]  # each layer alone at 8 bits, every other float; the most sensitive first


def choose_wide_layers(parts: Partition, calibration: Iterable[Mapping[str, np.ndarray]], limit: float = LIMIT,
                       log: Callable[[str], None] = lambda line: None) -> Plan:
    """The fewest layers, most sensitive first, that must read 16-bit activations for the partition's
    int8 nna segments to stay within `limit` on every calibration frame (module docstring)."""
    frames = list(calibration)
    sessions = segment_sessions(parts)
    expected = [run_segments(parts, sessions, feeds) for feeds in frames]  # in float; every segment's inputs too
    runs = [accelerator_inputs(parts, values) for values in expected]
    samples = {index: [run[index] for run in runs] for index in runs[0]} if runs else {}
    segments = {index: parts.segment_model(index) for index in samples}
    products = {index: weight_products(model) for index, model in segments.items()}
    ranges = {index: activation_ranges(segments[index], samples[index], products[index]) for index in segments}
    edges = first_and_last_products(parts.graph)
    layers = layer_products([p for index in segments for p in products[index] if p not in edges])
    outputs = list(parts.graph.graph_outputs)

    def error(quantized: set[str], wide: set[str]) -> float:
        """The largest error over frames and float outputs with `quantized` products in QDQ form."""
        for index, model in segments.items():
            sessions[index] = create_session(quantize_qdq(model, samples[index], set(products[index]) - quantized,
                                                          8, ranges[index], wide))
        worst = 0.0
        for feeds, want in zip(frames, expected):
            got = run_segments(parts, sessions, feeds)
            worst = max([worst, *(relative_error(got[name], want[name]) for name in outputs
                                  if want[name].dtype.kind == "f")])
        return worst

    def widened(chosen: list[str]) -> set[str]:
        return {p for layer in chosen for p in layers[layer]}

    sensitivity = {}
    for layer, members in layers.items():
        sensitivity[layer] = error(set(members), set())
        log(f"{layer} alone at 8 bits: {100 * sensitivity[layer]:.2f} %")
    ranked = sorted(sensitivity, key=sensitivity.get, reverse=True)
    everything = {p for members in layers.values() for p in members}
    errors = [error(everything, set())]
    log(f"every layer at 8 bits: {100 * errors[-1]:.2f} %")
    wide: list[str] = []
    while errors[-1] > limit and len(wide) < len(ranked):
        wide.append(ranked[len(wide)])
        errors.append(error(everything, widened(wide)))
        log(f"{len(wide)} wide ({wide[-1]} added): {100 * errors[-1]:.2f} %")
    if errors[-1] <= limit:
        for layer in reversed(list(wide)):
            fewer = [other for other in wide if other != layer]
            without = error(everything, widened(fewer))
            log(f"without {layer}: {100 * without:.2f} %{' (back to 8 bits)' if without <= limit else ''}")
            if without <= limit:
                wide, errors = fewer, [*errors, without]
    return Plan(wide, errors, {layer: sensitivity[layer] for layer in ranked})
