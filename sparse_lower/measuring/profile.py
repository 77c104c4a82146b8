"""Where a lowered network's time goes: onnxruntime's own per-node profile of a few runs, summed per op
type and per layer, so that the next optimisation is chosen from data (the benchmark prints it for the
networks).

A layer is the first part of a node's name: the lowering names a sparse layer's nodes `LAYER/…`, so a
conv's index table and its `IndexedConv` add up under the conv's name; the ops a model holds between
layers (a `Relu` or `Add` left unfused, the final `Reshape`) are layers of their own.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections import Counter

import onnx

from ..runtime import create_session


def profile(lowered: onnx.ModelProto, feeds: dict, options, runs: int = 3) -> dict:
    """{"total_ms", "by_op": {op: ms}, "by_layer": {layer: ms}, "by_node": {node: ms}}: kernel time per run
    (the mean of `runs` after a warm-up), in `options`' session settings (threads)."""
    with tempfile.TemporaryDirectory() as scratch:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(scratch, "profile")
        session = create_session(lowered, sess_options=options)
        session.run(None, feeds)  # a warm-up, left out below
        for _ in range(runs):
            session.run(None, feeds)
        with open(session.end_profiling()) as file:
            events = json.load(file)
    by_op: Counter = Counter()
    by_layer: Counter = Counter()
    by_node: Counter = Counter()
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    first_run = _runs_start(events)
    for event in kernels:
        if event["ts"] < first_run:
            continue
        ms = event["dur"] / 1e3 / runs
        by_op[event["args"]["op_name"]] += ms
        by_layer[_layer(event)] += ms
        by_node[_node(event)] += ms
    return {"total_ms": sum(by_op.values()), "by_op": dict(by_op.most_common()),
            "by_layer": dict(by_layer.most_common()), "by_node": dict(by_node)}


def layers_per_run(events: list[dict]) -> list[dict[str, float]]:
    """ms per layer of each model run in a profile's `events`, in run order: for runs interleaved with
    other work (a peer's run between two of ours), where a mean over a block of runs would not pair them."""
    starts = _run_starts(events)
    runs: list[Counter] = [Counter() for _ in starts]
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            run = bisect.bisect_right(starts, event["ts"]) - 1
            runs[run][_layer(event)] += event["dur"] / 1e3
    return [dict(run) for run in runs]


def _runs_start(events: list[dict]) -> float:
    """The start (µs) of the second model run in the profile: the first is the warm-up."""
    starts = _run_starts(events)
    return starts[1] if len(starts) > 1 else 0.0


def _run_starts(events: list[dict]) -> list[float]:
    """The start (µs) of every model run in the profile, in order."""
    return sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")


def _node(event: dict) -> str:
    """The node of a kernel event, as the model names it: onnxruntime names a node it made by fusing others
    (a MatMul and the Add after it) "fused " and the first one's name."""
    return event["name"].removesuffix("_kernel_time").removeprefix("fused ")


def _layer(event: dict) -> str:
    """The layer of a node's kernel event: the first part of the node's name."""
    return _node(event).split("/")[0]
