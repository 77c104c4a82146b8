"""Foreign files after the tools users run on models before deploying, and the table of what each does
(docs/formats.md: Files after other tools).

The tools, each as users run it: onnxsim, onnxslim, `polygraphy surgeon sanitize --fold-constants`,
onnxconverter-common's float16 conversion (with and without keep_io_types), onnx.version_converter to
opsets 13, 17 and 18, `onnx.save` with external data, and `onnx.compose.add_prefix`. The files: the wild
corpus (../shared/data/wild) and the sample models (models/). tests/test_tool_variants.py runs the same
matrix (and aimet-torch's fresh exports) and asserts it.

What a variant must compute is the original's network: sparse_lower.reference on the original file,
imported (after a float16 tool, on the original with its weights rounded to half, which is the network
the tool wrote). A tool that fails on a file itself is recorded in TOOL_FAILURES, not worked around.

    python tools/tool_variants.py [--write docs/tool_variants.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("gpu", "nna", "hybrid")
TOLERANCE = 1e-4  # relative to the largest expected magnitude


def _loaded(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


def _saved(model: onnx.ModelProto, out: Path) -> Path:
    onnx.save(model, str(out))
    return out


def onnxsim_tool(source: Path, out: Path) -> Path:
    from onnxsim import simplify

    simplified, _ = simplify(_loaded(source))
    return _saved(simplified, out)


def onnxslim_tool(source: Path, out: Path) -> Path:
    import onnxslim

    return _saved(onnxslim.slim(_loaded(source)), out)


def polygraphy_tool(source: Path, out: Path) -> Path:
    command = shutil.which("polygraphy", path=str(Path(sys.executable).parent)) or "polygraphy"  # its console script
    # in the output's folder: polygraphy leaves files of external data (<uuid>.data) in its working folder
    done = subprocess.run([command, "surgeon", "sanitize", str(source.resolve()), "--fold-constants", "-o",
                           str(out.resolve())], capture_output=True, text=True, cwd=out.parent)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "polygraphy failed")
    return out


def float16_tool(keep_io_types: bool):
    def convert(source: Path, out: Path) -> Path:
        from onnxconverter_common import float16

        return _saved(float16.convert_float_to_float16(_loaded(source), keep_io_types=keep_io_types), out)
    return convert


def opset_tool(version: int):
    def convert(source: Path, out: Path) -> Path:
        return _saved(onnx.version_converter.convert_version(_loaded(source), version), out)
    return convert


def external_data_tool(source: Path, out: Path) -> Path:
    onnx.save(_loaded(source), str(out), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{out.name}.data", size_threshold=0)
    return out


def prefix_tool(source: Path, out: Path) -> Path:
    return _saved(onnx.compose.add_prefix(_loaded(source), "tool_"), out)


TOOLS = {
    "onnxsim": onnxsim_tool,
    "onnxslim": onnxslim_tool,
    "polygraphy --fold-constants": polygraphy_tool,
    "float16": float16_tool(False),
    "float16 keep_io_types": float16_tool(True),
    "opset 13": opset_tool(13),
    "opset 17": opset_tool(17),
    "opset 18": opset_tool(18),
    "external data": external_data_tool,
    "compose prefix": prefix_tool,
}
HALVES_WEIGHTS = {"float16", "float16 keep_io_types"}

# The files, and what import_model needs to read each.
FILES = {
    "wild/nvidia_exptool/centerpoint.scn.onnx": {},
    "wild/aimet/two_layer_spconv.aimet.onnx": {},
    "models/centerpoint_head.onnx": {},
    "models/sparse_unet.onnx": {},
    "models/nvidia_unet.scn.onnx": {"leaky_relu_alpha": 0.1},
    "models/aimet_three_layer.aimet.onnx": {},
    "models/autoware_encoder.onnx": {},
}

# Where a tool itself fails on a file, and what it says: NVIDIA's files hold non-standard ops in the
# default domain (and Reshapes with a `dims` attribute), which onnxsim, onnxslim and onnx's version
# converter cannot read; they are float16 already, which onnxconverter-common refuses to convert again;
# onnx's converter has no adapter down to opset 13 for what opset-17 files hold.
NVIDIA_FILES = ("wild/nvidia_exptool/centerpoint.scn.onnx", "models/nvidia_unet.scn.onnx")
TOOL_FAILURES = {
    **{(f, "onnxsim"): "has input size 1 not in range [min=2, max=2]" for f in NVIDIA_FILES[:1]},
    **{(f, "onnxslim"): "list index out of range" for f in NVIDIA_FILES[:1]},
    **{(f, tool): "already converted to float16" for f in NVIDIA_FILES for tool in HALVES_WEIGHTS},
    **{(f, tool): "has no registered schema" for f in NVIDIA_FILES for tool in ("opset 13", "opset 17", "opset 18")},
    ("models/autoware_encoder.onnx", "opset 13"): "No Adapter From Version $15 for Shape",
    ("models/centerpoint_head.onnx", "opset 13"): "No Adapter From Version $14 for Relu",
    ("models/sparse_unet.onnx", "opset 13"): "No Adapter From Version $14 for Relu",
    # aimet-torch's export of two bias-less layers of equal width (tests/test_tool_variants.py): torch.onnx
    # passes the shared zero bias through an opset-16 Identity, which the converter cannot take to 13
    ("aimet-torch: equal-zero-biases", "opset 13"): "No Adapter From Version $16 for Identity",
}


def location(name: str) -> Path:
    """A file of FILES: the wild corpus in $SPARSE_LOWER_DATA or beside the checkout, the samples in it."""
    data = Path(os.environ.get("SPARSE_LOWER_DATA") or ROOT.parent / "shared" / "data")
    return data / name if name.startswith("wild/") else ROOT / name


def halved(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float initializer rounded to half and back: the network a float16 tool wrote."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for tensor in model.graph.initializer:
        value = numpy_helper.to_array(tensor)
        if value.dtype in (np.float32, np.float64):
            tensor.CopyFrom(numpy_helper.from_array(value.astype(np.float16).astype(value.dtype), tensor.name))
    return model


def imported(path: Path, options: dict) -> onnx.ModelProto:
    from sparse_lower.importers import import_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notes of each file: tests/test_importers.py's
        return import_model(str(path), **options)


def example_feeds(model: onnx.ModelProto, seed: int = 0) -> dict:
    from sparse_lower.verify import example_inputs

    return example_inputs(model, np.random.default_rng(seed), active=60)


def expected(original: onnx.ModelProto, tool: str, feeds: dict) -> list[np.ndarray]:
    """What a variant made by `tool` must output: the reference of the original's network."""
    from sparse_lower import reference

    model = halved(original) if tool in HALVES_WEIGHTS else original
    outputs = reference.run(model, feeds)
    return [outputs[o.name] for o in model.graph.output]


def lowered_outputs(model: onnx.ModelProto, target: str, original: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The lowered variant's outputs for the original's feeds, input by input in the original's order (a
    prefix renames the inputs; the types are the variant's, which the import declares as the original's)."""
    import sparse_lower
    from sparse_lower.runtime import session_for

    lowered = sparse_lower.lower(model, target=target)
    given = {v.name: np.asarray(feeds[o.name]).astype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
             for v, o in zip(lowered.graph.input, original.graph.input)}
    return session_for(lowered).run(None, given)


def worst_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest difference, relative to each output's largest magnitude (integers: 0 or inf)."""
    worst = 0.0
    for have, value in zip(got, want):
        if have.shape != value.shape:
            return float("inf")
        if value.dtype.kind != "f":
            worst = max(worst, 0.0 if np.array_equal(have, value) else float("inf"))
        else:
            worst = max(worst, float(np.abs(have.astype(np.float64) - value).max(initial=0)
                                     / max(np.abs(value).max(initial=0), 1.0)))
    return worst


def variant(name: str, tool: str, folder: Path) -> Path:
    """The file after the tool (its failure raised as the tool raises it)."""
    out = folder / f"{Path(name).stem}.{tool.replace(' ', '_').replace('-', '')}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TOOLS[tool](location(name), out)


def row(name: str, tool: str, folder: Path) -> list[str]:
    """The table's row of one file after one tool: the largest error per target, or what refused it."""
    try:
        path = variant(name, tool, folder)
    except Exception as error:  # the tool's own failure: recorded
        return [name, tool, f"the tool fails: {str(error).strip().splitlines()[0][:90]}"]
    original = imported(location(name), FILES[name])
    feeds = example_feeds(original)
    want = expected(original, tool, feeds)
    model = imported(path, FILES[name])
    cells = []
    for target in TARGETS:
        try:
            cells.append(f"{worst_error(lowered_outputs(model, target, original, feeds), want):.1e}")
        except Exception as error:
            cells.append(f"refused: {error}")
    return [name, tool, " / ".join(cells)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the table as markdown here")
    args = parser.parse_args()
    import tempfile

    from sparse_lower.report import render

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in FILES:
            if not location(name).is_file():
                print(f"skipped {name}: not found", file=sys.stderr)
                continue
            for tool in TOOLS:
                rows.append(row(name, tool, Path(folder)))
                print(" | ".join(rows[-1]), flush=True)
    headers = ["file", "tool", f"max relative error ({' / '.join(TARGETS)}), or what failed"]
    if args.write:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
        args.write.write_text("\n".join(lines) + "\n")
    print(render(headers, rows))


if __name__ == "__main__":
    main()
