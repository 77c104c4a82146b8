"""The recommended w8a8 form of a real-frame network (docs/toolchains.md, mixed precision): the layers
that must keep 16-bit activations for its int8 nna segments to stay within 2 % on both nuScenes frames,
chosen by `sparse_lower.quantization.choose_wide_layers` (each layer's sensitivity alone
at 8 bits, then the most sensitive widened one by one), then the partition compiled that way in
onnxruntime and each toolchain given, measured on each frame beside int8 everywhere and w8a16
everywhere: max error relative to the output's largest magnitude, and onnxruntime's median time.

    python tools/mixed_precision.py [--model "CenterPoint backbone"|"sparse UNet"] [--toolchains openvino tvm]
                                    [--wide LAYER,...]

The gather combine in the rows layout, at a capacity per level that both frames fit, calibrated on both
frames (the frames measured): a selection on calibration frames, as a deployment makes it on its own.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import sparse_lower
from sparse_lower.bench.run import alternating_runs
from sparse_lower.report import render
from sparse_lower.lowering import COMBINES
from sparse_lower.toolchains import compile_partition, toolchain
from sparse_lower.quantization import QuantizedRuns, choose_wide_layers
from sparse_lower.verify import relative_error
from toolchain_table import FRAMES, capacities_for, frame, real_models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="CenterPoint backbone", choices=[name for name, _ in real_models()])
    parser.add_argument("--combine", default="gather", choices=COMBINES)
    parser.add_argument("--toolchains", nargs="*", default=["openvino"], choices=["openvino", "tvm", "qnn"],
                        help="qnn: the plan chosen in QNN's form (every tensor quantized; --combine unfold), "
                             "measured there and in onnxruntime")
    parser.add_argument("--repeat", type=int, default=3, help="onnxruntime runs timed per form and frame")
    parser.add_argument("--wide", help="LAYER,...: measure these wide layers instead of choosing them")
    args = parser.parse_args()
    model = dict(real_models())[args.model]
    frames = [frame(name) for name in FRAMES]
    capacity = capacities_for(model, frames)
    lowered = sparse_lower.lower(model, target="nna", combine=args.combine, max_active=capacity, layout="rows")
    parts = sparse_lower.partition(lowered)
    print(f"{args.model}, {args.combine} combine, capacity per level {capacity}; calibrated on "
          f"{' and '.join(FRAMES)}", flush=True)
    if "qnn" in args.toolchains:
        measure_qnn(lowered, parts, frames, args.wide)
        return
    if args.wide is None:
        plan = choose_wide_layers(parts, frames, log=lambda line: print(f"  {line}", flush=True))
        wide = plan.wide
        print(f"wide: {len(wide)} of {len(plan.sensitivity)} quantized layers ({', '.join(wide) or 'none'}); "
              f"the first and last layers float", flush=True)
    else:
        wide = [layer for layer in args.wide.split(",") if layer]
    session = sparse_lower.create_session(lowered)
    names = [output.name for output in session.get_outputs()]
    expected = [dict(zip(names, session.run(None, feeds))) for feeds in frames]
    forms = {"fp32": {}, "int8": {"activation_bits": 8}, f"w8a8, {len(wide)} wide": {"wide_layers": wide},
             "w8a16": {"activation_bits": 16}}
    rows, in_onnxruntime = [], {}
    for title, options in forms.items():
        calibration = frames if options else None
        for chain in ["onnxruntime", *args.toolchains]:
            compiled = compile_partition(parts, chain, tempfile.mkdtemp(prefix="mixed-"), calibration, **options)
            if chain == "onnxruntime":
                in_onnxruntime[title] = compiled
            rows.append([title, chain, *(f"{100 * error:.2f} %" for error in frame_errors(compiled, frames, expected))])
            print(" | ".join(rows[-1]), flush=True)
    print(render(["form", "runtime", *FRAMES], rows))
    for name, feeds in zip(FRAMES, frames):
        times = alternating_runs({title: lambda c=compiled: c.run(feeds) for title, compiled in in_onnxruntime.items()},
                                 args.repeat)
        print(f"{name}, onnxruntime ms (median of {args.repeat}, the forms taking turns): "
              + ", ".join(f"{title} {ms:,.0f}" for title, ms in times.items()))


def frame_errors(compiled, frames: list[dict], expected: list[dict]) -> list[float]:
    """Per frame, the largest error of a compiled partition's float outputs relative to their magnitude."""
    errors = []
    for feeds, want in zip(frames, expected):
        got = compiled.run(feeds)
        errors.append(max(relative_error(got[n], want[n]) for n in want if want[n].dtype.kind == "f"))
    return errors


def measure_qnn(lowered, parts, frames: list[dict], wide_given: str | None) -> None:
    """The plan in QNN's whole-graph form: int8 everywhere, the plan and w8a16 in onnxruntime (QNN's QDQ
    files on the CPU), then the plan compiled for the HTP and run there (simulated), timed."""
    qnn = toolchain("qnn").int8_form()
    runs = QuantizedRuns(parts, frames, qnn)
    if wide_given is None:
        plan = choose_wide_layers(parts, frames, log=lambda line: print(f"  {line}", flush=True), runs=runs)
        wide = plan.wide
    else:
        wide = [layer for layer in wide_given.split(",") if layer]
    layers = list(runs.layers)
    print(f"wide: {len(wide)} of {len(layers)} quantized layers ({', '.join(wide) or 'none'}); the first and last "
          f"layers wide too (16-bit tensors and weights)", flush=True)
    rows = [["int8 everywhere", "onnxruntime", *runs.errors(layers)],
            [f"w8a8, {len(wide)} wide", "onnxruntime", *runs.errors(layers, wide)],
            ["16 bits everywhere", "onnxruntime", *runs.errors(layers, layers)]]
    for row in rows:
        print(" | ".join([*row[:2], *(f"{100 * e:.2f} %" for e in row[2:])]), flush=True)
    started = time.perf_counter()
    compiled = compile_partition(parts, qnn, tempfile.mkdtemp(prefix="mixed-qnn-"), frames, wide_layers=wide)
    built = time.perf_counter() - started
    session = sparse_lower.create_session(lowered)
    names = [output.name for output in session.get_outputs()]
    expected = [dict(zip(names, session.run(None, feeds))) for feeds in frames]
    started = time.perf_counter()
    errors = frame_errors(compiled, frames, expected)
    rows.append([f"w8a8, {len(wide)} wide", "QNN HTP (simulated)", *errors])
    print(render(["form", "runtime", *FRAMES], [[*row[:2], *(f"{100 * e:.2f} %" for e in row[2:])] for row in rows]))
    print(f"QNN: compiled in {built:.0f} s, {(time.perf_counter() - started) / len(frames):.0f} s a frame in the "
          f"simulator; {len(compiled.fallbacks)} ops off the HTP")


if __name__ == "__main__":
    main()
