"""The recommended w8a8 form of a real-frame network (docs/toolchains.md, mixed precision): the layers
that must keep 16-bit activations for its int8 nna segments to stay within 2 % on both nuScenes frames,
chosen by `sparse_lower.toolchains.mixed_precision.choose_wide_layers` (each layer's sensitivity alone
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

import sparse_lower
from sparse_lower.bench.run import alternating_runs
from sparse_lower.report import render
from sparse_lower.toolchains import compile_partition
from sparse_lower.toolchains.mixed_precision import choose_wide_layers
from sparse_lower.verify import relative_error
from toolchain_table import FRAMES, capacities_for, frame, real_models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="CenterPoint backbone", choices=[name for name, _ in real_models()])
    parser.add_argument("--toolchains", nargs="*", default=["openvino"], choices=["openvino", "tvm"])
    parser.add_argument("--repeat", type=int, default=3, help="onnxruntime runs timed per form and frame")
    parser.add_argument("--wide", help="LAYER,...: measure these wide layers instead of choosing them")
    args = parser.parse_args()
    model = dict(real_models())[args.model]
    frames = [frame(name) for name in FRAMES]
    capacity = capacities_for(model, frames)
    lowered = sparse_lower.lower(model, target="nna", combine="gather", max_active=capacity, layout="rows")
    parts = sparse_lower.partition(lowered)
    print(f"{args.model}, capacity per level {capacity}; calibrated on {' and '.join(FRAMES)}", flush=True)
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
            cells = []
            for feeds, want in zip(frames, expected):
                got = compiled.run(feeds)
                error = max(relative_error(got[n], want[n]) for n in names if want[n].dtype.kind == "f")
                cells.append(f"{100 * error:.2f} %")
            rows.append([title, chain, *cells])
            print(" | ".join(rows[-1]), flush=True)
    print(render(["form", "runtime", *FRAMES], rows))
    for name, feeds in zip(FRAMES, frames):
        times = alternating_runs({title: lambda c=compiled: c.run(feeds) for title, compiled in in_onnxruntime.items()},
                                 args.repeat)
        print(f"{name}, onnxruntime ms (median of {args.repeat}, the forms taking turns): "
              + ", ".join(f"{title} {ms:,.0f}" for title, ms in times.items()))


if __name__ == "__main__":
    main()
