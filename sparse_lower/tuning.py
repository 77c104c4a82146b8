"""`tune`: the gpu compute form of each sparse conv chosen by timing it on this machine, on the user's frames.

Why: `strategy="auto"` gives every conv the fused form, which won every layer the benchmark measures on
the development machines (lowering/gpu/compute.py), but a conv's best form depends on its shape, its
frames' density and the CPU. So:

1. each conv is timed in every form (fused, rulebook, unfold) in onnxruntime's profile of the whole
   model on the frames (a conv's kernels are the nodes named after it: its compute and the tables only
   it builds);
2. a conv whose kernels ran at least `GAIN` faster in another form is a candidate. A conv's own kernels
   do not settle it (on the sparse UNet, on the 2-core development machine under load, taking each
   conv's fastest form at once made the whole model 1.7× slower: the small layers' times are within
   the profile's noise), so each candidate, the largest saving first, is switched on its own and kept
   only where the whole model, timed against the model without it with the two taking turns, got
   faster by more than `MARGIN`.

With calibration frames, 8 bits is one more form of the fused convs (IndexedConvInt8, quantization/gpu.py):
3. every fused conv whose input rows the calibration allows is timed at 8 bits in the profile of the
   tuned model quantized as a whole; those whose kernels ran at least `GAIN` faster than in float are the
   candidates (on a CPU without VNNI the narrow layers' 8-bit kernels gain little);
4. among them, with an `int8_limit`, the ones that would take the outputs past it on the calibration
   frames stay float (quantize's search);
5. the rest go to 8 bits together, kept only where the whole model, timed against the float one taking
   turns, got faster by more than `MARGIN`: one trial, not one per conv, for the whole-model timings
   are what tuning costs.

So tuning never makes a model slower on the frames it was tuned on. The forms travel in the model's
recorded options (`layer_strategies`), which `sparse-lower inspect` prints; the 8-bit convs are its
IndexedConvInt8 nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx

from .api import lower
from .errors import SparseLowerError
from .frames.files import feeds_given
from .importers import SOURCE_FORMAT, detect_format, import_model
from .measuring.profile import profile
from .measuring.timing import alternating_runs, session_options
from .model_io import load
from .onnx_conventions import CUSTOM_DOMAIN, SOURCE_DOMAIN
from .quantization.gpu import quantize
from .runtime import create_session
from .schemas import CONV_OPS

FORMS = ("fused", "rulebook", "unfold")  # the gpu compute forms a conv is timed in
INT8 = "int8"  # the fused form at 8 bits, timed with calibration frames


GAIN = 0.2  # a conv is a candidate where another form's kernels took at most 1 - GAIN of its fused time
MARGIN = 0.03  # and is kept where the whole model took at most 1 - MARGIN of its time without it: less is noise


@dataclass
class Tuning:
    """What `tune` measured: per conv, its kernel ms over the frames in each form (`layer_ms`, with
    `INT8` where it was timed at 8 bits); the forms kept (`choices`, the convs not fused); the whole
    model's median ms over the frames for each candidate tried ({"conv: form": [ms without it, ms with
    it]}, `tried`); the IndexedConv nodes put at 8 bits (`int8_convs`) and those left float with the
    reason (`float_convs`), with calibration frames."""

    layer_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    tried: dict[str, list[float]] = field(default_factory=dict)
    int8_convs: list[str] = field(default_factory=list)
    float_convs: dict[str, str] = field(default_factory=dict)


def tune(model: onnx.ModelProto | str | os.PathLike, frames: list[dict[str, np.ndarray]], *, threads: int = 2,
         repeat: int = 3, calibration_frames: list[dict[str, np.ndarray]] | None = None,
         int8_limit: float | None = None, int8_headroom: float = 1.0, int8_weight_bits: int = 7,
         log=lambda line: None) -> tuple[onnx.ModelProto, Tuning]:
    """(lowered, tuning): `model` (source ops, or an exporter's file: imported first) lowered for the gpu
    target with each conv in the form that made the whole model fastest on `frames` (feeds of the model's
    inputs), with `threads` threads; `repeat` profiled runs per frame and form, 2·repeat + 1 timed runs
    over the frames per candidate. With `calibration_frames` the fused convs may also take 8 bits,
    calibrated on them, within `int8_limit` of float there, with `int8_headroom` and `int8_weight_bits`
    (as `quantize`'s `limit`, `headroom` and `weight_bits`), where that made the model faster on `frames`
    (module docstring)."""
    source = load(model)
    if detect_format(source) != SOURCE_FORMAT:
        source = import_model(source)
    frames = feeds_given(source, frames)
    if calibration_frames is not None:
        calibration_frames = feeds_given(source, calibration_frames, "calibration_frames")
    if not frames:
        raise SparseLowerError("no frames to tune on", fix="give one or more frames of the model's inputs")
    convs = [n.name for n in source.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS]
    found = Tuning(layer_ms={conv: {} for conv in convs})
    for form in FORMS:
        by_layer = kernel_ms(lower(source, target="gpu", strategy=form), frames, threads, repeat)
        for conv in convs:
            found.layer_ms[conv][form] = by_layer.get(conv, 0.0)
    savings = {}
    for conv, times in found.layer_ms.items():
        best = min(FORMS, key=times.get)
        if times[best] <= (1 - GAIN) * times["fused"]:
            savings[(conv, best)] = times["fused"] - times[best]
    best_model = lower(source, target="gpu")

    def faster(trial: onnx.ModelProto, what: str) -> bool:
        """Whether `trial` ran the frames faster than `best_model` by more than MARGIN, the two taking turns."""
        sessions = [create_session(m, sess_options=session_options(threads)) for m in (best_model, trial)]
        without, with_it = alternating_runs({i: lambda s=session: [s.run(None, feeds) for feeds in frames]
                                             for i, session in enumerate(sessions)}, 2 * repeat + 1).values()
        found.tried[what] = [without, with_it]
        kept = with_it < (1 - MARGIN) * without
        log(f"{what}: {with_it:.1f} ms against {without:.1f} ms over the frames{' (kept)' if kept else ''}")
        return kept

    for conv, form in sorted(savings, key=savings.get, reverse=True):
        trial = lower(source, target="gpu", layer_strategies={**found.choices, conv: form})
        if faster(trial, f"{conv}: {form}"):
            found.choices[conv], best_model = form, trial
    if calibration_frames is None or not any(n.op_type == "IndexedConv" and n.domain == CUSTOM_DOMAIN
                                             for n in best_model.graph.node):
        return best_model, found  # no 8 bits asked for, or no fused conv to take them
    quantized, calibration = quantize(best_model, calibration_frames, headroom=int8_headroom,
                                      weight_bits=int8_weight_bits)
    found.float_convs = calibration.float_convs
    int8_ms = kernel_ms(quantized, frames, threads, repeat)
    candidates = []
    for name in calibration.tops:
        conv = name.split("/")[0]
        found.layer_ms[conv][INT8] = int8_ms[conv]
        if int8_ms[conv] <= (1 - GAIN) * found.layer_ms[conv]["fused"]:
            candidates.append(name)
        else:
            found.float_convs[name] = f"its kernels were not {GAIN:.0%} faster at 8 bits on the frames"
    quantized, calibration = quantize(best_model, calibration_frames, limit=int8_limit, headroom=int8_headroom,
                                      convs=candidates, weight_bits=int8_weight_bits, log=log)
    found.float_convs.update({name: why for name, why in calibration.float_convs.items() if name in candidates})
    count = len(calibration.tops)
    if count and faster(quantized, f"{count} conv{'s' if count != 1 else ''}: {INT8}"):
        found.int8_convs, best_model = list(calibration.tops), quantized
    else:
        found.float_convs.update({name: "the whole model was not faster with them at 8 bits"
                                  for name in calibration.tops})
    return best_model, found


def kernel_ms(lowered: onnx.ModelProto, frames: list[dict[str, np.ndarray]], threads: int,
              repeat: int) -> dict[str, float]:
    """Per layer (a node's name up to its first "/"), its kernels' ms in the profile of `lowered` summed
    over `frames`, `repeat` runs each."""
    found: dict[str, float] = {}
    for feeds in frames:
        for node, ms in profile(lowered, feeds, session_options(threads), runs=repeat)["by_node"].items():
            layer = node.split("/")[0]
            found[layer] = found.get(layer, 0.0) + ms
    return found
