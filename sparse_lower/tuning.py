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

So tuning never makes a model slower on the frames it was tuned on. The choice travels in the model's
recorded options (`layer_strategies`), which `sparse-lower inspect` prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx

from .api import lower
from .bench.profile import profile
from .bench.systems import session_options
from .bench.timing import alternating_runs
from .errors import SparseLowerError
from .importers import SOURCE_FORMAT, detect_format, import_model
from .model_io import load
from .onnx_conventions import SOURCE_DOMAIN
from .runtime import create_session
from .schemas import CONV_OPS

FORMS = ("fused", "rulebook", "unfold")  # the gpu compute forms a conv is timed in


GAIN = 0.2  # a conv is a candidate where another form's kernels took at most 1 - GAIN of its fused time
MARGIN = 0.03  # and is kept where the whole model took at most 1 - MARGIN of its time without it: less is noise


@dataclass
class Tuning:
    """What `tune` measured: per conv, its kernel ms over the frames in each form (`layer_ms`); the forms
    kept (`choices`, the convs not fused); and the whole model's median ms over the frames for each
    candidate tried ({"conv: form": [ms without it, ms with it]}, `tried`)."""

    layer_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    tried: dict[str, list[float]] = field(default_factory=dict)


def tune(model: onnx.ModelProto | str | os.PathLike, frames: list[dict[str, np.ndarray]], *, threads: int = 2,
         repeat: int = 3, log=lambda line: None) -> tuple[onnx.ModelProto, Tuning]:
    """(lowered, tuning): `model` (source ops, or an exporter's file: imported first) lowered for the gpu
    target with each conv in the form that made the whole model fastest on `frames` (feeds of the model's
    inputs), with `threads` threads; `repeat` profiled runs per frame and form, 2·repeat + 1 timed runs
    over the frames per candidate (module docstring)."""
    source = load(model)
    if detect_format(source) != SOURCE_FORMAT:
        source = import_model(source)
    if not frames:
        raise SparseLowerError("no frames to tune on", fix="give one or more frames of the model's inputs")
    convs = [n.name for n in source.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS]
    found = Tuning(layer_ms={conv: {} for conv in convs})
    for form in FORMS:
        lowered = lower(source, target="gpu", strategy=form)
        by_node: dict[str, float] = {}
        for feeds in frames:
            for node, ms in profile(lowered, feeds, session_options(threads), runs=repeat)["by_node"].items():
                by_node[node] = by_node.get(node, 0.0) + ms
        for conv in convs:
            found.layer_ms[conv][form] = sum(ms for node, ms in by_node.items() if node.split("/")[0] == conv)
    savings = {}
    for conv, times in found.layer_ms.items():
        best = min(FORMS, key=times.get)
        if times[best] <= (1 - GAIN) * times["fused"]:
            savings[(conv, best)] = times["fused"] - times[best]
    best_model = lower(source, target="gpu")
    for conv, form in sorted(savings, key=savings.get, reverse=True):
        trial = lower(source, target="gpu", layer_strategies={**found.choices, conv: form})
        sessions = [create_session(m, sess_options=session_options(threads)) for m in (best_model, trial)]
        without, with_it = alternating_runs({i: lambda s=session: [s.run(None, feeds) for feeds in frames]
                                             for i, session in enumerate(sessions)}, 2 * repeat + 1).values()
        found.tried[f"{conv}: {form}"] = [without, with_it]
        kept = with_it < (1 - MARGIN) * without
        log(f"{conv} {form}: {with_it:.1f} ms against {without:.1f} ms over the frames"
            f"{' (kept)' if kept else ''}")
        if kept:
            found.choices[conv], best_model = form, trial
    return best_model, found
