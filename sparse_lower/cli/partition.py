"""sparse-lower partition."""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np

from ..api import partition
from ..errors import SparseLowerError
from ..frames.files import feeds_of, read_frames
from ..partition import DEFAULT_DEVICES
from ..partition.devices import ACCELERATOR
from ..partition.segment_files import custom_ops
from ..report import render
from ..runtime import create_session
from ..toolchains import TOOLCHAINS, compile_partition, toolchain
from ..quantization.mixed_precision import choose_wide_layers
from ..verify import relative_error
from .active import add_active_argument
from .outputs import output_folder
from .status import Status
from .verbosity import Verbosity


class PartitionCommand:
    """Cut a lowered ONNX model into device segments and write one model per segment.

    Every node goes to the first device of --devices that can run it:
      nna  a neural-network accelerator: dense float compute (Conv, MatMul, Gemm, Add, Mul, Relu,
           Gather, ScatterND, Reshape, Transpose, Concat, Slice, Pad, ...) on float tensors of static
           shape; no hash tables, no index (int64) arithmetic, no custom ops;
      gpu  every standard ONNX op and the sparse_lower custom ops (index builders, IndexedUnfold,
           IndexedFold, IndexedConv);
      cpu  the same as gpu: the fallback.
    Unlowered `sparse` source ops run nowhere: lower the model first (sparse-lower convert).
    Segments are runs of one device in a topological order, merged while no cycle forms, so they
    run one after the other.

    Files written into --out-dir: NN_DEVICE.onnx per segment (00_gpu.onnx, 01_nna.onnx, ...; each a
    valid ONNX model with the source's opsets, its own weights and typed inputs/outputs),
    manifest.json (the segments in order with their nodes, and for every tensor crossing segments
    where it comes from and which segments read it), and with --picture picture.png (the segments in
    one lane per device). The table printed lists per segment its ops, multiply-accumulates and the
    bytes crossing in and out ("?" where shapes are dynamic; --inputs runs the segments on an .npz
    of graph inputs to measure them and checks the outputs equal the unpartitioned model's), then
    each sparse layer's multiply-accumulates per lowering method at --active sites (by default the
    model's max_active for its first level, else 500).

    --for TOOLCHAIN also compiles every nna segment with an accelerator toolchain (onnxruntime, openvino,
    tvm, rknn, tflite, qnn; each but onnxruntime a pip extra: docs/toolchains.md) and writes its artifact
    next to the segment (NN_nna.xml, .so, .rknn, .tflite, .qnn); --calibrate FRAME.npz ... quantizes those
    segments to int8 first, calibrated on the frames (--activation-bits 16: int8 weights and int16
    activations; --wide-layers A,B: those layers int16, the rest int8; --wide-layers auto: the fewest
    such layers, chosen by measuring each layer on the calibration frames, that keep them within 2 %;
    for qnn, 1.5 % in onnxruntime, as its HTP computes the same files further off).
    --inputs then runs the host segments in onnxruntime and the nna segments in the toolchain's runtime,
    and compares with the unpartitioned model within the toolchain's precision (1e-4 relative for fp32,
    5e-3 for fp16, 2e-2 for int8).
    Ops the toolchain placed off its accelerator are listed, and where the toolchain reports placement
    (rknn, qnn) how many ops of each segment ran on each unit.

    example: sparse-lower partition model.nna.onnx --out-dir segments --picture
    example: sparse-lower partition model.nna.onnx --out-dir segments --for openvino --inputs frame.npz
    """

    name = "partition"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("input", help="lowered ONNX model")
        parser.add_argument("--out-dir", required=True, help="folder for the segment models and manifest.json")
        parser.add_argument("--devices", default=",".join(DEFAULT_DEVICES),
                            help=f"devices in order of preference (default {','.join(DEFAULT_DEVICES)})")
        parser.add_argument("--dynamic", action="store_true",
                            help="let the nna take tensors with symbolic shapes (static_shapes=False)")
        parser.add_argument("--picture", action="store_true", help="also draw picture.png (needs matplotlib)")
        add_active_argument(parser)
        parser.add_argument("--inputs", help=".npz of graph inputs: run the segments and compare")
        parser.add_argument("--for", dest="toolchain", choices=list(TOOLCHAINS),
                            help="compile the nna segments with this accelerator toolchain")
        parser.add_argument("--calibrate", nargs="+", metavar="FRAME.npz",
                            help="with --for: quantize the nna segments to int8, calibrated on these inputs")
        parser.add_argument("--activation-bits", type=int, choices=(8, 16), default=8,
                            help="with --calibrate: activations in int8 (default) or int16 (weights stay int8)")
        parser.add_argument("--wide-layers", metavar="LAYER,...|auto",
                            help="with --calibrate: these layers read 16-bit activations, the rest --activation-bits; "
                                 "auto: the fewest that keep the calibration frames within 2 %% (measured; qnn 1.5 %%)")
        parser.add_argument("--reasons", action="store_true",
                            help="list the nodes that did not get the first device, and why")

    def run(self, args, out: Verbosity) -> int:
        devices = [device.strip() for device in args.devices.split(",") if device.strip()]
        for option, given in (("--activation-bits", args.activation_bits != 8), ("--wide-layers", args.wide_layers)):
            if given and not args.calibrate:
                raise SparseLowerError(f"{option} quantizes, and quantizing needs calibration frames",
                                       fix="add --calibrate FRAME.npz ...")
        if args.calibrate and not args.toolchain:
            raise SparseLowerError("--calibrate quantizes for a toolchain",
                                   fix="add --for TOOLCHAIN (e.g. --for onnxruntime)")
        # the frames are read before any work: a wrong path or a damaged file is said now
        calibration = read_frames(args.calibrate) if args.calibrate else []
        inputs = read_frames([args.inputs], folders=False) if args.inputs else []
        output_folder(args.out_dir, "--out-dir", out, make=False)  # made once nothing is refused
        status = Status(out.quiet)
        with status.step("partitioning"):
            parts = partition(args.input, devices=devices, static_shapes=not args.dynamic)
        if args.toolchain and not any(s.device == ACCELERATOR for s in parts.segments):
            raise SparseLowerError(f"--for {args.toolchain} compiles the {ACCELERATOR} segments, and this model has "
                                   f"none: its ops all run on {', '.join(sorted({s.device for s in parts.segments}))}",
                                   fix="lower the model for the accelerator first: sparse-lower convert MODEL "
                                       f"-o MODEL.{ACCELERATOR}.onnx --target {ACCELERATOR} --max-active N (or "
                                       "--target hybrid), then partition that file")
        calibration_feeds = feeds_of(parts.model, calibration)
        (feeds,) = feeds_of(parts.model, inputs) or [None]
        wide = [layer.strip() for layer in (args.wide_layers or "").split(",") if layer.strip()]
        samples = None  # what the nna segments read on the calibration frames, once the search has run them
        if wide == ["auto"]:
            with status.step("choosing the wide layers on the calibration frames"):
                plan = choose_wide_layers(parts, calibration_feeds, log=out.say,
                                          form=toolchain(args.toolchain).int8_form())
            print(f"wide layers (16-bit activations): {','.join(plan.wide) or 'none'}, {len(plan.wide)} of "
                  f"{len(plan.sensitivity)}; the calibration frames within {100 * plan.errors[-1]:.2f} % "
                  f"in onnxruntime")
            wide, samples = plan.wide, plan.samples
        output_folder(args.out_dir, "--out-dir", out)
        if args.toolchain:
            with status.step(f"compiling the {ACCELERATOR} segments with {args.toolchain}"), \
                    out.captured():  # the toolchain's own build log: shown with -v
                compiled = compile_partition(parts, args.toolchain, args.out_dir, calibration_feeds or None,
                                             args.activation_bits, wide, samples)
            manifest = compiled.directory / "manifest.json"
        else:
            compiled, manifest = None, parts.to_onnx(args.out_dir)
        code = 0
        if feeds is not None:
            with status.step("running the --inputs frame through the whole model and the segments"):
                session = create_session(parts.model)
                expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
                if compiled is None:
                    got = parts.run(feeds)
                else:
                    with out.captured():
                        got = compiled.run(feeds)
            code = _compared(got, expected) if compiled is None else _within(compiled, got, expected)
        if compiled is not None:
            for segment, op, unit, name in compiled.fallbacks:
                out.say(f"{compiled.toolchain.title} placed {op} '{name}' of segment {segment:02d} on its {unit}")
        if args.reasons:
            out.say(reasons_table(parts, devices[0]))
        out.say(parts.summary(args.active, ops=None if out.verbose else 2))  # every op type with -v
        out.say(library_said(parts))
        out.say(DEVICES_SAID)
        if compiled is not None:
            for entry in compiled.manifest["segments"]:
                if "artifact" in entry:
                    units = Counter(unit for _, unit, _ in entry["placement"])
                    placed = f" ({', '.join(f'{n} ops on its {unit}' for unit, n in units.items())})" if units else ""
                    print(f"compiled segment {entry['index']:02d} ({entry['device']}) with {compiled.toolchain.name} "
                          f"{compiled.manifest['toolchain']['version']} ({compiled.precision_said}): "
                          f"{compiled.directory / entry['artifact']}{placed}")
        count = len(parts.segments)
        print(f"wrote {count} segment{'s' if count != 1 else ''} and {manifest}")
        if args.picture:
            print(f"wrote {parts.save_picture(Path(args.out_dir) / 'picture.png')}")
        return code


# what the table's device names mean (docs/partitioning.md)
DEVICES_SAID = ("devices: gpu = onnxruntime with the custom-op library, on the host (its CPU, or its GPU)\n"
                "         nna = the accelerator (--for compiles its segments); cpu = the fallback")


def library_said(parts) -> str:
    """Which segments need the custom-op library (the manifest's needs_library), and the ops they need it for."""
    needing = [f"{s.index:02d} ({', '.join(ops)})" for s in parts.segments if (ops := custom_ops(parts.graph, s))]
    if not needing:
        return "library: no segment runs a custom op; any ONNX runtime runs each of them, no library registered"
    said = (f"segment{'s' if len(needing) > 1 else ''} {', '.join(needing)} need{'' if len(needing) > 1 else 's'} "
            f"the custom-op library; the others run in any ONNX runtime")
    return textwrap.fill(said, 100, initial_indent="library: ", subsequent_indent=" " * 9)  # the table's width


def _compared(got: dict, expected: dict) -> int:
    different = [name for name, value in expected.items() if not np.array_equal(value, got[name])]
    print("run: outputs differ from the unpartitioned model: " + ", ".join(different) if different
          else "run: outputs equal the unpartitioned model")
    return 1 if different else 0


def _within(compiled, got: dict, expected: dict) -> int:
    """Compare the run across runtimes with the unpartitioned model, within the toolchain's precision."""
    tolerance = compiled.toolchain.tolerance
    status = 0
    for name, value in expected.items():
        error = relative_error(got[name], value)
        worse = error > tolerance
        status |= worse
        print(f"run ({compiled.toolchain.title}, {compiled.precision_said}): {name}: max error {error:.2e} "
              f"relative to its largest magnitude ({'above' if worse else 'within'} {tolerance:g})")
    return int(status)


def reasons_table(parts, first: str) -> str:
    """Why nodes did not get the first device: one row per distinct reason (the tensor a reason names
    left out), with how many nodes share it and a few of them: a lowered backbone has a hundred index
    nodes refused for the same reason."""
    groups: dict[tuple[str, str], list[str]] = {}
    for node, device in parts.assignment.items():
        if device != first:
            reason = re.sub(r" \('[^']*'\)|'[^']*'", "", parts.reasons[node][first]).replace("  ", " ")
            groups.setdefault((device, reason), []).append(node)
    rows = [[len(nodes), device, reason, ", ".join(nodes[:3]) + (f", … ({len(nodes) - 3} more)" if len(nodes) > 3
                                                                 else "")]
            for (device, reason), nodes in sorted(groups.items(), key=lambda item: -len(item[1]))]
    return render(["nodes", "device", f"why not {first}", "for example"], rows)
