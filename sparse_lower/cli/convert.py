"""sparse-lower convert."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime.capi.onnxruntime_pybind11_state as ort_state

from ..api import TARGET_OPTIONS, load, lower, unread_option
from ..assumed_active import assumed_active, recorded_capacity
from ..errors import SparseLowerError
from ..frames.files import feeds_of, read_frames
from ..input_roles import input_roles
from ..importers import SOURCE_FORMAT, detect_format, format_title, import_model
from ..lowering import COMBINES, LAYOUTS, STRATEGIES, TABLES, TARGETS
from ..model_io import recorded_options
from ..onnx_conventions import IMPORT_KEY
from ..passes.bf16_convs import PRECISIONS
from ..tuning import FORMS as TUNED_FORMS, INT8
from ..tuning import tune
from ..passes.lower import run_hint
from ..quantization.gpu import quantize
from ..report import render
from ..runtime import create_session, fixed_rows, needs_library, runtime_refusal
from ..spconv_rules import LEAKY_RELU_ALPHA
from ..verify import compare, example_inputs, non_finite, relative_error, snr_db, tap_coverage
from .active import add_active_argument
from .counts import count
from .op_counts import before_after
from .status import Status
from .outputs import output_file, output_folder
from .verbosity import Verbosity


def capacities(text: str) -> int | tuple[int, ...]:
    """--max-active: "N", or "N1,N2,..." (one per level)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not N or N1,N2,... (positive integers)") from None
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"'{text}': capacities are >= 1")
    return values[0] if len(values) == 1 else values


def read_max_pairs(path: str) -> dict:
    """--max-pairs: the JSON object {conv name: [pairs per tap]} inspect writes (lower checks the names
    and counts against the model)."""
    try:
        value = json.loads(Path(path).read_text())
    except OSError as error:
        raise SparseLowerError(f"cannot read --max-pairs {path}: {error.strerror}", fix="give the JSON file "
                               "`sparse-lower inspect MODEL --frames ... --max-pairs-out FILE` wrote") from None
    except json.JSONDecodeError as error:
        raise SparseLowerError(f"--max-pairs {path} is not JSON ({error.msg}, line {error.lineno})",
                               fix="give the file `sparse-lower inspect --max-pairs-out` wrote") from None
    if not isinstance(value, dict):
        raise SparseLowerError(f"--max-pairs {path} holds a JSON {type(value).__name__}, not an object",
                               fix="give {\"conv name\": [pairs per tap, ...], ...}")
    return value


def _spelled(capacity) -> str:
    return ",".join(map(str, capacity)) if isinstance(capacity, tuple) else str(capacity)


class ConvertCommand:
    """Lower the sparse convolutions of an ONNX model for a target.

    Reads IN (source ops, docs/source_ops.md, or an NVIDIA Lidar_AI_Solution, AIMET or
    Autoware sparse-conv ONNX, imported first: docs/formats.md), rewrites every sparse node and writes OUT.
      gpu     index-builder custom ops -> IndexedUnfold -> MatMul (-> IndexedFold); --strategy:
              unfold, rulebook, fused (the three in one IndexedConv) or auto (fused; the rulebook
              for a conv reading a dense input)
      nna     index tables from the custom ops; the compute in standard ops only: one 1x1 Conv per
              kernel tap on [1, C, 1, N] (--layout rows: one MatMul per tap on [N, C] rows;
              --fuse-taps: one product with K*Cout outputs) and a combine
              method: gather (default), scatter, matmul (scatter matrices, O(K*N^2) memory) or
              pairs (each tap multiplies only the rows it pairs, gathered first) or unfold (each
              output's rows of every tap gathered side by side, one product: one rounding per
              output where an accelerator quantizes every tensor, as QNN's HTP int8).
              --max-active N fixes the row capacity so that the compute has static shapes;
              N1,N2,... gives one per level: the input sites, then each SparseConv's outputs.
              With --combine pairs, --max-pairs FILE (JSON written by `sparse-lower inspect
              --frames ... --max-pairs-out FILE`) fixes each conv's pairs per tap too.
      hybrid  the first sparse layer of each branch on the gpu path, the rest on the nna path.
              --tables standard (nna, hybrid): the index tables in standard ops too (the portable
              target's), so that any ONNX runtime runs the host part without the library: an nna OUT
              is then standard ops only; a hybrid one keeps its first layers' custom ops. A frame the
              library would refuse (a bad coordinate, rows over --max-active) gives NaN features.
      portable  standard ONNX ops only, the index tables built inside the graph (a site grid per
              coords tensor); any ONNX runtime runs OUT without the library (OpenVINO, TensorRT,
              onnxruntime's GPU providers). --max-active gives it static shapes (TVM, compilers
              that need them): inputs of exactly that many rows, padding rows with coords -1.
    Run OUT (but one of standard ops only) with sparse_lower.create_session, or any onnxruntime session that registers the library
    (python -c "import sparse_lower; print(sparse_lower.get_library_path())"); split it per device
    with `sparse-lower partition`.

    Then, unless --no-verify, it checks OUT: the NumPy reference runs on IN and onnxruntime on OUT with
    random inputs (--active sites per sparse input; by default 500, halved until the network fits
    --max-active) or the inputs of --inputs, and the largest error per output is printed; the exit
    status is 1 when an output differs by more than --tolerance (relative to the output's largest
    magnitude; by default 1e-4, 1e-2 with --precision bf16).

    With --tune FRAMES (gpu target) each conv's compute form is chosen by timing the fused, rulebook and
    unfold forms on those frames on this machine: a form that ran a conv's kernels 20 % faster is kept
    where the whole model, timed against the model without it, gets faster (sparse_lower.tune); the
    choice is recorded in the model, and `inspect` prints it. With --int8 too, 8 bits is one more form of
    the fused convs: those whose kernels ran 20 % faster at 8 bits, and within --int8-limit, go to 8 bits
    where the whole model gets faster with them; the others stay float, each with the reason.

    With --int8 --calibrate FRAMES (gpu target), the convs whose input rows stay >= 0 on the frames run
    in 8 bits (IndexedConvInt8, calibrated on those frames), and the check measures the 8-bit model
    against the float one on each frame instead: max relative error and SNR, with no pass or fail.
    --int8-limit E keeps float the convs that would take the outputs more than E (relative) from float on
    the calibration frames, chosen by measurement (each conv alone, then the most sensitive kept float
    until within E); --int8-headroom H widens every calibrated range H times, for frames whose rows go
    past the calibration frames'; --int8-weight-bits 8 rounds the weights to ±127 instead of ±63.

    example: sparse-lower convert model.onnx -o model.gpu.onnx --target gpu
    """

    name = "convert"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("input", help="source ONNX model")
        parser.add_argument("-o", "--output", required=True, help="where to write the lowered model")
        parser.add_argument("--target", default="gpu", choices=list(TARGETS),
                            help="where the compute runs: gpu (custom ops), nna (standard ops), hybrid "
                                 "(first layer gpu, the rest nna), portable (standard ops only, no library); "
                                 "default gpu")
        parser.add_argument("--strategy", choices=list(STRATEGIES), help="gpu compute form (default auto)")
        parser.add_argument("--combine", choices=list(COMBINES), help="nna combine method (default gather)")
        parser.add_argument("--max-active", type=capacities, metavar="N[,N...]",
                            help="nna and portable row capacity (static shapes): one, or one per level (a level per "
                                 "SparseConv)")
        parser.add_argument("--max-pairs", metavar="FILE",
                            help="nna --combine pairs with --max-active: JSON {conv name: [pairs per tap]}, as "
                                 "`sparse-lower inspect --frames ... --max-pairs-out FILE` writes it")
        parser.add_argument("--max-members", type=count(1), metavar="N",
                            help="nna/hybrid with --max-active: the most rows one site of a Coalesce merges; "
                                 "`sparse-lower inspect --frames ...` measures it")
        parser.add_argument("--max-batch", type=count(1), metavar="B",
                            help="portable with --max-active: the batches its grids hold (default: the model's "
                                 "ToDense batch_size, else 1)")
        parser.add_argument("--fuse-taps", action="store_true", help="nna: one Conv with K*Cout outputs")
        parser.add_argument("--layout", choices=list(LAYOUTS),
                            help="nna: compute on the [1, C, 1, N] image (default) or on [N, C] rows")
        parser.add_argument("--tables", choices=list(TABLES),
                            help="nna/hybrid: the index tables from the library's custom ops (default), or in "
                                 "standard ops, for runtimes without the library")
        parser.add_argument("--tune", nargs="+", metavar="FRAME",
                            help="gpu: time each conv's compute forms on these frames (.npz or folders) and keep "
                                 "the fastest where the whole model gets faster (instead of --strategy)")
        parser.add_argument("--precision", choices=list(PRECISIONS),
                            help="gpu: the fused convs' products in float32 (default) or bf16 (rows and weights "
                                 "rounded to bfloat16, summed in float32; AMX tiles where the CPU has them)")
        parser.add_argument("--dump-dir", help="write the model after every pass into this folder")
        parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                            help="compare the reference and the lowered model (default: on)")
        parser.add_argument("--inputs", help=".npz of inputs for the verification (default: random)")
        add_active_argument(parser)
        parser.add_argument("--seed", type=count(0), help="seed of the random verification inputs (default 0)")
        parser.add_argument("--tolerance", type=float,
                            help="largest error allowed, relative to the largest output value (default 1e-4)")
        parser.add_argument("--int8", action="store_true",
                            help="gpu: the convs in 8 bits (IndexedConvInt8) where the calibration allows; "
                                 "needs --calibrate")
        parser.add_argument("--int8-limit", type=float, metavar="E",
                            help="--int8: keep float the convs that take the outputs more than E (relative) from "
                                 "float on the calibration frames, e.g. 0.01")
        parser.add_argument("--int8-headroom", type=float, default=1.0, metavar="H",
                            help="--int8: each input range H times its calibrated top (default 1)")
        parser.add_argument("--int8-weight-bits", type=int, choices=[7, 8], default=7,
                            help="--int8: weights within ±63 (7, default) or ±127 (8: more accurate; as fast "
                                 "where the CPU has VNNI, AMX or an ARM dot product, slow on AVX2 without VNNI)")
        parser.add_argument("--calibrate", nargs="+", metavar="FRAME",
                            help="--int8: frames to calibrate on (.npz with features/coords, or folders of them, "
                                 "as `sparse-lower run` reads them)")
        parser.add_argument("--leaky-relu-alpha", type=float,
                            help=f"import: the LeakyReLU slope an NVIDIA file does not record (default {LEAKY_RELU_ALPHA})")

    def run(self, args, out: Verbosity) -> int:
        output_file(args.output, "-o", out)  # checked now, not after the whole lowering
        if args.dump_dir:
            output_folder(args.dump_dir, "--dump-dir", out)
        if Path(args.output).absolute() == Path(args.input).absolute() or \
                (Path(args.output).exists() and Path(args.output).samefile(args.input)):
            raise SparseLowerError(f"-o {args.output} would write over the input model", fix="give another --output")
        if args.int8 != bool(args.calibrate):
            raise SparseLowerError("--int8 and --calibrate go together",
                                   fix="give both: --int8 --calibrate FRAME [FRAME ...]")
        if not args.int8 and (args.int8_limit is not None or args.int8_headroom != 1.0 or args.int8_weight_bits != 7):
            raise SparseLowerError("--int8-limit, --int8-headroom and --int8-weight-bits shape the 8-bit model",
                                   fix="give --int8 --calibrate FRAME [FRAME ...] with them")
        if args.int8 and (args.target != "gpu" or args.strategy not in (None, "auto", "fused")):
            raise SparseLowerError(f"--int8 quantizes the gpu target's fused convs, not --target {args.target} "
                                   f"--strategy {args.strategy}",
                                   fix="use --target gpu with the default strategy; for the nna target's int8 see "
                                       "`sparse-lower partition --for ... --calibrate`")
        if args.tune and (args.target != "gpu" or args.strategy is not None):
            raise SparseLowerError("--tune chooses the gpu target's compute form per conv, in place of --strategy",
                                   fix="use --tune with --target gpu and without --strategy")
        _check_options(args)
        max_pairs = read_max_pairs(args.max_pairs) if args.max_pairs else None
        # the frames are read before any work: a wrong path or a damaged file is said now
        calibration = read_frames(args.calibrate) if args.int8 else []
        tuning = read_frames(args.tune) if args.tune else []
        inputs = read_frames([args.inputs], folders=False) if args.inputs else []
        status = Status(out.quiet)
        source = load(args.input)
        found = detect_format(source)
        if found != SOURCE_FORMAT:
            with status.step(f"importing the {format_title(found)} model"):
                source = import_model(source, leaky_relu_alpha=args.leaky_relu_alpha)
            out.say(f"imported {format_title(found)} format into source ops")
        elif args.leaky_relu_alpha is not None:
            raise SparseLowerError("--leaky-relu-alpha does nothing for a model in source ops (it is the slope an "
                                   "exporter's file does not record)", fix="leave --leaky-relu-alpha out")
        given = feeds_of(source, inputs)  # the model's inputs are known now
        for option, frames, fed in (("--inputs", inputs, given), ("--tune", tuning, feeds_of(source, tuning)),
                                    ("--calibrate", calibration, feeds_of(source, calibration))):
            for (path, _), feeds in zip(frames, fed):
                said = non_finite(feeds)
                if said:
                    raise SparseLowerError(f"{option}: the frame {path}: {said}, which no comparison or timing can "
                                           "use", fix=f"give {option} frames of finite values")
                if option != "--inputs" and no_voxels(source, feeds):
                    raise SparseLowerError(f"{option}: the frame {path} has no voxels, so there is nothing to "
                                           f"{'time' if option == '--tune' else 'calibrate'} on",
                                           fix=f"give {option} frames that have voxels")
        if tuning:
            with status.step(f"timing each conv's compute forms{' and 8 bits' if args.int8 else ''} "
                             f"on {len(tuning)} frame(s)"):
                timing = tune(source, feeds_of(source, tuning),
                              calibration_frames=feeds_of(source, calibration) if args.int8 else None,
                              int8_limit=args.int8_limit, int8_headroom=args.int8_headroom,
                              int8_weight_bits=args.int8_weight_bits)[1]
            out.say(tuning_report(timing))
        with status.step(f"lowering for the {args.target} target"):
            lowered = lower(source, target=args.target, strategy=args.strategy or "auto",
                            layer_strategies=timing.choices if tuning else None,
                            combine=args.combine or "gather", max_active=args.max_active, max_batch=args.max_batch,
                            fuse_taps=args.fuse_taps, layout=args.layout or "image", max_pairs=max_pairs,
                            max_members=args.max_members, tables=args.tables or "library",
                            precision=args.precision or "float32", dump_dir=args.dump_dir)
        if args.int8:
            searched = f", keeping float the convs past {args.int8_limit:g}" if args.int8_limit is not None else ""
            with status.step(f"calibrating on {len(calibration)} frame(s) and quantizing the convs{searched}"):
                frames = feeds_of(lowered, calibration)
                float_model = lowered
                if tuning:  # the convs tune put at 8 bits, within the limit already
                    lowered, found = quantize(lowered, frames, headroom=args.int8_headroom, convs=timing.int8_convs,
                                              weight_bits=args.int8_weight_bits)
                    found.float_convs.update({name: why for name, why in timing.float_convs.items()
                                              if name in found.float_convs})
                else:
                    lowered, found = quantize(lowered, frames, limit=args.int8_limit, headroom=args.int8_headroom,
                                              weight_bits=args.int8_weight_bits)
            out.say(f"int8: {len(found.tops)} of {len(found.tops) + len(found.float_convs)} convs in 8 bits"
                    + "".join(f"\n  left float: {name}: {why}" for name, why in found.float_convs.items()))
        if given and args.verify:
            _fits_the_static_form(source, lowered, given[0])  # refused before the model is written
        onnx.save(lowered, args.output)
        out.say(before_after(source, lowered))
        print(f"wrote {args.output}: {run_hint(repr(args.output), needs_library(lowered))}")
        if args.dump_dir:
            out.say(f"wrote the model after every pass to {Path(args.dump_dir)}/ "
                    f"({', '.join(sorted(p.name for p in Path(args.dump_dir).glob('*.onnx')))})")
        if not args.verify:
            return 0
        if args.int8:
            with status.step("measuring the 8-bit model against the float one on the calibration frames"):
                rows = int8_errors(float_model, lowered, [path for path, _ in calibration], frames)
            out.say(render(["frame", "output", "max rel error", "SNR dB"], rows))
            print("verify: the 8-bit model's error against the float one, on the frames it was calibrated on "
                  "(no pass/fail: its size is the quantization's)")
            return 0
        plain = "" if needs_library(lowered) else " (plain, no library)"
        empty = bool(given) and no_voxels(source, given[0])
        with status.step("verifying (NumPy reference against onnxruntime)"):
            taps: dict = {}
            try:
                differences = self._differences(args, source, lowered, given[0] if given else None, out, taps)
            except _NoSiteFits as refused:
                print(f"verify: FAILED: one random site already overflows a capacity ({refused})")
                return 1
            if empty:  # a frame without voxels compares no value: its shapes, then random inputs that have some
                shapes = [d.output for d in differences if not d.shape_ok]
                taps.clear()
                differences = self._differences(args, source, lowered, None, out, taps)
        out.say(render(["output", "max abs error", "max rel error", "shape"],
                       [[d.output, f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", "ok" if d.shape_ok else "MISMATCH"]
                        for d in differences]))
        tolerance = (BF16_TOLERANCE if args.precision == "bf16" else DEFAULT_TOLERANCE) if args.tolerance is None \
            else args.tolerance
        failed = [d.output for d in differences if not d.shape_ok or not d.max_rel <= tolerance]  # NaN fails
        worst = max((d.max_rel for d in differences), default=0.0)
        compared = (f"the lowered model in onnxruntime{plain} against the NumPy reference of the "
                    f"{'imported' if found != SOURCE_FORMAT else 'source'} model, on "
                    f"{'the --inputs frame' if given and not empty else 'random inputs'}: largest relative error "
                    f"{worst:.1e}, tolerance {tolerance:g}")
        if empty:
            failed += [f"{name} (its shape on the --inputs frame)" for name in shapes]
            print(f"verify: the --inputs frame {args.inputs} has no voxels: on it only the outputs' shapes were "
                  f"compared ({'they differ for ' + ', '.join(shapes) if shapes else 'they match'}); the values "
                  f"are compared on random inputs with {args.active or assumed_active(source)} sites instead")
        coverage, every_tap = tap_coverage(taps)
        if not every_tap:  # a warning: said under -q too
            print(f"verify: {coverage}; give a frame where they have neighbours (--inputs)")
        elif coverage:
            compared += f"; {coverage}"
        for value, nodes in assumed_values(source).items():
            print(f"verify: the import assumed {value} ({len(nodes)} node{'s' if len(nodes) > 1 else ''}, e.g. "
                  f"'{nodes[0]}'): the file does not record it, and this check cannot tell (--leaky-relu-alpha)")
        verdict = f"FAILED for {', '.join(failed)}" if failed else "ok" if every_tap else "ok on the taps it reached"
        print(f"verify: {verdict} ({compared})")
        return 1 if failed else 0

    @staticmethod
    def _differences(args, source, lowered, given: dict | None, out: Verbosity, taps: dict):
        """Compare on the given inputs, or on random ones (`taps` receives the pairs each tap multiplied:
        verify.compare). Random inputs that overflow --max-active
        somewhere in the network (a strided or transposed conv can have more output than input rows)
        are drawn again with half the sites, so that the default check fits any capacity; sizes the user
        chose (--active, --inputs) are kept and the refusal is theirs to see."""
        batch = recorded_options(lowered).get("max_batch") or 2  # the static form holds only its batches
        if given is not None:
            return compare(source, lowered, given, taps)
        first = args.max_active[0] if isinstance(args.max_active, tuple) else args.max_active  # the inputs' level
        active = args.active or assumed_active(source)
        if not args.active and first:
            active = min(active, first)  # the default fits the capacity of the inputs' level
        while True:
            feeds = example_inputs(source, np.random.default_rng(args.seed or 0), active=active, batch=batch)
            try:
                taps.clear()
                differences = compare(source, lowered, feeds, taps)
            except ort_state.InvalidArgument as error:  # the nna target's CapacityPads / PairLists refuse an overflow
                overflow = re.search(r"\((max_active|max_members|max_pairs\[.*\])\)", str(error))
                if overflow and not args.active and active == 1:
                    raise _NoSiteFits(str(runtime_refusal(error))) from error
                if args.active or not overflow:
                    raise
            else:  # standard ops (the portable static form, nna standard tables) answer an overflow with NaN
                # features and the rows cut at the capacity (their random inputs break no other rule)
                overflowed = args.max_active is not None and not needs_library(lowered) and \
                    any(not d.shape_ok or np.isnan(d.max_abs) for d in differences)
                if args.active or active == 1 or not overflowed:
                    return differences
            active //= 2
            out.say(f"verify: the random inputs overflow --max-active {_spelled(args.max_active)}; drawing {active} "
                    f"sites")


class _NoSiteFits(Exception):
    """Even one random site overflows a capacity: what the verification says instead of comparing."""


DEFAULT_TOLERANCE = 1e-4
MAX_VERIFY_ACTIVE = 2_000_000  # random sites per input: 25 times the largest real frame; more runs out of memory
BF16_TOLERANCE = 1e-2  # --precision bf16: 8 bits of mantissa in each product's operands


def _fits_the_static_form(source: onnx.ModelProto, lowered: onnx.ModelProto, feeds: dict) -> None:
    """Refuse an --inputs frame the portable static form cannot hold (more rows than its first capacity, a
    batch index past max_batch), which it would answer with NaN: the verdict would be "FAILED … inf"."""
    if not fixed_rows(lowered):
        return
    capacity, batches = recorded_capacity(lowered), recorded_options(lowered).get("max_batch") or 1
    for name, value in feeds.items():
        if input_roles(source).get(name, ("",))[0] != "coords" or not len(value):
            continue
        if len(value) > capacity:
            raise SparseLowerError(f"--inputs: '{name}' has {len(value):,} rows, more than the static form's "
                                   f"--max-active {capacity:,}", fix=f"lower with --max-active {len(value)} or more")
        if int(value[:, 0].max()) >= batches:
            raise SparseLowerError(f"--inputs: '{name}' has batch index {int(value[:, 0].max())}, and the static form "
                                   f"holds batches 0 to {batches - 1} (--max-batch {batches})",
                                   fix=f"lower with --max-batch {int(value[:, 0].max()) + 1}")


def no_voxels(model: onnx.ModelProto, feeds: dict) -> bool:
    """Whether `feeds` give every sparse input of `model` (features and coordinates) no rows."""
    sparse = [name for name in feeds if input_roles(model).get(name, ("",))[0] in ("features", "coords")]
    return bool(sparse) and all(len(feeds[name]) == 0 for name in sparse)


def assumed_values(imported: onnx.ModelProto) -> dict[str, list[str]]:
    """What an import read for values its file does not record (a LeakyReLU's slope) -> the nodes."""
    report = next((p.value for p in imported.metadata_props if p.key == IMPORT_KEY), None)
    return json.loads(report).get("assumed", {}) if report else {}


def _check_options(args) -> None:
    """Refuse an option that would do nothing with the rest of the command line, or is out of range:
    a user who wrote it expects it to count."""
    unread = unread_option(args.target, {option: getattr(args, option) for option in TARGET_OPTIONS})
    if unread:
        option, targets = unread
        flag = "--" + option.replace("_", "-")
        raise SparseLowerError(f"{flag} does nothing for --target {args.target}",
                               fix=f"leave {flag} out, or use it with --target {' or '.join(sorted(targets))}")
    if args.active is not None and args.active > MAX_VERIFY_ACTIVE:
        raise SparseLowerError(f"--active {args.active:,}: the verification draws that many random sites and runs the "
                               f"NumPy reference on them; it takes at most {MAX_VERIFY_ACTIVE:,}",
                               fix="give fewer sites, or --inputs a frame of your own")
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise SparseLowerError(f"--tolerance {args.tolerance} is not a number >= 0", fix="give e.g. --tolerance 1e-4")
    unused = {"--tolerance": args.tolerance is not None, "--inputs": bool(args.inputs), "--seed": args.seed is not None,
              "--active": args.active is not None}
    if not args.verify:
        given = [flag for flag, set_ in unused.items() if set_]
        if given:
            raise SparseLowerError(f"{given[0]} does nothing with --no-verify", fix=f"leave {given[0]} out")
    elif args.inputs:
        given = [flag for flag in ("--seed", "--active") if unused[flag]]
        if given:
            raise SparseLowerError(f"{given[0]} does nothing with --inputs (the verification runs on them)",
                                   fix=f"leave {given[0]} out")


def tuning_report(found) -> str:
    """The table of what `tune` measured: each conv's kernel ms per form (and at 8 bits where timed), the
    form kept, and the whole model's ms without and with each candidate tried."""
    forms = [*TUNED_FORMS, *([INT8] if any(INT8 in times for times in found.layer_ms.values()) else [])]
    at_8_bits = {name.split("/")[0] for name in found.int8_convs}
    rows = [[conv, *(f"{times[form]:.1f}" if form in times else "-" for form in forms),
             INT8 if conv in at_8_bits else found.choices.get(conv, "fused")]
            for conv, times in found.layer_ms.items()]
    lines = [render(["conv", *(f"{form} ms" for form in forms), "kept"], rows)]
    lines += [f"tried {what}: {without:.1f} -> {with_it:.1f} ms over the frames" for what, (without, with_it)
              in found.tried.items()]
    kept = len(found.choices)
    lines.append(f"tune: {kept} conv{'s' if kept != 1 else ''} in another form than fused" if kept else
                 "tune: fused kept for every conv (no other form made the model faster)")
    if INT8 in forms:
        lines.append(f"tune: {len(found.int8_convs)} conv{'s' if len(found.int8_convs) != 1 else ''} at 8 bits")
    return "\n".join(lines)


def int8_errors(float_model, quantized, paths, frames) -> list[list[str]]:
    """Rows (frame, output, max relative error, SNR) of `quantized` against `float_model`."""
    reference, tested = create_session(float_model), create_session(quantized)
    names = [o.name for o in reference.get_outputs()]
    rows = []
    for path, feeds in zip(paths, frames):
        for name, want, got in zip(names, reference.run(None, feeds), tested.run(None, feeds)):
            rows.append([path.name, name, f"{relative_error(got, want):.3g}", f"{snr_db(got, want):.1f}"])
    return rows
