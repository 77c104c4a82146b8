"""int8 of the CenterPoint backbone on a frame outside calibration (docs/toolchains.md, int8): calibrated
on one nuScenes frame alone and measured on the other, both ways.

    python tools/int8_cross_calibration.py qnn [--margins FEATURES,WIDE,NARROW] [--curve] [--search]
    /path/to/rknn-venv/bin/python tools/int8_cross_calibration.py rknn [--wide LAYER,...]

qnn: QNN's whole-graph form (unfold combine) in onnxruntime on QNN's QDQ files, as the mixed-precision
search measures it: every layer at 16 bits and at 8; --curve each layer alone at 8 bits, then layers put
to 8 bits in the order of the error each adds per multiply-add (the trade-off of error against the
share of 8-bit work); --search the search's plan chosen on the calibration frame alone (up to 14 GB
beside --curve's runs). `--margins`:
the ranges' reach past the calibration frame's (htp.Margins; default QNN's own).
rknn: rknn-toolkit2's int8 (gather combine) in its simulator, the first and last layers and `--wide`
in float16 (hybrid quantization), run in an environment with rknn-toolkit2 (its numpy pin), with this
checkout on PYTHONPATH and SPARSE_LOWER_LIBRARY naming the built library.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

import onnx

import sparse_lower
from sparse_lower.quantization import QuantizedRuns, choose_wide_layers
from sparse_lower.quantization.htp import Margins
from sparse_lower.toolchains import compile_partition, toolchain
from sparse_lower.verify import relative_error
from toolchain_table import FRAMES, capacities_for, frame, real_models

WAYS = ((FRAMES[0], FRAMES[1]), (FRAMES[1], FRAMES[0]))  # (calibrated on, measured on)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("toolchain", choices=["qnn", "rknn"])
    parser.add_argument("--margins", help="FEATURES,WIDE,NARROW (qnn)")
    parser.add_argument("--curve", action="store_true")
    parser.add_argument("--search", action="store_true")
    parser.add_argument("--wide", default="", help="LAYER,...: rknn's layers in float16 beside the first and last")
    args = parser.parse_args()
    model = dict(real_models())["CenterPoint backbone"]
    frames = {name: frame(name) for name in FRAMES}
    capacity = capacities_for(model, list(frames.values()))
    combine = "unfold" if args.toolchain == "qnn" else "gather"
    lowered = sparse_lower.lower(model, target="nna", combine=combine, max_active=capacity, layout="rows")
    parts = sparse_lower.partition(lowered)
    if args.toolchain == "rknn":
        measure_rknn(lowered, parts, frames, [layer for layer in args.wide.split(",") if layer])
        return
    form = toolchain("qnn").int8_form()
    if args.margins:
        form = replace(form, margins=Margins(*map(float, args.margins.split(","))))
    print(f"{form.margins}", flush=True)
    runs = [QuantizedRuns(parts, [frames[measured]], form, calibration=[frames[calibrated]])
            for calibrated, measured in WAYS]
    layers = list(runs[0].layers)
    work = layer_work(runs[0])
    share = lambda narrow: sum(work[layer] for layer in narrow) / sum(work.values())  # noqa: E731

    def errors(narrow) -> list[float]:
        return [run.errors(layers, [layer for layer in layers if layer not in narrow])[0] for run in runs]

    def line(title: str, values: list[float]) -> None:
        print(f"{title}: " + " / ".join(f"{100 * value:.2f} %" for value in values), flush=True)

    print(f"calibrated on one frame, measured on the other: {WAYS[0][1]} / {WAYS[1][1]}; the quantized layers' "
          f"{sum(work.values()) / 1e9:.1f} G multiply-adds", flush=True)
    line("16 bits everywhere", errors([]))
    line("8 bits everywhere", errors(layers))
    if args.curve:
        floor = max(errors([]))
        alone = {}
        for layer in layers:
            alone[layer] = errors([layer])
            line(f"  {layer} alone at 8 bits ({100 * share([layer]):.1f} % of the work)", alone[layer])
        narrow = []
        for layer in sorted(layers, key=lambda layer: (max(alone[layer]) - floor) / work[layer]):
            narrow.append(layer)
            line(f"  {len(narrow)} at 8 bits (+{layer}), {100 * share(narrow):.1f} % of the work", errors(narrow))
    if args.search:
        for (calibrated, measured), run in zip(WAYS, runs):
            started = time.perf_counter()
            plan = choose_wide_layers(parts, [frames[calibrated]], form=form)
            narrow = [layer for layer in layers if layer not in plan.wide]
            print(f"search on {calibrated} alone ({time.perf_counter() - started:.0f} s): {len(plan.wide)} of "
                  f"{len(layers)} wide, at 8 bits {', '.join(narrow) or 'none'} ({100 * share(narrow):.1f} % of the "
                  f"work): {100 * plan.errors[-1]:.2f} % on it, {100 * run.errors(layers, plan.wide)[0]:.2f} % on "
                  f"{measured}", flush=True)


def layer_work(runs: QuantizedRuns) -> dict[str, int]:
    """Each quantized layer's multiply-adds at the segments' capacities: rows × K·Cin × Cout per product."""
    work: dict[str, int] = {}
    layer = {product: name for name, products in runs.layers.items() for product in products}
    for model in runs.segments.values():
        inferred = onnx.shape_inference.infer_shapes(model).graph
        rows = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*inferred.value_info,
                                                                                    *inferred.input]}
        columns = {t.name: t.dims[1] for t in model.graph.initializer if len(t.dims) == 2}
        for node in model.graph.node:
            if node.name in layer:
                count, depth = rows[node.input[0]]
                work[layer[node.name]] = work.get(layer[node.name], 0) + count * depth * columns[node.input[1]]
    return work


def measure_rknn(lowered, parts, frames: dict, wide: list[str]) -> None:
    session = sparse_lower.create_session(lowered)
    names = [output.name for output in session.get_outputs()]
    for calibrated, measured in WAYS:
        started = time.perf_counter()
        compiled = compile_partition(parts, "rknn", tempfile.mkdtemp(prefix="rknn-cross-"),
                                     calibration=[frames[calibrated]], wide_layers=wide)
        built = time.perf_counter() - started
        want = dict(zip(names, session.run(None, frames[measured])))
        got = compiled.run(frames[measured])
        error = max(relative_error(got[n], want[n]) for n in want if want[n].dtype.kind == "f")
        print(f"calibrated on {calibrated}, measured on {measured}: {100 * error:.2f} % (built {built:.0f} s, run "
              f"{time.perf_counter() - started - built:.0f} s; {len(compiled.fallbacks)} ops off the NPU)", flush=True)


if __name__ == "__main__":
    main()
